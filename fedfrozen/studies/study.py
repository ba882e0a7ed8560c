"""What the studies of the notebooks share: an arm's label and T0, and a comparison as data with its label generated.

A study (notebooks 03 § 3, 12-15) is cells × arms × seeds: each `controls.Arm` is one arm of a cell on one seed, its
Config whole. A `Comparison` names two arms of one cell, a minus b paired by seed, and the claim it tests; its label
is generated from those by the one function here that writes it, so that no label is typed twice, and none is parsed:
code that needs a comparison's parts reads its fields (`fedfrozen report` names the comparisons the documents quote
by their data, `report.Quote`).

    s = recipes.study(profile, base, rates)  # a notebook's Study: its arms and comparisons, declared
    hists = ff.run_many(s.configs(), experiment=...)
    runs = s.runs(hists)                      # the per-seed table: every run's settings, its cell and arm
    verdicts = s.verdicts(ff.tables.mean_std(runs, ["cell", "arm"], [...]), "late_acc")
    rows = study.against_fedavg(arms)     # each FedFrozen arm against FedAvg of its cell at the same rate
    for claim, label, cell, a, b, measure in rows: ...      # a Comparison is a named tuple of these six
    rates, table = study.cells_by_rule({cell: its selection configs, ...}, experiment)   # the one rate rule

The rate rule (fedfrozen.studies.selection.RULE) is a parameter of a study as its selection configs: each cell's
configs at each rate of its grid, on the held-out seeds it names (one, or the mean over several).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["SELECTION_SEED", "Study", "Comparison", "key", "judge", "arm_label", "t0", "fedfrozen_vs_fedavg",
           "against_fedavg", "selected_rates", "cells_by_rule"]


SELECTION_SEED = 100  # the rule's held-out seed (notebooks 12, 13, 15; 14 reads it with 101 and 102): no comparison
# evaluates it (seeds 0-14 do)


class Comparison(NamedTuple):
    """Arm `a` minus arm `b` of cell `cell` on `measure`, paired by seed, as a test of `claim` ("C1"..."C4"); `a`
    and `b` are the arms' labels (`arm_label`), `label` the comparison's, generated (`fedfrozen_vs_fedavg`). In a
    study whose per-seed table groups by its own columns (`Study.by`), the cell and the arms are those columns'
    values: a value each, or a tuple of several (`key`)."""

    claim: str
    label: str
    cell: str
    a: str
    b: str
    measure: str = "late_acc"


def key(cell, arm) -> tuple:
    """The row of a study's `mean_std` table (grouped by `Study.by`) that holds `arm` of `cell`: the cell's values,
    then the arm's (each a value, or a tuple of values)."""
    return (*(cell if isinstance(cell, tuple) else (cell,)), *(arm if isinstance(arm, tuple) else (arm,)))


def judge(stats, comparisons, measure: str | None = None) -> "pd.DataFrame":  # noqa: F821 - pandas
    """The verdict table of `comparisons`: each arm a minus arm b of its cell, paired by seed in `stats` (a
    `tables.mean_std` table grouped by the study's `by`) on its own measure (or on `measure` where given), then Holm
    over the table's rows (`tables.verdict_table`)."""
    from .tables import compare, verdict_table

    rows = []
    for c in comparisons:
        m = measure or c.measure
        rows.append((c.claim, c.label, compare(stats, key(c.cell, c.a), key(c.cell, c.b), m), m))
    return verdict_table(rows)


@dataclass(frozen=True)
class Study:
    """One notebook's study, declared: its arms (cells × arms × seeds: one `controls.Arm` per cell, arm and seed,
    its Config whole) and its comparisons (`Comparison`s of two arms of one cell, a minus b paired by seed).
    `cell_of(arm)` is the cell an arm's runs are grouped and compared in (default its `cell`; notebook 15: the cell
    at its budget). `by` names the per-seed table's columns the cell's values and then the arm's are written to
    (default "cell" and "arm"; notebooks 04-06 keep their own: "regime", "alpha", "value_l2"). A study module's
    `study(...)` builds it (recipes, roles, budgets, sweeps)."""

    notebook: str
    arms: tuple
    comparisons: tuple
    cell_of: Callable | None = None
    by: tuple = ("cell", "arm")

    def configs(self) -> list:
        """Every arm's Config, in the arms' order (what `run_many` trains or loads)."""
        return [a.cfg for a in self.arms]

    def runs(self, hists, **summary) -> "pd.DataFrame":  # noqa: F821 - pandas
        """The per-seed table of `hists` (the Histories of `configs()`, in order): every run's settings and measures
        (`tables.summarise`, with `summary`'s arguments: target=...), its cell and its arm (the columns of `by`),
        the columns the comparisons pair on."""
        from .tables import summarise

        hists = list(hists)
        if len(hists) != len(self.arms):
            raise ValueError(f"hists must hold one History per arm ({len(self.arms)}); got {len(hists)}")
        cell_of = self.cell_of or (lambda arm: arm.cell)
        keys = [key(cell_of(a), a.arm) for a in self.arms]
        if any(len(k) != len(self.by) for k in keys):
            raise ValueError(f"each arm's cell and arm must give one value per column of by {self.by}; got "
                             f"{next(k for k in keys if len(k) != len(self.by))}")
        runs = summarise(self.configs(), hists, **summary)
        for j, column in enumerate(self.by):
            runs[column] = [k[j] for k in keys]
        return runs

    def verdicts(self, stats, measure: str | None = None, rows=None) -> "pd.DataFrame":  # noqa: F821 - pandas
        """The verdict table of `rows` (default every comparison of the study), each on its own measure or on
        `measure` where given: paired by seed in `stats` (`tables.mean_std` over `by`), then Holm over the table
        (`judge`)."""
        return judge(stats, self.comparisons if rows is None else rows, measure)


def arm_label(method: str, fraction: float | None, lr: float) -> str:
    """"fedavg @ 0.001", "fedfrozen T0 25% @ 0.003", "freeze_body T0 0% @ 0.003"."""
    t0_words = "" if fraction is None else f" T0 {fraction:.0%}"
    return f"{method}{t0_words} @ {lr:g}"


def t0(rounds: int, fraction: float) -> int:
    """FedFrozen's T0 at `fraction` of `rounds` (rounded to the nearest round): the one rule of every study. FedAvg
    ignores T0, and its runs carry T0 = 25% in their keys."""
    return int(round(fraction * rounds))


def fedfrozen_vs_fedavg(cell: str, fraction: float, lr: float, claim: str | None = None) -> Comparison:
    """FedFrozen at T0 = `fraction` of the rounds against FedAvg of `cell`, both at `lr`: C1's comparison at T0 25%,
    C2's at any other (`claim` says otherwise)."""
    claim = claim or ("C1" if fraction == 0.25 else "C2")
    return Comparison(claim, f"FedFrozen T0 {fraction:.0%} − FedAvg, both at {lr:g}, {cell}", cell,
                      arm_label("fedfrozen", fraction, lr), arm_label("fedavg", None, lr))


def against_fedavg(arms, cell_of=None) -> list[Comparison]:
    """Each FedFrozen arm of `arms` against FedAvg of its cell at the same rate (`fedfrozen_vs_fedavg`), where both
    arms were built: cells in the order the arms first name them, then rates and T0 fractions ascending. `cell_of(arm)`
    is the cell an arm is compared within (default its `cell`; notebook 15 its cell at its budget)."""
    cell_of = cell_of or (lambda arm: arm.cell)
    have = {(cell_of(a), a.arm) for a in arms}
    rows = []
    for cell in dict.fromkeys(cell_of(a) for a in arms):
        mine = [a for a in arms if cell_of(a) == cell]
        for lr in sorted({a.cfg.lr for a in mine}):
            if (cell, arm_label("fedavg", None, lr)) not in have:
                continue
            for fraction in sorted({a.fraction for a in mine if a.fraction is not None and a.cfg.lr == lr}):
                row = fedfrozen_vs_fedavg(cell, fraction, lr)
                if (cell, row.a) in have:
                    rows.append(row)
    return rows


def selected_rates(cfgs, hists) -> dict:
    """{method: rate} by the one rule (selection.pick on late validation accuracy; diverged runs never win). Where
    the selection runs of a rate have several seeds, the rule reads the mean over them (a rate any of whose seeds
    diverged never wins)."""
    from .selection import pick

    val: dict = {}
    for cfg, hist in zip(cfgs, hists):
        val.setdefault(cfg.method, {}).setdefault(cfg.lr, []).append(None if hist.diverged else hist.late("val_acc"))
    mean = {m: {lr: None if None in accs else sum(accs) / len(accs) for lr, accs in v.items()} for m, v in val.items()}
    return {m: pick(v) for m, v in mean.items()}


def cells_by_rule(selection: dict, experiment: str, extra=None):
    """Each cell's rates by the one rule: `selection` ({cell: its selection configs}) trained or loaded in one
    `run_many`, then `selected_rates` per cell. Returns (rates {cell: {method: rate}}, a table of every selection
    run: cell, method, lr, late validation and test accuracy (None where it diverged), and the columns
    `extra(cfg, hist)` adds)."""
    import pandas as pd

    from ..runs.experiments import run_many

    hists = run_many([c for cs in selection.values() for c in cs], experiment=experiment)
    rates, rows, i = {}, [], 0
    for cell, cs in selection.items():
        hs = hists[i:i + len(cs)]
        i += len(cs)
        rates[cell] = selected_rates(cs, hs)
        rows += [dict(cell=cell, method=c.method, lr=c.lr, late_val_acc=None if h.diverged else h.late("val_acc"),
                      late_acc=None if h.diverged else h.late_accuracy, **(extra(c, h) if extra else {}))
                 for c, h in zip(cs, hs)]
    columns = ["cell", "method", "lr", "late_val_acc", "late_acc"]
    return rates, pd.DataFrame(rows, columns=columns + [k for k in (rows[0] if rows else {}) if k not in columns])
