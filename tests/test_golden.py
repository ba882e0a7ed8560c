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
    ref = saved.get(golden.machine())
    if ref is None:
        pytest.skip(f"no golden record for this machine ({golden.machine()}): float sums differ across CPUs; "
                    f"record one with `python tools/golden.py record` before a change")
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
