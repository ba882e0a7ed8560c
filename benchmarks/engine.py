"""Rounds per second of the sequential and the batched engine, side by side in one process.

    python benchmarks/engine.py [--rounds 3] [--repeats 3] [--clients 20] [--epochs 1 5]
    python benchmarks/engine.py --device cuda      # vit_cifar, 100 clients, fake CIFAR-10, 10 and 100 per round
    python benchmarks/engine.py --profile cpu --compile --grid 4   # the cpu profile's own workload (Fashion-MNIST)

The same config (the cpu profile's digits federation: vit_digits, Dirichlet alpha 0.5, batch 16,
AdamW) runs `--rounds` rounds with `engine="sequential"` and with `engine="batched"`, alternating
repeats so that machine noise hits both alike; the seconds per round are the median over repeats
of the median round (round 0 included in neither: it pays one-off allocations). Also timed: the
batched engine with one client per chunk (its overhead when nothing is batched), and, with
`--compile`, the batched engine with `engine_compile=True` (its compilation timed apart). The last line is
`engine: batched/sequential = X.XXx` (the ratio of seconds per round at the first --epochs).

`--profile cpu` times the speed levers on the workload the notebooks run (ff.profiles.federated("cpu"):
vit_fmnist_w48 on the 12,000-image Fashion-MNIST subset, 100 clients, 10 per round, batch 16, 1 local epoch): the
batched engine at its default chunk and at 5 clients per chunk, torch.compile (first round timed apart), a
larger local batch (32 and 64: fewer steps; its learning rate would have to be selected again), and with
--grid N the ways of sharing the two cores over N runs (2 workers x 1 thread, 1 worker x 2 threads).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

import torch

import fedfrozen as ff


def seconds_per_round(cfg, train=None, test=None) -> float:
    hist = ff.run(cfg, progress=False, train=train, test=test)
    secs = [r["seconds"] for r in hist.rows[1:]] or [hist.rows[0]["seconds"]]
    return statistics.median(secs)


def bench(base: ff.Config, variants: dict, repeats: int, data=(None, None)) -> dict:
    times = {k: [] for k in variants}
    for _ in range(repeats):
        for name, changes in variants.items():
            times[name].append(seconds_per_round(base.replace(**changes), *data))
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--epochs", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--grid", type=int, default=0, metavar="N",
                    help="also time a notebook-like grid: run_many of N seeds, 2 workers x 1 thread vs 1 worker x 2 "
                         "threads")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core)")
    ap.add_argument("--compile", action="store_true", help="also time the batched engine with engine_compile=True")
    ap.add_argument("--profile", choices=["cpu"], default=None,
                    help="time the cpu profile's workload (Fashion-MNIST, vit_fmnist_w48) instead of digits")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}")

    first = None
    if args.profile == "cpu":
        first = _cpu_profile(args)
    elif args.device == "cuda":
        tmp = tempfile.mkdtemp()
        ff.data.write_fake_cifar("cifar10", tmp, per_class=500, test_per_class=100)
        train, test = ff.data.load("cifar10", tmp, download=False)
        for per_round in (10, 100):
            base = ff.Config(dataset="cifar10", model="vit_cifar", n_clients=100, clients_per_round=per_round,
                             rounds=args.rounds + 1, eval_every=10**6, device="cuda", method="fedavg",
                             **{k: v for k, v in ff.profiles.PAPER_RECIPE.items() if k not in ("lr_warmup_rounds",)})
            t = bench(base, {"sequential": dict(engine="sequential"), "batched": dict(engine="batched")},
                      args.repeats, (train, test))
            ratio = t["sequential"] / t["batched"]
            print(f"vit_cifar, 100 clients, {per_round} per round: sequential {t['sequential']:.3f} s/round, "
                  f"batched {t['batched']:.3f} s/round, ratio {ratio:.2f}x")
            first = first or ratio
    else:
        for epochs in args.epochs:
            base = ff.Config(dataset="digits", n_clients=args.clients, rounds=args.rounds + 1, local_epochs=epochs,
                             eval_every=10**6, device="cpu", method="fedavg", lr=3e-3)
            variants = {"sequential": dict(engine="sequential"), "batched": dict(engine="batched"),
                        "batched, 1 client per chunk": dict(engine="batched", engine_chunk=1)}
            if args.compile:
                t0 = time.perf_counter()
                ff.run(base.replace(engine="batched", engine_compile=True, rounds=1), progress=False)
                print(f"batched + torch.compile: first round (compiles, or loads torch's cache) "
                      f"{time.perf_counter() - t0:.1f} s")
                variants["batched + compile"] = dict(engine="batched", engine_compile=True)
            t = bench(base, variants, args.repeats)
            for name, sec in t.items():
                print(f"vit_digits, {args.clients} clients, {epochs} local epoch(s), {name}: {sec:.3f} s/round "
                      f"({1 / sec:.2f} rounds/s)")
            ratio = t["sequential"] / t["batched"]
            print(f"  batched/sequential = {ratio:.2f}x, batched 1-per-chunk/sequential = "
                  f"{t['sequential'] / t['batched, 1 client per chunk']:.2f}x" + (
                      f", batched+compile/sequential = {t['sequential'] / t['batched + compile']:.2f}x"
                      if args.compile else ""))
            first = first or ratio
    if args.grid:
        _grid(args)
    print(f"engine: batched/sequential = {first:.2f}x")


def _cpu_base(rounds: int) -> ff.Config:
    base = ff.profiles.federated("cpu", rounds=rounds, warmup_rounds=max(1, rounds // 4))
    lr = ff.profiles.learning_rates(["fedavg"], profile="cpu", dataset=base["dataset"])["fedavg"]
    return ff.Config(method="fedavg", partition="dirichlet", alpha=0.1, seed=0,
                     **{**base, "lr": lr, "eval_every": 10**6})


def _cpu_profile(args) -> float:
    base = _cpu_base(args.rounds + 1)
    data = ff.data.load(base.dataset)
    variants = {"sequential": dict(engine="sequential"), "batched": dict(engine="batched"),
                "batched, 5 clients per chunk": dict(engine="batched", engine_chunk=5),
                "sequential, batch 32": dict(batch_size=32), "sequential, batch 64": dict(batch_size=64)}
    if args.compile:
        t0 = time.perf_counter()
        ff.run(base.replace(engine="batched", engine_compile=True, rounds=1), progress=False, train=data[0],
               test=data[1])
        print(f"batched + torch.compile: first round (compiles, or loads torch's cache) "
              f"{time.perf_counter() - t0:.1f} s")
        variants["batched + compile"] = dict(engine="batched", engine_compile=True)
    t = bench(base, variants, args.repeats, data)
    for name, sec in t.items():
        print(f"cpu profile ({base.model}, 10 of 100 clients, batch 16 unless said), {name}: {sec:.3f} s/round "
              f"({t['sequential'] / sec:.2f}x sequential)")
    return t["sequential"] / t["batched"]


def _grid(args) -> None:
    """Wall time of run_many over --grid seeds (fresh cache), per engine and way of sharing the 2 cores."""
    if args.profile == "cpu":
        base = _cpu_base(args.rounds * 5).replace(eval_every=10)
    else:
        base = ff.Config(dataset="digits", n_clients=args.clients, rounds=args.rounds * 5,
                         local_epochs=args.epochs[0], eval_every=5, device="cpu", method="fedavg", lr=3e-3)
    cfgs = [base.replace(seed=s) for s in range(args.grid)]
    out = {}
    for name, engine, workers in (("sequential, 2 workers x 1 thread", "sequential", 2),
                                  ("batched, 2 workers x 1 thread", "batched", 2),
                                  ("batched, 1 worker x 2 threads", "batched", 1)):
        threads = torch.get_num_threads()
        if workers == 1:
            torch.set_num_threads(2)  # the in-process variant uses both cores
        with tempfile.TemporaryDirectory() as root:
            t0 = time.perf_counter()
            ff.experiments.run_many([c.replace(engine=engine) for c in cfgs], root=root, workers=workers,
                                    progress=False)
            out[name] = time.perf_counter() - t0
        torch.set_num_threads(threads)
        print(f"grid of {args.grid} runs x {base.rounds} rounds, {name}: {out[name]:.1f} s")
    ref = out["sequential, 2 workers x 1 thread"]
    print("  " + ", ".join(f"{k}: {ref / v:.2f}x" for k, v in out.items() if not k.startswith("sequential")))


if __name__ == "__main__":
    main()
