"""Select the cpu profile's learning rates by the one rule (fedfrozen.studies.selection.RULE) and print the table.

    python tools/select_cpu_lr.py                  # the methods of the paper notebooks
    python tools/select_cpu_lr.py fedavg fedfrozen
    python tools/select_cpu_lr.py fedadamw fedlada fedact fedslm mifa fedvarp fedsteer afedlf fedtlu head_pruning
                                                   # the related systems of notebooks 09-10
    python tools/select_cpu_lr.py --regime pretrained fedavg fedfrozen
                                                   # a regime of notebooks 03-06 (fedfrozen.studies.regime.REGIMES)

AdamW methods on profiles.CPU_LR_GRID (a regime: on its own grid, REGIME_LR_GRID); each `<method>:sgd` arm (the
method with plain SGD, as its authors ran it: momentum 0, no weight decay) on CPU_SGD_LR_GRID. The result goes into
profiles.CPU_LR (or profiles.REGIME_LR) by hand, with the printed validation accuracies in its comment.
"""

import argparse

import fedfrozen as ff
import fedfrozen.studies.selection  # noqa: F401  (not imported by the package)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arms", nargs="*")
    parser.add_argument("--regime", default=None, choices=sorted(ff.regime.REGIMES))
    args = parser.parse_args()
    arms = args.arms or ff.profiles.CPU_SELECTED_ARMS
    base = ff.profiles.federated("cpu")
    if args.regime:
        base = {**base, **ff.regime.regime_fields(args.regime)}
    for optimizer in ("adamw", "sgd"):
        methods = [a.split(":")[0] for a in arms if (a.endswith(":sgd")) == (optimizer == "sgd")]
        if not methods:
            continue
        fields = dict(base, **(ff.profiles.SGD_AS_PUBLISHED if optimizer == "sgd" else {}))
        grid = (ff.profiles.CPU_SGD_LR_GRID if optimizer == "sgd" else
                ff.profiles.REGIME_LR_GRID if args.regime else ff.profiles.CPU_LR_GRID)
        result = ff.selection.select_learning_rates(methods, grid=grid, rounds=base["rounds"], base=fields)
        for m in methods:
            name = f"{m}:sgd" if optimizer == "sgd" else m
            accs = " ".join(f"{float(k):g}: " + ("diverged" if v is None else f"{v:.3f}")
                            for k, v in sorted(result["val_acc"][m].items(), key=lambda t: float(t[0])))
            print(f"{args.regime or 'cpu'} {name:18s} -> {result['lr'][m]:g}   (late val acc {accs})", flush=True)


if __name__ == "__main__":
    main()
