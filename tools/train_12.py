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
    sel = {m: beyond.selection_configs(args.profile, base, m) for m in ("linear", "swin", "cait")}
    hists = ff.run_many([c for cs in sel.values() for c in cs], experiment=base["dataset"])
    rates, i, feature_map = {}, 0, None
    for m, cs in sel.items():
        hs = hists[i:i + len(cs)]
        i += len(cs)
        if m == "linear" and not beyond.trains_stably(cs, hs):
            feature_map = "elu"
            cs = beyond.selection_configs(args.profile, base, m, feature_map="elu")
            hs = ff.run_many(cs, experiment=base["dataset"])
        rates[m] = beyond.selected_rates(cs, hs)
        print(m, rates[m], {c.lr: round(h.late("val_acc") or 0, 3) for c, h in zip(cs, hs)}, flush=True)
    print(f"selection: {time.perf_counter() - t:.0f} s; linear feature map: {feature_map or 'identity'}", flush=True)
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
