"""Is FedAvg converged at the cpu profile? The two tests of docs/cpu_profile.md, from the results cache.

    python tools/cpu_convergence.py                 # FedAvg at IID, Dirichlet 0.5 and 0.1, seeds 0-4 (notebook 03's)
    python tools/cpu_convergence.py --seeds 0 --rounds 240

Prints, per partition, the mean test accuracy over the seeds at every evaluation, the gain over the last 10% of
the rounds (test 1: < 1 point) and, for IID, the gap to the centralised reference on the same training pool
(test 2: within 3 points; the reference is measured by `python benchmarks/fmnist_model.py p7d48L3 --subset 12000
--epochs 15 --batch 16`, given with --centralised). Runs missing from the cache are trained (two at a time).
"""

import argparse

import numpy as np

import fedfrozen as ff


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--rounds", type=int, default=ff.profiles.CPU_ROUNDS)
    ap.add_argument("--partitions", nargs="+", default=["iid", "dirichlet:0.5", "dirichlet:0.1"])
    ap.add_argument("--centralised", type=float, default=ff.profiles.CPU_CENTRALISED)
    args = ap.parse_args()
    base = ff.profiles.federated("cpu", rounds=args.rounds)
    lr = ff.profiles.learning_rates(["fedavg"], profile="cpu")["fedavg"]
    for part in args.partitions:
        cfgs = [ff.Config(seed=s, **ff.partition.parse_spec(part), **{**base, "method": "fedavg", "lr": lr})
                for s in args.seeds]
        hists = ff.run_many(cfgs, experiment=base["dataset"])
        frames = [h.to_frame().dropna(subset=["test_acc"]) for h in hists]
        rounds = frames[0]["round"].to_numpy() + 1
        acc = np.mean([f["test_acc"].to_numpy() for f in frames], axis=0)
        print(f"{part} (FedAvg, lr {lr:g}, {len(args.seeds)} seeds): "
              + ", ".join(f"{a:.3f} ({r})" for r, a in zip(rounds, acc)))
        start = args.rounds * 0.9  # the last 10% of the rounds; accuracy there interpolated between evaluations
        before = float(np.interp(start, rounds, acc))
        print(f"  test 1: gain over the last 10% of the rounds (from round {start:g}, interpolated) "
              f"{100 * (acc[-1] - before):+.1f} points ({'< 1 point: met' if acc[-1] - before < 0.01 else 'not met'})")
        if cfgs[0].partition == "iid":
            late = np.mean([h.late_accuracy for h in hists])
            gap = 100 * (args.centralised - late)
            print(f"  test 2: late accuracy {late:.3f}, {gap:.1f} points below centralised ({args.centralised:.3f}): "
                  f"{'met' if gap <= 3 else 'not met'}")


if __name__ == "__main__":
    main()
