"""The Ray backend's overhead: the same grid through the local pool and through a local Ray cluster of the same size.

    python benchmarks/cluster.py [--runs 8] [--rounds 120] [--workers 2] [--repeats 1]

The grid is the cpu profile's own (ff.profiles.federated("cpu"): vit_fmnist_w48 on the 12,000-image
Fashion-MNIST subset, 100 clients, 10 per round; FedAvg at Dirichlet 0.1, seeds 0..runs-1, lr 3e-3). Each repeat
trains it into a fresh temporary results root twice, once per backend, alternating which goes first so that
machine noise hits both alike: `run_many(workers=W)` (a process pool of W one-thread workers) and
`run_many(backend="ray")` on a Ray instance of W CPUs started by this script on this machine (its start-up is timed
apart: a cluster is started once, not per grid). Both give bit-identical Histories (checked). The last line is
`cluster: ray/local = X.XXx` (wall seconds of the grid, median over repeats).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time

import fedfrozen as ff


def grid(runs: int, rounds: int) -> list:
    base = ff.profiles.federated("cpu", rounds=rounds, warmup_rounds=rounds // 4)
    return [ff.Config(method="fedavg", partition="dirichlet", alpha=0.1, seed=s, **{**base, "lr": 3e-3})
            for s in range(runs)]


def timed(cfgs, backend: str, workers: int):
    root = tempfile.mkdtemp(prefix="ffbench")
    try:
        t0 = time.perf_counter()
        hists = ff.run_many(cfgs, root=root, workers=workers, backend=backend, progress=False)
        return time.perf_counter() - t0, hists
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=120)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    import ray

    cfgs = grid(args.runs, args.rounds)
    t0 = time.perf_counter()
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _node_ip_address="127.0.0.1")
    print(f"ray start-up: {time.perf_counter() - t0:.1f} s ({args.workers} CPUs)")
    seconds = {"local": [], "ray": []}
    try:
        for rep in range(args.repeats):
            order = ("local", "ray") if rep % 2 == 0 else ("ray", "local")
            got = {}
            for backend in order:
                secs, got[backend] = timed(cfgs, backend, args.workers)
                seconds[backend].append(secs)
                print(f"repeat {rep}: {backend:5s} {secs:7.1f} s for {len(cfgs)} runs of {args.rounds} rounds",
                      flush=True)
            assert all(a.same_as(b) for a, b in zip(got["local"], got["ray"])), "the backends' Histories differ"
    finally:
        ray.shutdown()
    local, on_ray = statistics.median(seconds["local"]), statistics.median(seconds["ray"])
    print(f"Histories bit-identical; local {local:.1f} s, ray {on_ray:.1f} s")
    print(f"cluster: ray/local = {on_ray / local:.2f}x")


if __name__ == "__main__":
    main()
