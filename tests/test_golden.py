"""The golden Histories (tools/golden.py): every registered method and the round's other paths give, on the
machine a record was made on, bit-identically the Histories recorded there."""

import importlib.util
import json
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("golden", Path(__file__).resolve().parents[1] / "tools" / "golden.py")
golden = importlib.util.module_from_spec(spec)
spec.loader.exec_module(golden)


def test_every_registered_method_has_a_golden_case():
    from fedfrozen.methods import registry

    assert set(registry.names()) <= set(golden.cases())


def test_golden_histories_are_bit_identical():
    saved = json.loads(golden.FILE.read_text())
    ref, why = golden.record_for(saved, golden.machine())
    if ref is None:
        pytest.skip(why)
    got = golden.compute(set(ref) & set(golden.cases()))
    assert set(ref) <= set(golden.cases()), "cases were removed: record again"
    # a case added after this machine's record was made is checked where it is recorded (another machine's record
    # cannot be made here: float sums differ across CPUs)
    assert [k for k in sorted(got) if got[k] != ref[k]] == []


def test_the_resumed_case_is_the_uninterrupted_run():
    """The golden case that stops after round 2 and resumes from its checkpoint fingerprints as the run that never
    stopped (on any machine: both are computed here)."""
    import torch

    fields = dict(golden.cases()["fedfrozen/resumed"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        resumed = golden.fingerprint(golden.history(fields))
        fields.pop("resume_at")
        assert resumed == golden.fingerprint(golden.history(fields))
    finally:
        torch.set_num_threads(threads)


# The key: a signature that identifies the arithmetic, not a family of processors (issue: the README's tests failed on
# a fresh install on an AMD EPYC without AVX-512, whose CPU name matched the record of one with it).

def _lower_capability() -> str | None:
    """A capability below this machine's that torch accepts in ATEN_CPU_CAPABILITY, or None where it runs DEFAULT."""
    import fedfrozen as ff

    return {"AVX512": "avx2", "AVX2": "default", "ZVECTOR": "default", "SVE256": "default"}.get(ff.io.cpu_capability())


def _signature_with(env: dict) -> str:
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import fedfrozen as ff; print(ff.io.machine(threads=1))"],
                         env={**os.environ, **env}, capture_output=True, text=True, check=True, timeout=120)
    return out.stdout.strip()


def test_the_signature_names_the_capability_torch_dispatches_to_and_the_flags_that_matter():
    import torch

    import fedfrozen as ff

    sig = ff.io.machine(threads=1)
    assert f"cpu capability {torch.backends.cpu.get_cpu_capability()}" in sig and ff.io.cpu_model() in sig
    assert all(f in sig for f in ff.io.cpu_flags()) and f"blas {ff.io.blas()}" in sig
    assert not ff.io.legacy_signature(sig) and ff.io.legacy_signature("torch 2.14.1+cu130 | AMD EPYC | x86_64")
    env = ff.io.environment(device="cpu")
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and env["cpu_flags"] == ff.io.cpu_flags()
    assert env["machine"] == ff.io.machine(device="cpu")


def test_the_same_cpu_name_at_another_capability_is_another_signature():
    """One CPU, torch dispatched to narrower kernels (ATEN_CPU_CAPABILITY): the same name, other sums (measured on an
    AVX-512 EPYC: fedavg, fedfrozen, scaffold all fingerprint differently at avx2), so another signature."""
    import fedfrozen as ff

    lower = _lower_capability()
    if lower is None:
        pytest.skip(f"torch runs {ff.io.cpu_capability()} here: no lower capability to dispatch to")
    here, there = _signature_with({}), _signature_with({"ATEN_CPU_CAPABILITY": lower})
    assert here == ff.io.machine(threads=1) and there != here
    assert golden.cpu_name(there + " | 1 thread") == golden.cpu_name(here) == ff.io.cpu_model()
    assert f"cpu capability {lower.upper()}" in there


def test_a_record_is_found_only_by_the_whole_signature():
    key = "torch 2.14.1+cu130, blas mkl | AMD EPYC | cpu capability AVX2 (fma avx2) | x86_64"
    wider = "torch 2.14.1+cu130, blas mkl | AMD EPYC | cpu capability AVX512 (fma avx2 avx512f) | x86_64"
    legacy = "torch 2.14.1+cu130 | AMD EPYC | x86_64"
    other_cpu = "torch 2.14.1+cu130, blas mkl | Intel(R) Xeon(R) | cpu capability AVX2 (fma avx2) | x86_64"
    assert golden.record_for({key: {"fedavg": "a"}, wider: {"fedavg": "b"}}, key) == ({"fedavg": "a"}, "")
    ref, why = golden.record_for({wider: {"fedavg": "b"}, legacy: {"fedavg": "c"}, other_cpu: {}}, key)
    assert ref is None
    assert key in why and wider in why and legacy in why and "adopt" in why and other_cpu not in why
    assert golden.record_for({}, key)[0] is None


def test_the_golden_test_skips_naming_the_signature_where_only_the_cpu_name_matches(tmp_path):
    """The README's test on a CPU of a recorded name but another capability: the golden test skips (it does not
    fail), and says which signature it looked for."""
    import os
    import subprocess
    import sys

    lower = _lower_capability()
    if lower is None:
        pytest.skip("torch runs DEFAULT here: no lower capability to dispatch to")
    there = _signature_with({"ATEN_CPU_CAPABILITY": lower}).rsplit(" | ", 1)[0]
    if there in json.loads(golden.FILE.read_text()):
        pytest.skip(f"a record exists for {there}: it would be compared, not skipped")
    test = f"{Path(__file__).resolve()}::test_golden_histories_are_bit_identical"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": lower, "COLUMNS": "1000"}  # the skip reason printed whole
    out = subprocess.run([sys.executable, "-m", "pytest", test, "-q", "-rs", "-p", "no:cacheprovider"], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "1 skipped" in out.stdout, out.stdout[-2000:]
    assert f"cpu capability {lower.upper()}" in out.stdout
