"""The verdict against the budget (notebook 15): C1 where FedAvg has stopped climbing.

Several of the README's C1 cells are decided while FedAvg is still rising at the last rounds
(docs/cpu_profile.md, "The doubling criterion"). Freezing Q/K after 25% of a run that has not converged may cost what
a converged run would not. Each cell here is one of those cells run again at longer budgets, everything else as it
was (the same data, start, rate, and T0 = 25% of the rounds: the cosine schedule spans each run's rounds):

- `adamw`: notebook 13's AdamW pair at Dirichlet 0.1 (the README's main C1 row, 120 rounds), the pair again at 4x
  the rounds and FedAvg alone at 2x, 15 seeds;
- `adamw_5ep`: AdamW at plain SGD's budget (5 local epochs, 240 rounds), its rate by the one rule at that budget on
  SELECTION_SEED (as plain SGD's was), 15 seeds: with notebook 13's sgd cell, the pair that changes the optimiser
  alone;
- `sgd`: notebook 13's plain-SGD pair (5 local epochs, 240 rounds) and at 2x the rounds, 5 seeds;
- `p4_w48`: notebook 13's 49-token cell at width 48, at 2x and 4x the rounds, 5 seeds;
- `text_scratch`, `text_pretrained`: notebook 14's pair from each start at its rate by the rule (three held-out
  seeds), at 4x the rounds (the same local work a round), FedAvg alone at 2x, 5 seeds.

PLAN gives each cell's budgets (multiples of its first): those that run the pair, those that run FedAvg alone (for the
doubling criterion, ff.convergence.doubling), and the seeds. The 1x runs are the notebooks' own (the same Configs:
they load from the cache), so a longer budget is the 1x Config with `rounds` and T0 scaled.

    arms = budgets.build(profile, image_base, text_base, rates)      # [Arm(cell, arm, cfg, model, fraction), ...]
    rows = budgets.comparisons(arms)                                 # [Comparison(claim, label, cell, a, b, measure)]
"""

from __future__ import annotations

import functools
import json
import math

from ..engine.config import Config, identity
from . import recipes, report, roles
from .controls import Arm
from .profiles import CPU_LR_GRID, among, learning_rates, select
from .study import SELECTION_SEED, Comparison, Study, against_fedavg, arm_label, t0

__all__ = ["study", "CELLS", "PLAN", "FIVE_EPOCHS", "TEXT_CELLS", "cell_name", "first_fields", "selection_configs",
           "build", "comparisons", "SCREEN_SEEDS", "STUDY_CELLS", "readme_settings", "screen_experiment", "doubled",
           "screen", "readme_status", "cached_machine", "longer_machine", "paired_home", "rerun_homes",
           "experiments", "units", "rates", "experiment_of"]

CELLS = ("adamw", "adamw_5ep", "sgd", "p4_w48", "text_scratch", "text_pretrained")
TEXT_CELLS = {"text_scratch": "scratch", "text_pretrained": "pretrained"}  # cell -> notebook 14's start
# cell -> (budgets that run the pair, budgets that run FedAvg alone, seeds): budgets as multiples of the cell's first
PLAN = {
    "adamw": ((1, 4), (2,), range(15)),
    "adamw_5ep": ((1,), (), range(15)),
    "sgd": ((1, 2), (), range(5)),
    "p4_w48": ((1, 2, 4), (), range(5)),
    "text_scratch": ((1, 4), (2,), range(5)),
    "text_pretrained": ((1, 4), (2,), range(5)),
}
FIVE_EPOCHS = dict(local_epochs=recipes.SGD_BUDGET["local_epochs"], rounds=recipes.SGD_BUDGET["rounds"])


def cell_name(arm: Arm) -> str:
    """The cell of `arm` at its budget, as tables and comparisons group it: "adamw, 480 rounds"."""
    return f"{arm.cell}, {arm.cfg.rounds} rounds"


def first_fields(profile: str, image_base: dict, text_base: dict | None, cell: str) -> dict:
    """The Config fields of `cell` at its first budget (its arms add method, rate, T0, seed): notebook 13's cell's
    (adamw, sgd, p4_w48), AdamW at FIVE_EPOCHS over the adamw cell's (adamw_5ep; the smoke profile: its own small
    budget), notebook 14's start (the text cells: `text_base` is roles.fields)."""
    if cell not in CELLS:
        raise ValueError(f"cell must be one of {', '.join(CELLS)}; got {cell!r}")
    if cell in TEXT_CELLS:
        if text_base is None:
            raise ValueError(f"cell {cell!r} needs text_base (roles.fields(profile, data_root))")
        fields = roles.cell_fields(text_base, TEXT_CELLS[cell])
    elif cell == "adamw_5ep":
        fields = {**recipes.cell_fields(profile, image_base, "adamw"),
                  **select(profile, smoke=dict(local_steps=4, rounds=3), cpu=FIVE_EPOCHS, paper=FIVE_EPOCHS)}
    else:
        fields = recipes.cell_fields(profile, image_base, cell)
    return fields


def selection_configs(profile: str, image_base: dict, grid=None) -> list[Config]:
    """The configs the one rule compares for adamw_5ep: FedAvg and FedFrozen (T0 25%) at each rate of CPU_LR_GRID
    (the smoke profile two), on SELECTION_SEED."""
    fields = first_fields(profile, image_base, None, "adamw_5ep")
    fields.update(warmup_rounds=t0(fields["rounds"], 0.25), seed=SELECTION_SEED)
    grid = select(profile, smoke=CPU_LR_GRID[1:3], cpu=CPU_LR_GRID, paper=CPU_LR_GRID) if grid is None else grid
    return [Config(method=m, lr=float(lr), **fields) for m in ("fedavg", "fedfrozen") for lr in grid]


def _rate(profile: str, image_base: dict, cell: str, rates: dict) -> float:
    if cell in TEXT_CELLS:
        chosen = rates.get(TEXT_CELLS[cell]) or rates.get(cell)
        if not chosen:
            raise ValueError(f"rates has no rate for cell {cell!r} (notebook 14's rule: {{start: {{method: rate}}}})")
        lrs = sorted(set(chosen.values()))
        if len(lrs) != 1:
            raise ValueError(f"cell {cell!r} runs at one rate, but the rule chose {chosen!r}")
        return lrs[0]
    if cell in ("adamw_5ep", "sgd"):
        if cell not in rates:
            raise ValueError(f"rates has no selected rates for cell {cell!r} (the one rule at its budget)")
        return float(rates[cell]["fedavg"])  # both arms at FedAvg's rate (the shared rate)
    return float(learning_rates(["fedavg"], profile=profile, dataset=image_base["dataset"])["fedavg"])


def rates(profile: str, image_base: dict, text_base: dict | None, cells=CELLS, selection_seeds=None):
    """The rates `build` needs for `cells`, each by the one rule (trained or loaded): plain SGD's at its budget
    (notebook 13's `recipes.rates_by_rule`), AdamW's at five local epochs (`selection_configs`), each text start's
    (notebook 14's `roles.rates_by_rule` on `selection_seeds`, default `roles.selection_seeds`). adamw and p4_w48 need
    none (AdamW's base rate). Returns (rates, a table of every selection run, its cell in `cell`)."""
    import pandas as pd

    from .study import cells_by_rule

    cells = among("cells", cells, CELLS)
    got, tables = {}, []
    if "sgd" in cells:
        chosen, table = recipes.rates_by_rule(profile, image_base, ["sgd"])
        got.update(chosen)
        tables.append(table)
    if "adamw_5ep" in cells:
        chosen, table = cells_by_rule({"adamw_5ep": selection_configs(profile, image_base)}, image_base["dataset"])
        got.update(chosen)
        tables.append(table)
    inits = [TEXT_CELLS[c] for c in cells if c in TEXT_CELLS]
    if inits:
        if text_base is None:
            raise ValueError(f"cells {cells!r} need text_base (roles.fields(profile, data_root))")
        seeds = roles.selection_seeds(profile) if selection_seeds is None else tuple(selection_seeds)
        chosen, table = roles.rates_by_rule(profile, text_base, inits, experiment="shakespeare", seeds=seeds)
        got.update(chosen)
        tables.append(table.assign(cell="text_" + table["cell"]))
    return got, pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()


def experiment_of(arm: Arm, image_base: dict) -> str:
    """The cache experiment of `arm`'s cell: "shakespeare" for the text cells, the image dataset's for the rest."""
    return "shakespeare" if arm.cell in TEXT_CELLS else image_base["dataset"]


def build(profile: str, image_base: dict, text_base: dict | None, rates: dict, cells=CELLS,
          seeds: dict | None = None) -> list[Arm]:
    """Every arm of `cells` at each budget of PLAN, one Arm per seed: FedAvg and FedFrozen T0 25% at the pair's
    budgets, FedAvg alone at the others; at a budget of m times the first, `rounds` and T0 are m times theirs and
    nothing else changes. `rates`: {"adamw_5ep": {method: rate}, "sgd": {method: rate}} of the rule at those budgets,
    and notebook 14's {"scratch": ..., "pretrained": ...} for the text cells (one rate a start); adamw and p4_w48 run
    at AdamW's base rate. `seeds` ({cell: seeds}) overrides PLAN's."""
    cells = among("cells", cells, CELLS)
    out: list[Arm] = []
    for cell in cells:
        pair_at, fedavg_at, cell_seeds = PLAN[cell]
        cell_seeds = list((seeds or {}).get(cell, cell_seeds))
        if not cell_seeds:
            raise ValueError(f"seeds for cell {cell!r} must not be empty")
        fields = first_fields(profile, image_base, text_base, cell)
        lr = _rate(profile, image_base, cell, rates)
        model = fields.get("model", "")
        for m in sorted(set(pair_at) | set(fedavg_at)):
            rounds = fields["rounds"] * m
            warmup = t0(rounds, 0.25)  # FedFrozen's T0; FedAvg ignores it (its key carries 25%'s, as in 13, 14)
            for method in ("fedavg", "fedfrozen") if m in pair_at else ("fedavg",):
                fraction = 0.25 if method == "fedfrozen" else None
                for s in cell_seeds:
                    extra = {"pretrain_seed": s} if fields.get("init") == "pretrained" else {}
                    cfg = Config(method=method, seed=s, **{**fields, "lr": lr, "rounds": rounds,
                                                           "warmup_rounds": warmup, **extra})
                    out.append(Arm(cell, arm_label(method, fraction, lr), cfg, model, fraction, m))
    return out


def comparisons(arms: list[Arm]) -> list[Comparison]:
    """At each budget that ran the pair, FedFrozen T0 25% against FedAvg at the same rate, paired by seed (C1); the
    cell is the cell at its budget (`cell_name`): `study.against_fedavg`."""
    return against_fedavg(arms, cell_of=cell_name)



# Every README cell's status (issue: the verdict where FedAvg has stopped climbing): the FedAvg runs each README row
# rests on, screened by the last tenth, and where the screen is above a point, FedAvg at twice the rounds
SCREEN_SEEDS = range(5)
# the notebooks' cells this notebook runs at longer budgets: (verdict table, its cell) -> notebook 15's cell
STUDY_CELLS = {("13", "adamw"): "adamw", ("13", "sgd"): "sgd", ("13", "p4_w48"): "p4_w48",
               ("14", "scratch"): "text_scratch", ("14", "pretrained"): "text_pretrained"}


def _fedavg_arm(quote, profile: str, seeds: set) -> list[Config] | None:
    """The Configs (on `seeds`) of the runs that are `quote`'s FedAvg setting: its arm that trains FedAvg (b, else
    a); where neither does (C3 compares FedFrozen with and without the value penalty, the baselines row FedFrozen
    with FedProx and SCAFFOLD), its FedFrozen arm without the penalty, as FedAvg (the same Config but the method:
    FedAvg's runs carry T0 too). None where it has neither."""
    for want in ("fedavg", "fedfrozen"):
        for side in ("b", "a"):
            cfgs = [c for c in report.arm_configs(quote, side, profile) if c.seed in seeds]
            if cfgs and all(c.method == want and c.value_l2 == 0 for c in cfgs):
                return [c if want == "fedavg" else c.replace(method="fedavg") for c in cfgs]
    return None


def readme_settings(profile: str = "cpu", rows=None, seeds=SCREEN_SEEDS) -> list[dict]:
    """The FedAvg settings the README's rows rest on (`report.ROWS`, or `rows`), once each, on `seeds`: for every
    comparison a row quotes, the runs of its FedAvg arm (`_fedavg_arm`). Comparisons whose FedAvg runs agree up to
    the seed share one setting. Returns [dict(rows=["C1 base, IID: accuracy", ...], cell=notebook 15's cell
    (STUDY_CELLS) or None, configs=[Config per seed])], in the rows' order."""
    seeds = set(seeds)
    out: dict = {}
    for row in report.ROWS if rows is None else rows:
        for q in row.quotes:
            cfgs = _fedavg_arm(q, profile, seeds)
            if cfgs is None:
                raise ValueError(f"{row.claim} {row.regime!r}, {q.label!r}: no arm with FedAvg's runs on seeds "
                                 f"{sorted(seeds)}")
            setting = json.dumps(sorted({json.dumps(identity({k: v for k, v in c.to_dict().items() if k != "seed"}),
                                                    sort_keys=True) for c in cfgs}))  # a body per seed differs
            entry = out.setdefault(setting, dict(rows=[], cell=None, configs=cfgs))
            entry["rows"].append(f"{row.code} {row.regime}: {q.label}")
            entry["cell"] = entry["cell"] or STUDY_CELLS.get((q.source, q.b.get("cell")))
            if len(cfgs) > len(entry["configs"]):
                entry["configs"] = cfgs
    return list(out.values())


def screen_experiment(cfgs, experiment: str, root=None) -> str:
    """Where a setting's FedAvg runs are read: `experiment` when every one of them is in its cache (the notebook's
    own runs), else `experiment + "_screen"`, so that a run trained here for the screen never stands in the cache
    for a notebook's committed run trained on another CPU."""
    from ..runs.experiments import config_key, results_root

    folder = results_root(root) / experiment
    if all((folder / config_key(c) / "history.json").exists() for c in cfgs):
        return experiment
    return f"{experiment}_screen"


def doubled(cfg: Config) -> Config:
    """`cfg` at twice its rounds, T0 scaled with them (as `build` scales a budget)."""
    return cfg.replace(rounds=2 * cfg.rounds, warmup_rounds=2 * cfg.warmup_rounds)


@functools.lru_cache(maxsize=1)
def _this_machine() -> str:
    """This machine's short signature at one thread, the count the notebooks (`ff.io.use_threads`) and run_many's
    workers train at (computed once: `paired_home` asks for it per arm)."""
    from ..base.io import machine, machine_id

    return machine_id(machine(threads=1))


def cached_machine(cfg: Config, experiment: str, root=None) -> str | None:
    """The short machine signature (`tables.machine_of`) of the cached run of `cfg` in `experiment`, None where
    there is none (read from its env.json, not its History)."""
    from ..base.io import machine_id
    from ..runs.experiments import config_key, results_root
    from .tables import UNRECORDED

    folder = results_root(root) / experiment / config_key(cfg)
    if not (folder / "history.json").exists() or not (folder / "env.json").exists():
        return None
    sig = json.loads((folder / "env.json").read_text()).get("machine")
    return machine_id(sig) if sig else UNRECORDED


def longer_machine(longer, experiment: str, root=None) -> str:
    """The machine of the runs `longer` (one seed of a cell at its longer budgets, in `experiment`): the one their
    cached runs were trained on, this machine's where none is cached yet (they will be trained here). ValueError
    where the cached ones come from more than one machine: their seed cannot be paired on one machine without
    training them again."""
    got = {m for m in (cached_machine(c, experiment, root) for c in longer) if m is not None}
    if len(got) > 1:
        seeds = sorted({c.seed for c in longer})
        raise ValueError(f"the longer budgets of seed {seeds} in {experiment!r} were trained on machines "
                         f"{', '.join(sorted(got))}: a seed's budgets pair only on one machine (retrain them)")
    return got.pop() if got else _this_machine()


def paired_home(first: Config, machine: str, homes, root=None) -> str:
    """Where the run `first` (one seed of a cell at its first budget) is read so that it pairs with its longer
    budgets, trained on `machine`, on one machine: a CPU moves a run about a point, the doubling criterion's size,
    so a difference paired across two machines would measure the machines too. The first of `homes` (experiment
    folders, in order) whose cached run of `first` was trained on `machine`; where none was, the first of them
    without a cached run of `first` (there it is trained, beside the longer runs). ValueError where that would
    train it on another machine than `machine`, or where each folder holds another machine's run.
    (`units` trains a seed's first budget before its longer ones, so an interrupted seed never needs this.)"""
    homes = list(dict.fromkeys(homes))
    found = {h: cached_machine(first, h, root) for h in homes}
    for h in homes:
        if found[h] == machine:
            return h
    if machine != _this_machine():
        raise ValueError(f"the longer budgets of {first.method} seed {first.seed} were trained on machine {machine}, "
                         f"its first budget ({first.rounds} rounds) was not, and training it here would pair two "
                         f"machines: train it on {machine}, or remove that seed's longer runs and train both here")
    for h in homes:
        if found[h] is None:
            return h
    raise ValueError(f"the run {first.method} seed {first.seed} ({first.rounds} rounds) is cached in "
                     f"{', '.join(homes)} from machines other than {machine}: none can take this machine's")


def rerun_homes(experiment: str, machine: str) -> tuple[str, str, str]:
    """The folders a first-budget run is read from, in order (`paired_home`): the notebook's own `experiment`, then
    `experiment + "_screen"` (runs trained again beside longer ones, apart from the notebooks' committed runs), then
    that folder with the longer runs' machine appended (where `_screen` already holds another machine's run)."""
    return experiment, f"{experiment}_screen", f"{experiment}_screen_{machine}"


def units(arms, where) -> list[tuple[str, int, list[tuple[str, list[int]]]]]:
    """The order to train `arms` in (their experiments `where`, from `experiments`), one seed of one cell at a time:
    [(cell, seed, [(experiment, arm indices), ...])], its first budget before its longer ones. A sitting that ends
    inside a seed then leaves at most first-budget runs without their longer ones, which the next machine pairs with
    its own (`paired_home`); it never leaves longer runs whose first budget another machine would have to train."""
    out: dict = {}
    for i, a in enumerate(arms):
        out.setdefault((a.cell, a.cfg.seed), []).append(i)
    order = []
    for (cell, seed), idx in out.items():
        steps: dict = {}
        for i in sorted(idx, key=lambda i: arms[i].budget != 1):  # the first budget first (a stable sort)
            steps.setdefault((arms[i].budget == 1, where[i]), []).append(i)
        order.append((cell, seed, [(exp, got) for (_, exp), got in steps.items()]))
    return order


def experiments(arms, experiment_of, root=None) -> list[str]:
    """The experiment each arm's run is read from (and trained in where it is missing): its cell's longer budgets
    in the cell's own experiment (`experiment_of(arm)`: the dataset's, or "shakespeare"); its first budget where it
    pairs with them on one machine (`paired_home` over `rerun_homes`): the notebook's own run when that machine
    trained it, else a run trained again beside them. A cell with one budget reads its notebook's runs."""
    longer: dict = {}
    for a in arms:
        if a.budget != 1:
            longer.setdefault((a.cell, a.cfg.seed), []).append(a.cfg)
    out = []
    for a in arms:
        exp = experiment_of(a)
        if a.budget != 1 or (a.cell, a.cfg.seed) not in longer:
            out.append(exp)
            continue
        machine = longer_machine(longer[(a.cell, a.cfg.seed)], exp, root)
        out.append(paired_home(a.cfg, machine, rerun_homes(exp, machine), root))
    return out


def screen(settings: list[dict], workers: int | None = None, root=None) -> tuple[list, dict]:
    """Every README setting's FedAvg runs (`readme_settings`), trained or loaded (`screen_experiment`), and for each
    that is no cell of this notebook (its own doubling decides those) and whose mean last-tenth gain is a point or
    more, FedAvg at twice the rounds (`doubled`) on the same seeds in the screen experiment, each paired with a 1x
    run of its own machine (`paired_home`: the cached one where that machine made it, else one retrained beside it:
    a CPU moves a run about a point, the criterion's size). Returns (Histories per setting, {setting index: (1x
    Histories, 2x Histories)})."""
    import numpy as np

    from ..runs.experiments import run_many
    from .convergence import THRESHOLD, last_tenth_gain

    hists, pairs, sources = [], {}, []
    for s in settings:
        sources.append(screen_experiment(s["configs"], s["configs"][0].dataset, root))
        hists.append(run_many(s["configs"], root=root, experiment=sources[-1], workers=workers))
    for i, (s, hs) in enumerate(zip(settings, hists)):
        if s["cell"] or not np.nanmean([100 * last_tenth_gain(h) for h in hs]) >= 100 * THRESHOLD:
            continue
        where = f"{s['configs'][0].dataset}_screen"
        twos = [doubled(c) for c in s["configs"]]
        homes = []  # each seed's 1x run where it pairs with its 2x run on one machine
        for c, c2 in zip(s["configs"], twos):
            machine = longer_machine([c2], where, root)
            homes.append(paired_home(c, machine, (sources[i], *rerun_homes(c.dataset, machine)[1:]), root))
        ones = [None] * len(twos)
        for home in dict.fromkeys(homes):
            idx = [j for j, h in enumerate(homes) if h == home]
            for j, h in zip(idx, run_many([s["configs"][j] for j in idx], root=root, experiment=home,
                                          workers=workers)):
                ones[j] = h
        pairs[i] = (ones, run_many(twos, root=root, experiment=where, workers=workers))
    return hists, pairs


def readme_status(settings: list[dict], hists: list, pairs: dict, convergence=None) -> "pd.DataFrame":  # noqa: F821
    """One row per README setting: its rows, notebook 15's cell (whose doubling runs decide it, `convergence`: this
    notebook's table, by cell) or the screen: the mean ± sd over seeds of FedAvg's last-tenth gain in points
    (`hists`: a list of Histories per setting), and where that is 1 point or more the doubling criterion on FedAvg
    at 1x and 2x (`pairs`: {setting index: (1x Histories, 2x Histories)}, `screen`). `by` says which decided it;
    `status` passes, fails, undetermined, "needs the doubling runs" (a screen above a point without them), "pending"
    (notebook 15's cell without its doubling runs) or "not run at this profile" (no Histories)."""
    import numpy as np
    import pandas as pd

    from .convergence import PASSES, THRESHOLD, doubling, last_tenth_gain

    out = []
    for i, (s, hs) in enumerate(zip(settings, hists)):
        gains = [100 * last_tenth_gain(h) for h in hs]
        row = dict(rows="; ".join(s["rows"]), cell=s["cell"] or "", rounds=s["configs"][0].rounds, n=len(hs),
                   screen_mean=float(np.nanmean(gains)) if gains else math.nan,
                   screen_sd=float(np.nanstd(gains, ddof=1)) if len(gains) > 1 else math.nan,
                   by="", gain=math.nan, half_width=math.nan, status="")
        if s["cell"] and convergence is not None and s["cell"] in set(convergence["cell"]):
            first = convergence[(convergence["cell"] == s["cell"]) & (convergence["by"] == "doubling")]
            if len(first):
                got = first.sort_values("budget").iloc[0]
                row.update(by=f"doubling (notebook 15, {s['cell']})", gain=100 * got["gain"],
                           half_width=100 * got["half_width"], n=int(got["n"]), status=got["status"])
        if not row["by"] and i in pairs:
            ones, twos = pairs[i]
            at_b = {h.config["seed"]: h.late_accuracy for h in ones if not h.diverged}
            at_2b = {h.config["seed"]: h.late_accuracy for h in twos if not h.diverged}
            got = doubling(at_b, at_2b)
            row.update(by="doubling (FedAvg at 2x)", gain=100 * got["gain"], half_width=100 * got["half_width"],
                       n=got["n"], status=got["status"])
        if not row["by"] and s["cell"]:
            row.update(by=f"doubling (notebook 15, {s['cell']})", status="pending: its runs are not in")
        elif not row["by"] and not hs:
            row.update(status="not run at this profile")
        elif not row["by"]:
            above = row["screen_mean"] >= 100 * THRESHOLD
            row.update(by="last tenth", status="needs the doubling runs" if above else PASSES)
        out.append(row)
    return pd.DataFrame(out)


def study(profile: str, image_base: dict, text_base: dict | None, rates: dict, cells=CELLS,
          seeds: dict | None = None) -> Study:
    """Notebook 15's study: `build`'s arms at every budget and their `comparisons`, each arm's runs grouped in its
    cell at its budget (`cell_name`)."""
    arms = build(profile, image_base, text_base, rates, cells=cells, seeds=seeds)
    return Study("15", tuple(arms), tuple(comparisons(arms)), cell_of=cell_name)
