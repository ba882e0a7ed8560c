"""The same federated job end to end through Flower and through fedfrozen.run, side by side in one process.

    python benchmarks/flower_vs_loop.py [--clients 20] [--rounds 20]

fedavg on digits (vit_digits, 1 local epoch, Dirichlet alpha 0.5), full participation. Times, each with
its process start: `fedfrozen run` (a subprocess, as a user would start it); `flwr run` on a local
simulation federation with a cold SuperLink (started by the run, stopped after it); and a second `flwr run`
against the SuperLink the first left running. Prints the three times, the ratios to the loop, the largest
per-round test-accuracy difference between the Flower run and the loop, and where the warm Flower run's time goes:
its rounds as the server timed them (fedfrozen.engine.round.play: the instructions out, the nodes' training, the replies
in; the loop's rounds beside them) and the rest (Flower's start-up and teardown, the apps' imports and data).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fedfrozen as ff
from fedfrozen.flower import config_from_run, launch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    # a SIGTERM (a CI job cancelled, `kill`) unwinds like Ctrl-C, so the `finally` below stops the SuperLink this
    # benchmark keeps running between its two `flwr run`s (left behind, it broke later Flower tests)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rc = {"method": "fedavg", "rounds": args.rounds, "num-clients": args.clients, "eval-every": 5}
    cfg = config_from_run(rc)

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "fedfrozen", "run", "--method", "fedavg", "--rounds", str(args.rounds),
                        "--n-clients", str(args.clients), "--eval-every", "5", "--out", tmp, "--quiet"],
                       check=True, capture_output=True)
        loop_s = time.perf_counter() - t0
    ref = ff.run(cfg, progress=False)

    home = Path(tempfile.mkdtemp(prefix="fedfrozen-flwr-bench-"))
    try:
        t0 = time.perf_counter()
        cold, _ = launch.flwr_run(rc, num_supernodes=args.clients, home=home, keep=True)
        cold_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        warm, _ = launch.flwr_run(rc, num_supernodes=args.clients, home=home, keep=True)
        warm_s = time.perf_counter() - t0
    finally:
        launch.stop(home)
    diff = max(abs(a["test_acc"] - b["test_acc"]) for a, b in zip(cold.rows, ref.rows) if a["test_acc"] is not None)
    print(f"{args.clients} clients, {args.rounds} rounds of fedavg on digits")
    print(f"fedfrozen run (subprocess):            {loop_s:7.1f} s")
    print(f"flwr run, cold SuperLink:              {cold_s:7.1f} s  ({cold_s / loop_s:.1f}x the loop)")
    print(f"flwr run, SuperLink already running:   {warm_s:7.1f} s  ({warm_s / loop_s:.1f}x the loop)")
    print(f"largest per-round test-accuracy difference, Flower vs loop: {diff:.2e}")
    rounds_loop, rounds_warm = (sum(r["seconds"] for r in h.rows) for h in (ref, warm))
    clients = sum(r.get("client_seconds") or 0.0 for r in warm.rows)
    print(f"warm flwr run: its rounds {rounds_warm:.1f} s (the loop's rounds: {rounds_loop:.1f} s), outside its rounds "
          f"{warm_s - rounds_warm:.1f} s (start-up, imports, data, teardown); inside the rounds the ClientApps' own "
          f"work (fedfrozen's: records read, method built, local training, update written; summed over clients, who "
          f"run side by side) took {clients:.1f} s")
    print(f"flower/loop = {cold_s / loop_s:.2f}x")


if __name__ == "__main__":
    main()
