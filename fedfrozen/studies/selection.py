"""Learning-rate selection by one rule for every method, at the scale where the rates will be used.

Rule (RULE; the same as the digits selection in the README): for each method, train at every rate of a
small grid on the notebook's selection seeds and keep the rate with the best late validation accuracy
(History.late: the mean over the late window; one evaluation under partial participation at alpha 0.1
swings by tens of points with the clients sampled), read on the mean over the seeds where there are
several (study.selected_rates), ties and runs that diverged going to the smaller rate. Which seeds: 0
for the image profiles (`select_learning_rates` here); 100, which no comparison evaluates, for notebooks
12-13; the mean of 100-102 for notebook 14, where one seed chose rates 2.4-2.6 sd away from the
evaluated seeds' mean. Freezing methods
freeze at 25% of the rounds. `select_learning_rates` runs the grid through the cache (run_many)
and, for the paper profile, stores the result where `fedfrozen.studies.profiles.learning_rates` reads it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..base.io import atomic_write
from ..engine.config import Config
from ..runs.experiments import run_many
from .profiles import PAPER_LR_GRID, federated, paper_lr_file

__all__ = ["pick", "select_learning_rates", "selection_t0", "seed_agreement", "RULE"]

RULE = ("best late validation accuracy (History.late: the late window where a run evaluates every late round, else "
        "its last evaluations) on the notebook's selection seeds, their mean where several (seed 0 for the profiles' "
        "image rates and select_learning_rates; seed 100, which no comparison evaluates, for notebooks 12-13; the "
        "mean of seeds 100-102 for notebook 14), freezing at 25% of the rounds; "
        "ties and diverged runs go to the smaller lr")


def selection_t0(rounds: int) -> int:
    """T0 of the rule's FedFrozen runs: a quarter of their rounds, at least one."""
    return max(1, rounds // 4)


def pick(val_acc: dict) -> float:
    """The lr with the highest validation accuracy; ties to the smaller lr; None/NaN (diverged) never wins."""
    if not val_acc:
        raise ValueError("pick needs at least one (lr, accuracy) pair")
    score = {lr: (a if a is not None and math.isfinite(a) else -math.inf) for lr, a in val_acc.items()}
    return min(score, key=lambda lr: (-score[lr], lr))


def seed_agreement(runs, by, measure: str = "late_acc", chosen_on=()):
    """How often one seed alone picks the rate that is best on the evaluated seeds' mean.

    `runs`: a per-seed table (columns `by`, `lr`, `seed`, `measure`), `by` naming an arm up to its rate (a cell and
    the method, say). For each arm that ran at two rates or more on the same seeds (only seeds with every rate
    count): the rates, the rate best on the mean of `measure` over those seeds (`pick`: ties to the smaller), how many
    of the seeds pick it alone, and for each seed of `chosen_on` among them (seed 0, say, that chose the image rates)
    the rate it picks. One row per such arm; none where no arm ran at two rates."""
    import pandas as pd

    by = [by] if isinstance(by, str) else list(by)
    rows = []
    for key, g in runs.groupby(by, sort=False):
        wide = g.pivot_table(index="seed", columns="lr", values=measure).dropna()
        if wide.shape[1] < 2 or wide.empty:
            continue
        best = pick(wide.mean().to_dict())
        picks = {seed: pick(r.to_dict()) for seed, r in wide.iterrows()}
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        row.update(rates=", ".join(f"{x:g}" for x in wide.columns), best_on_mean=best, seeds=len(wide),
                   seeds_picking_it=sum(v == best for v in picks.values()))
        row.update({f"seed {s} picks": picks.get(s) for s in chosen_on})
        rows.append(row)
    columns = [*by, "rates", "best_on_mean", "seeds", "seeds_picking_it", *[f"seed {s} picks" for s in chosen_on]]
    return pd.DataFrame(rows, columns=columns)


def select_learning_rates(methods, dataset: str = "cifar10", grid=PAPER_LR_GRID, rounds: int = 30,
                          root=None, workers: int | None = None, base: dict | None = None, write: bool = True,
                          overrides: dict | None = None) -> dict:
    """Select each method's local lr at the paper scale (or on `base` Config fields) and store it.

    `overrides` (Config fields) change the paper profile's settings (e.g. a data_root, a smaller
    federation). Returns {"lr": {method: lr}, "val_acc": {method: {lr: acc}}, "rule", "rounds", "grid",
    "dataset"}; with write=True (and no `base`) it is written to profiles.paper_lr_file(dataset, root).
    """
    methods = list(methods)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 2:
        raise ValueError(f"rounds must be an integer >= 2; got {rounds!r}")
    grid = sorted(float(g) for g in grid)
    if not grid or any(g <= 0 for g in grid):
        raise ValueError(f"grid must be positive learning rates; got {grid!r}")
    fields = dict(base) if base is not None else {**federated("paper", paper_dataset=dataset), **(overrides or {})}
    for owned in ("method", "lr"):  # set per selection run below (the paper profile's fields carry an lr)
        fields.pop(owned, None)
    fields.update(rounds=rounds, warmup_rounds=selection_t0(rounds), partition="dirichlet", alpha=0.1, seed=0)
    fields["lr_warmup_rounds"] = min(fields.get("lr_warmup_rounds", 0), rounds // 3)
    cfgs = [Config(method=m, lr=lr, **fields) for m in methods for lr in grid]  # validated before any training
    hists = run_many(cfgs, root=root, experiment=f"{fields['dataset']}/lr_selection", workers=workers)
    val = {m: {} for m in methods}
    for cfg, hist in zip(cfgs, hists):
        val[cfg.method][cfg.lr] = None if hist.diverged else hist.late("val_acc")
    result = {"lr": {m: pick(val[m]) for m in methods},
              "val_acc": {m: {str(k): v for k, v in val[m].items()} for m in methods},
              "rule": RULE, "rounds": rounds, "grid": grid, "dataset": fields["dataset"]}
    if write and base is None:
        path = paper_lr_file(dataset, root)
        text = json.dumps(result, indent=1, sort_keys=True)
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))
    return result
