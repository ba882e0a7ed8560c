"""Train notebook 12's runs into the results cache ahead of executing it (the same Configs the notebook asks for,
so its execution then loads them): the rule's selection runs first, then the cells in order of importance.

    python tools/train_12.py                 # the cpu profile's runs
    python tools/train_12.py --more          # and the optional ones (the 100/1,000-client cells at 15 seeds)
"""

import argparse
import time

import fedfrozen as ff
from fedfrozen import beyond


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--more", action="store_true", help="also the optional cells (15 seeds at 100/1,000 clients)")
    args = ap.parse_args()
    ff.io.use_threads()
    base = ff.profiles.federated(args.profile)
    t = time.perf_counter()
    rates, feature_map, table = beyond.rates_by_rule(args.profile, base, ["linear", "swin", "cait"])
    print(table.pivot_table(index=["model", "method"], columns="lr", values="late_val_acc").round(3), flush=True)
    print(f"selected {rates}: {time.perf_counter() - t:.0f} s; linear feature map: {feature_map or 'identity'}",
          flush=True)
    stages = [dict(cells=("linear", "swin", "cait", "vit"), seeds_c1=range(5)),
              dict(cells=("clients",)),
              dict(cells=("linear",), seeds_c1=range(15))]
    if args.more:
        stages.append(dict(cells=("clients",), seeds_large=range(15)))
    for stage in stages:
        arms = beyond.build(args.profile, base, rates, feature_map=feature_map, **stage)
        ff.run_many([a.cfg for a in arms], experiment=base["dataset"])
        print(f"{stage}: {len(arms)} runs, {time.perf_counter() - t:.0f} s", flush=True)


if __name__ == "__main__":
    main()
