"""Where does freezing pay? The regime map of FedFrozen against FedAvg (notebook 11).

A *cell* is one setting: Dirichlet heterogeneity `alpha`, local work (`local_epochs`), starting point
(`start`: "scratch"; "warm" = the server pre-trains on a public split before round 0; "pretrained" = the server
pre-trains on images no client holds, fedfrozen.engine.pretrain), the local rate's `schedule` (None: the profile's;
"constant"; "cosine") and the warm-up length as a fraction of the rounds (`fraction` = T0 / T). Its value in a
measure is FedFrozen minus FedAvg (same alpha, local work, start and schedule), paired seed by seed and judged by
the one rule of `fedfrozen.studies.tables` (PAIRED_RULE), then with the map's other cells as one family (Holm,
FAMILY_RULE): better, worse, or no difference resolved.

    cells = regime.grid("coarse")                     # or "full", or regime.grid(alphas=..., ...)
    runs = regime.build_runs(cells, base, seeds)      # one Config per run: FedAvg baselines + FedFrozen cells
    table = regime.summarise(runs, ff.run_many([r.cfg for r in runs]))
    cell_map = regime.regime_map(table, "late_acc")   # one row per cell: gap, half_width, verdict, verdict_holm

The regimes of notebooks 03-06 (REGIMES) are named sets of Config fields over a profile: a pretrained start, a
constant rate, five local epochs, and their products with a pretrained start.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..engine.config import Config
from .profiles import PRETRAINED_START, REGIMES, dirichlet_fields, regime_fields, regime_learning_rates
from .tables import UNRESOLVED, compare_runs
from .tables import summarise as summarise_runs

__all__ = ["Cell", "Run", "MEASURES", "GRIDS", "STARTS", "REGIMES", "grid", "build_runs", "summarise", "regime_map",
           "start_fields", "regime_fields", "regime_name", "selected_lrs"]

# measure -> (label, higher is better)
MEASURES = {
    "late_acc": ("late test accuracy (the late window, docs/claims.md)", True),
    "final_acc": ("final test accuracy", True),
    "worst10_acc": ("worst-10% client accuracy", True),
    "oscillation": ("late oscillation (the late window's swing around its trend, docs/claims.md)", False),
    "stability": ("late-round instability (std of the last 3 evaluations; follows a trend as much as a swing)", False),
}
SCHEDULES = (None, "constant", "cosine")  # None: the profile's schedule
STARTS = ("scratch", "warm", "pretrained")

# Warm start: 10% of the training data is the server's public split (held out from the clients in
# both arms of a cell), and the server trains on it for this many epochs before round 0.
WARM_START = dict(init="public", public_fraction=0.1, server_pretrain_epochs=5)



@dataclass(frozen=True)
class Cell:
    """One setting of the map; `fraction` is T0 / T of the FedFrozen arm."""

    alpha: float
    local_epochs: int
    start: str
    fraction: float
    schedule: str | None = None  # the local rate's schedule; None: the profile's

    @property
    def baseline(self) -> tuple:
        """What the FedAvg arm shares with this cell: (alpha, local_epochs, start, schedule)."""
        return (self.alpha, self.local_epochs, self.start, self.schedule)


@dataclass(frozen=True)
class Run:
    """One run of a grid: its Config, its arm ("fedavg" or "fedfrozen") and the cell's coordinates."""

    cfg: Config
    arm: str
    alpha: float
    local_epochs: int
    start: str
    fraction: float  # 1.0 for the FedAvg arm (T0 = T: never frozen)
    schedule: str = ""  # the run's lr_schedule


def grid(name: str | None = None, *, alphas=(0.05, 0.1, 0.5, 1.0), local_epochs=(1, 5),
         fractions=(0.25, 0.5, 0.75), starts=("scratch", "warm"), schedules=(None,)) -> list[Cell]:
    """The cells of a named grid ("coarse", "full"), or the full product of the given axes."""
    if name is not None:
        names = name.split("+")  # grids joined: "coarse+regimes"
        bad = [n for n in names if n not in GRIDS]
        if bad:
            raise ValueError(f"grid must be one of {', '.join(GRIDS)} (or several joined by '+'); got {name!r}")
        return list(dict.fromkeys(c for n in names for c in GRIDS[n]))
    for label, values in (("alphas", alphas), ("local_epochs", local_epochs), ("fractions", fractions),
                          ("starts", starts), ("schedules", schedules)):
        if not len(values):
            raise ValueError(f"{label} must not be empty")
    bad = [s for s in starts if s not in STARTS]
    if bad:
        raise ValueError(f"starts must be among {STARTS}; got {bad}")
    bad = [s for s in schedules if s not in SCHEDULES]
    if bad:
        raise ValueError(f"schedules must be among {SCHEDULES}; got {bad}")
    bad = [f for f in fractions if not 0 <= f < 1]
    if bad:
        raise ValueError(f"fractions (T0 / T of the FedFrozen arm) must be in [0, 1); got {bad} (1.0 is FedAvg, "
                         "the baseline every cell is compared with)")
    bad = [a for a in alphas if not a > 0]
    if bad:
        raise ValueError(f"alphas must be > 0; got {bad}")
    bad = [e for e in local_epochs if isinstance(e, bool) or not isinstance(e, int) or e < 1]
    if bad:
        raise ValueError(f"local_epochs must be integers >= 1; got {bad}")
    return [Cell(float(a), int(e), s, float(f), sched)
            for a, e, s, f, sched in itertools.product(alphas, local_epochs, starts, fractions, schedules)]


GRIDS = {
    # the cpu profile's grid: both T0 at one epoch from scratch at strong and mild heterogeneity (the alphas of
    # notebooks 03-04, whose runs it shares through the cache), and T0 = T/2 with heavy local work and with a warm
    # start at alpha 0.1
    "coarse": tuple(grid(alphas=(0.1, 0.5), local_epochs=(1,), fractions=(0.25, 0.5), starts=("scratch",)))
    + (Cell(0.1, 5, "scratch", 0.5), Cell(0.1, 1, "warm", 0.5)),
    # the regime cells of notebooks 03-04's sections 2 (their runs, through the cache): at alpha 0.1, a pretrained
    # start (T0/T 0, 0.25, 0.5; and at alpha 0.5), a constant rate and both (T0/T 0.25, 0.5; and at alpha 0.05), five
    # local epochs from scratch and pretrained (T0/T 0.25)
    "regimes": (Cell(0.1, 1, "pretrained", 0.0), Cell(0.1, 1, "pretrained", 0.25), Cell(0.1, 1, "pretrained", 0.5),
                Cell(0.5, 1, "pretrained", 0.25),
                Cell(0.1, 1, "scratch", 0.25, "constant"), Cell(0.1, 1, "scratch", 0.5, "constant"),
                Cell(0.1, 1, "pretrained", 0.25, "constant"), Cell(0.1, 1, "pretrained", 0.5, "constant"),
                Cell(0.1, 5, "scratch", 0.25), Cell(0.1, 5, "pretrained", 0.25),
                Cell(0.05, 1, "scratch", 0.25, "constant"), Cell(0.05, 1, "scratch", 0.5, "constant"),
                Cell(0.05, 1, "pretrained", 0.25, "constant"), Cell(0.05, 1, "pretrained", 0.5, "constant")),
    # the paper profile's: every image is a client's there, so a pretrained start (which needs images no client holds,
    # Config.train_subset) is not in it
    "full": tuple(grid(alphas=(0.05, 0.1, 0.5, 1.0), local_epochs=(1, 5), fractions=(0.25, 0.5, 0.75),
                       starts=("scratch", "warm"))),
}


def start_fields(start: str) -> dict:
    """Config fields of a starting point."""
    if start not in STARTS:
        raise ValueError(f"start must be one of {STARTS}; got {start!r}")
    return dict(WARM_START) if start == "warm" else dict(PRETRAINED_START) if start == "pretrained" else {}


def regime_name(cell: Cell) -> str:
    """The regime (REGIMES) whose learning rates a cell takes: from its start (pretrained or not) and schedule;
    heavy local work and a warm start take those of their start and schedule."""
    pretrained = cell.start == "pretrained"
    if cell.schedule == "constant":
        return "constant_pretrained" if pretrained else "constant"
    return "pretrained" if pretrained else "scratch"


def selected_lrs(profile: str, dataset: str = "digits"):
    """`lrs` for `build_runs`: each method at the rate selected for its cell's regime (profiles.regime_learning_rates;
    the profile's own rates for the scratch regime)."""
    def lr(method: str, cell: Cell) -> float:
        return regime_learning_rates(regime_name(cell), [method], profile=profile, dataset=dataset)[method]
    return lr


def build_runs(cells, base: dict, seeds, method: str = "fedfrozen", baseline: str = "fedavg", lrs=None) -> list[Run]:
    """The runs of a map: for each (alpha, local work, start, schedule) of `cells` the baseline over `seeds`,
    and for each cell `method` with T0 = round(fraction * rounds). `base` holds the other Config fields
    (a profile's, with `rounds`); `lrs` the local lr of each method (else base's lr): a dict {method: lr}, or
    a function (method, cell) -> lr when the rate depends on the start or schedule (profiles.regime_lr). Each
    alpha's federation is drawn as the notebooks draw it (profiles.dirichlet_fields)."""
    cells = list(cells)
    if not cells:
        raise ValueError("cells must not be empty")
    if not len(seeds):
        raise ValueError("seeds must not be empty")
    rounds = base.get("rounds", Config.rounds)
    table = lrs or {}
    lr_of = lrs if callable(lrs) else (lambda m, cell: table.get(m, base.get("lr", Config.lr)))
    runs = []
    for key in dict.fromkeys(c.baseline for c in cells):
        alpha, epochs, start, schedule = key
        fields = {**base, **dirichlet_fields(alpha), "local_epochs": epochs, "local_steps": None,
                  **start_fields(start), **({"lr_schedule": schedule} if schedule else {})}
        sched = fields.get("lr_schedule", Config.lr_schedule)
        ref = Cell(alpha, epochs, start, 1.0, schedule)
        for s in seeds:
            runs.append(Run(Config(**{**fields, "method": baseline, "lr": lr_of(baseline, ref), "seed": s}),
                            "fedavg", alpha, epochs, start, 1.0, sched))
        for c in (c for c in cells if c.baseline == key):
            for s in seeds:
                cfg = Config(**{**fields, "method": method, "lr": lr_of(method, c), "seed": s,
                                "warmup_rounds": int(round(c.fraction * rounds))})
                runs.append(Run(cfg, "fedfrozen", alpha, epochs, start, c.fraction, sched))
    return runs


def summarise(runs, hists, last: int = 3):
    """tables.summarise of the runs (one row each) with the runs' columns: arm, start, fraction."""
    runs = list(runs)
    df = summarise_runs([r.cfg for r in runs], hists, last=last)
    df["arm"] = [r.arm for r in runs]
    df["start"] = [r.start for r in runs]
    df["fraction"] = [r.fraction for r in runs]
    df["schedule"] = [r.schedule or r.cfg.lr_schedule for r in runs]
    df["T0"] = [r.cfg.warmup_rounds if r.arm == "fedfrozen" else r.cfg.rounds for r in runs]
    return df


def regime_map(runs, measure: str = "final_acc"):
    """One row per cell (alpha, local_epochs, start, schedule, fraction): the FedFrozen and FedAvg means over
    seeds in `measure`, gap = the mean paired difference FedFrozen - FedAvg over the seeds both have, half_width
    of its 95% interval (PAIRED_RULE), verdict "better" / "worse" / "no difference resolved" (for oscillation and
    stability, lower is better), and the map's cells judged as one family (tables.adjust, FAMILY_RULE): p,
    p_holm, verdict_holm in the same words, and the difference each cell detects at 80% power."""
    import pandas as pd

    from .tables import adjust

    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {', '.join(MEASURES)}; got {measure!r}")
    higher = MEASURES[measure][1]
    runs = runs if "schedule" in runs.columns else runs.assign(schedule="")
    keys = ["alpha", "local_epochs", "start", "schedule"]
    rows = []
    base = {k: sub for k, sub in runs[runs["arm"] == "fedavg"].groupby(keys)}
    frozen_runs = runs[runs["arm"] == "fedfrozen"]
    for (alpha, epochs, start, schedule, fraction), sub in frozen_runs.groupby(keys + ["fraction"]):
        ref = base.get((alpha, epochs, start, schedule))
        if ref is None:
            raise ValueError(f"no FedAvg runs for alpha={alpha}, local_epochs={epochs}, start={start!r}"
                             + (f", schedule={schedule!r}" if schedule else ""))
        a, b = (dict(zip(x["seed"], x[measure])) for x in (sub, ref))
        shared = [seed for seed in a if seed in b and a[seed] == a[seed] and b[seed] == b[seed]]  # finite pairs
        if not shared:
            c, verdict = None, "n/a"
        else:
            c = compare_runs([a[seed] for seed in shared], [b[seed] for seed in shared])
            verdict = UNRESOLVED if not c.resolved else "better" if (c.gap > 0) == higher else "worse"
        rows.append(dict(alpha=alpha, local_epochs=epochs, start=start, schedule=schedule, fraction=fraction,
                         fedfrozen=c.mean_a if c else float("nan"), fedavg=c.mean_b if c else float("nan"),
                         gap=c.gap if c else float("nan"), half_width=c.half_width if c else float("nan"),
                         verdict=verdict, seeds=len(shared)))
    out = pd.DataFrame(rows)
    judged = out[out["seeds"] > 1]
    family = adjust(judged.rename(columns={"gap": "d", "seeds": "n"})) if len(judged) else None
    for col in ("p", "p_holm", "detectable"):
        out[col] = family[col].reindex(out.index) if family is not None else float("nan")
    words = {"higher": "better" if higher else "worse", "lower": "worse" if higher else "better",
             UNRESOLVED: UNRESOLVED}
    out["verdict_holm"] = (family["verdict_holm"].map(words).reindex(out.index).fillna("n/a") if family is not None
                           else "n/a")
    return out
