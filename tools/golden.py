"""Golden Histories: a fingerprint of every registered method's History on the tiny model, to show that a
refactoring changes no result (issue: one round shared by the loop and Flower).

    python tools/golden.py record      # write tests/golden/histories.json for this machine
    python tools/golden.py check       # compare; prints every case that differs (exit 1 if any)

A fingerprint is the SHA-256 of the History's rows without wall-clock columns (floats exactly as stored) and
its divergence flag. Float sums depend on the CPU's vector units and on torch's build, so fingerprints are
kept per machine signature (torch version, CPU model, thread count 1); tests/test_golden.py compares on a
machine that has a record and says so where it has none. Record before a change, check after it.
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
    from fedfrozen.profiles import SGD_AS_PUBLISHED

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
    }
    return out


def fingerprint(hist) -> str:
    text = json.dumps({"rows": hist.without_wall_clock(), "diverged": hist.diverged}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def machine() -> str:
    """The record's key: `ff.io.machine` without the thread count (the cases always run on one thread)."""
    from fedfrozen.io import machine as signature

    return signature(threads=1).rsplit(" | ", 1)[0]


def compute(names=None) -> dict:
    import torch

    import fedfrozen as ff

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {name: fingerprint(ff.run(ff.Config(**fields), progress=False)) for name, fields in cases().items()
                if names is None or name in names}
    finally:
        torch.set_num_threads(threads)


def main(argv) -> int:
    if len(argv) != 1 or argv[0] not in ("record", "check"):
        print(__doc__.strip().splitlines()[2:4], file=sys.stderr)
        return 2
    got = compute()
    saved = json.loads(FILE.read_text()) if FILE.exists() else {}
    if argv[0] == "record":
        saved[machine()] = got
        FILE.parent.mkdir(parents=True, exist_ok=True)
        FILE.write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(got)} fingerprints for {machine()} in {FILE}")
        return 0
    ref = saved.get(machine())
    if ref is None:
        print(f"no record for this machine ({machine()}); records: {list(saved)}")
        return 1
    differ = sorted(k for k in got if ref.get(k) != got[k])
    for k in differ:
        print(f"differs: {k}")
    print(f"{len(got) - len(differ)} of {len(got)} Histories bit-identical to the record")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
