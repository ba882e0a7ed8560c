"""Golden Histories: a fingerprint of every registered method's History on the tiny model, to show that a
refactoring changes no result (issue: one round shared by the loop and Flower).

    python tools/golden.py record      # write tests/golden/histories.json for this machine
    python tools/golden.py check       # compare; prints every case that differs (exit 1 if any)
    python tools/golden.py record NAME...   # record (or re-record) only these cases
    python tools/golden.py adopt       # re-key a record made before the signature named the capability

A fingerprint is the SHA-256 of the History's rows without wall-clock columns (floats exactly as stored) and
its divergence flag. Float sums depend on the CPU's vector units and on torch's build, so fingerprints are
kept per machine signature (`ff.io.machine` at one thread: torch's version and BLAS, the CPU's name, torch's CPU
capability and the instruction-set flags that matter, the architecture); tests/test_golden.py compares only
against the record whose whole signature is this machine's, and skips, naming the signature, where there is none.
Record before a change, check after it.

Records written before the signature named the capability (keys "torch ... | CPU name | arch") cannot say which
arithmetic made them: they are kept as they are, compared against nothing, and `adopt` re-keys one under this
machine's signature only if every one of its cases comes out bit for bit here (then this machine's arithmetic is
the one that made it).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

FILE = Path(__file__).resolve().parents[1] / "tests" / "golden" / "histories.json"
TINY = dict(dataset="digits", model="vit_digits", model_kwargs=dict(embed_dim=16, depth=2, num_heads=2),
            n_clients=4, clients_per_round=2, rounds=3, local_steps=2, batch_size=16, partition="dirichlet",
            alpha=0.5, warmup_rounds=1, eval_every=1, seed=0, device="cpu", engine="sequential")


def cases() -> dict:
    """name -> Config fields: every registered method (2 of 4 clients per round), and the variants that take
    other paths through the round (full and skewed participation, the batched engine, the progressive
    schedule, SGD as published)."""
    from fedfrozen.methods import registry
    from fedfrozen.studies.profiles import SGD_AS_PUBLISHED

    out = {m: dict(TINY, method=m) for m in registry.names()}
    out |= {
        "fedavg/full": dict(TINY, method="fedavg", clients_per_round=None),
        "fedavg/skewed": dict(TINY, method="fedavg", clients_per_round=None, participation="skewed",
                              participation_rate=0.5),
        "afedlf/skewed": dict(TINY, method="afedlf", clients_per_round=None, participation="skewed",
                              participation_rate=0.5),
        "mifa/skewed": dict(TINY, method="mifa", clients_per_round=None, participation="skewed",
                            participation_rate=0.5),
        "fedavg/batched": dict(TINY, method="fedavg", engine="batched"),
        "fedfrozen/batched": dict(TINY, method="fedfrozen", engine="batched"),
        "fedfrozen/value_l2": dict(TINY, method="fedfrozen", value_l2=0.1),
        "progressive": dict(TINY, method="fedfrozen_plateau", freeze_schedule="progressive", freeze_tau=float("inf"),
                            freeze_patience=1),
        "scaffold:sgd": dict(TINY, method="scaffold", **SGD_AS_PUBLISHED),
        "fedavg/warm": dict(TINY, method="fedavg", init="public", public_fraction=0.1, server_pretrain_epochs=1),
        # the other paths through the local update and the loop (issue: client and server speak in messages)
        "fedfrozen/cosine": dict(TINY, method="fedfrozen", lr_schedule="cosine"),
        "fedfrozen/lr_warmup": dict(TINY, method="fedfrozen", rounds=4, warmup_rounds=2, lr_warmup_rounds=1,
                                    lr_schedule="cosine"),
        "fedfrozen/grad_clip": dict(TINY, method="fedfrozen", grad_clip=0.5),
        "fedfrozen/two_epochs": dict(TINY, method="fedfrozen", local_steps=None, local_epochs=2),
        "fedavg/sgd_momentum": dict(TINY, method="fedavg", optimizer="sgd", momentum=0.9, lr=0.05),
        "fedfrozen/pretrained": dict(TINY, method="fedfrozen", init="pretrained", train_subset=1000,
                                     pretrain_epochs=1),
        "fedfrozen/resumed": dict(TINY, method="fedfrozen", rounds=4, warmup_rounds=2, resume_at=2),
        # client state kept across rounds and carried through a checkpoint (issue: a method in two halves)
        **{f"{m}/resumed": dict(TINY, method=m, rounds=4, warmup_rounds=2, resume_at=2)
           for m in ("scaffold", "feddyn", "fedadamw", "afedlf", "head_pruning", "fedtlu", "mifa")},
        "scaffold/batched": dict(TINY, method="scaffold", engine="batched"),
        "feddyn/batched": dict(TINY, method="feddyn", engine="batched"),
        "head_pruning/batched": dict(TINY, method="head_pruning", engine="batched"),
    }
    return out


def fingerprint(hist) -> str:
    text = json.dumps({"rows": hist.without_wall_clock(), "diverged": hist.diverged}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def machine() -> str:
    """The record's key: `ff.io.machine` without the thread count (the cases always run on one thread)."""
    from fedfrozen.base.io import machine as signature

    return signature(threads=1).rsplit(" | ", 1)[0]


def cpu_name(key: str) -> str:
    """The CPU name in a record's key, of either form ("torch V[, blas B] | CPU name | ...")."""
    return key.split(" | ")[1]


def record_for(saved: dict, key: str) -> tuple[dict | None, str]:
    """This machine's record in `saved` (the whole signature `key` must match) and, where there is none, why: the
    signature looked for and the records of the same CPU name that do not match it (another capability, flags or
    build, or a legacy key that names the CPU only)."""
    from fedfrozen.base.io import legacy_signature

    if key in saved:
        return saved[key], ""
    same_name = [k for k in saved if cpu_name(k) == cpu_name(key)]
    why = f"no golden record for this machine's signature ({key})"
    if same_name:
        legacy = [k for k in same_name if legacy_signature(k)]
        other = [k for k in same_name if not legacy_signature(k)]
        if other:
            why += f"; the records of the same CPU name are of other arithmetic: {other}"
        if legacy:
            why += (f"; {legacy} names the CPU only (made before the signature named the capability): "
                    f"`python tools/golden.py adopt` re-keys it if this machine reproduces it bit for bit")
    return None, f"{why}; float sums differ across CPUs: `python tools/golden.py record` makes one, before a change"


def history(fields: dict):
    """The History of one case; `resume_at` k: stopped after round k with a checkpoint, then resumed from it."""
    import tempfile

    import fedfrozen as ff

    fields = dict(fields)
    stop = fields.pop("resume_at", None)
    cfg = ff.Config(**fields)
    if stop is None:
        return ff.run(cfg, progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "checkpoint.pt"
        ff.run(cfg, progress=False, checkpoint=ckpt, callbacks=[lambda r, row, hist: r + 1 >= stop])
        return ff.run(cfg, progress=False, resume_from=ckpt, checkpoint=ckpt)


def compute(names=None) -> dict:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {name: fingerprint(history(fields)) for name, fields in cases().items()
                if names is None or name in names}
    finally:
        torch.set_num_threads(threads)


def main(argv) -> int:
    if not argv or argv[0] not in ("record", "check", "adopt") or (argv[0] != "record" and len(argv) > 1):
        print("\n".join(__doc__.strip().splitlines()[2:6]), file=sys.stderr)
        return 2
    if argv[0] == "adopt":
        return adopt()
    names = argv[1:] or None
    unknown = sorted(set(names or ()) - set(cases()))
    if unknown:
        print(f"no golden case named {unknown}; cases: {sorted(cases())}", file=sys.stderr)
        return 2
    got = compute(names)
    saved = json.loads(FILE.read_text()) if FILE.exists() else {}
    if argv[0] == "record":  # the named cases into this machine's record, or the whole record anew
        saved[machine()] = {**saved.get(machine(), {}), **got} if names else got
        FILE.parent.mkdir(parents=True, exist_ok=True)
        FILE.write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(got)} fingerprints for {machine()} in {FILE}")
        return 0
    ref, why = record_for(saved, machine())
    if ref is None:
        print(f"{why}; records: {list(saved)}")
        return 1
    missing = sorted(k for k in got if k not in ref)
    differ = sorted(k for k in got if k in ref and ref[k] != got[k])
    for k in missing:
        print(f"not recorded on this machine: {k}")
    for k in differ:
        print(f"differs: {k}")
    print(f"{len(got) - len(differ) - len(missing)} of {len(got)} Histories bit-identical to the record")
    return 1 if differ or missing else 0


def adopt() -> int:
    """Re-key the legacy record of this CPU's name under this machine's whole signature, if every case it holds
    comes out here bit for bit (exit 1, nothing written, where one differs or there is none)."""
    from fedfrozen.base.io import legacy_signature

    saved = json.loads(FILE.read_text())
    key = machine()
    legacy = [k for k in saved if legacy_signature(k) and cpu_name(k) == cpu_name(key)]
    if not legacy:
        print(f"no legacy record of this CPU's name ({cpu_name(key)}); records: {list(saved)}")
        return 1
    for old in legacy:
        ref = saved[old]
        got = compute(set(ref) & set(cases()))
        differ = sorted(k for k in got if got[k] != ref[k])
        if differ or set(got) != set(ref):
            print(f"{old}: {len(differ)} of {len(ref)} cases differ here ({differ[:5]}...): another machine's "
                  f"arithmetic made it; left as it is")
            continue
        saved[key] = {**saved.pop(old), **saved.get(key, {})}
        FILE.write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n")
        print(f"{old}: all {len(ref)} cases bit-identical here; re-keyed as {key}")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
