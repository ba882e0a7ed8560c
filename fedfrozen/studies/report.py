"""The report: every verdict of the claim notebooks judged as one family, and what the README, docs/claims.md and
the headline figure show of it, computed from the verdict tables the notebooks write.

    fedfrozen report                    # reads figures/NN_verdicts.csv, writes figures/readme_verdicts.csv,
                                        # figures/headline.{png,pdf}, the verdict block of docs/claims.md and the
                                        # claims block of README.md
    fedfrozen report --profile smoke    # from runs/smoke/figures/ into the same folder (no document is written)

The notebooks write their verdict tables (`ff.tables.verdict_table`: each notebook's table is its own family) when
they run; `family` judges all of them together as the README's family (`ff.tables.adjust`, Holm over every
comparison of 03-06, 13 and 14, each hypothesis once). The rows the documents quote are data (`ROWS`: each a claim,
a regime and the comparisons it quotes, `Quote`): a comparison is named by the verdict table it is read from, its
measure and each arm's values of that table's grouping columns (the notebook's own per-seed columns: cell and arm,
heterogeneity, regime and T0 ...), never by its label. A new row is one more `Row`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import plots
from . import tables as ff_tables
from .controls import arm_label
from .roles import penalty_arm

__all__ = ["NOTEBOOKS", "SOURCES", "FAMILY", "family_words", "Quote", "Row", "ROWS", "DIRECTION", "ACCURACY",
           "verdicts", "family", "lookup", "arm_configs", "verdict_table", "CLAIMS", "claims_table", "figure_rows",
           "figure", "render", "BLOCKS", "write", "main"]

# The README's family, one definition: every comparison of the notebooks its table draws from (03-06: their verdict
# tables, 06's drift family, 03 § 3's controlled cells and its rates; 13: C1 and C2 beyond one recipe), each
# hypothesis once. A hypothesis is the measure and, for each arm, the configs of its runs up to the seed (and what the
# per-seed table measures in them: MEASURE_SELECTORS); a comparison two tables make on the same hypothesis (notebook
# 04's T0 = 25% is 03's FedFrozen − FedAvg; 03 § 3's Dir 0.05 cells re-use 04's α 0.05 runs; 13's AdamW cell is 03's
# Dir 0.1 pair at 15 seeds) counts once, as the row with the most seeds (the first table's, at equal n). Within one
# table every row is its own comparison. FAMILY says it in words under the table.
NOTEBOOKS = ("03", "04", "05", "06", "06_drift", "03_controls", "03_rate_sensitivity", "13", "14", "14_drift")
# the per-seed table and the configs each verdict table follows from (where they are not its own name's)
SOURCES = {"06_drift": ("06_drift", "06"), "03_rate_sensitivity": ("03_controls", "03_controls"),
           "14_drift": ("14_drift", "14")}
# per-seed columns that choose what is measured in a run, not which run (06's drift of each group)
MEASURE_SELECTORS = ("group",)
FAMILY = ("The family: every comparison of the verdict tables {tables} (figures/NN_verdicts.csv), each hypothesis "
          "once (the same measure on arms whose configs agree up to the seed counts once, with its most seeds): {n} "
          "comparisons, Holm at 0.05.")


def family_words(n: int, notebooks=None) -> str:
    """FAMILY for a family of `n` comparisons read from `notebooks` (default NOTEBOOKS): the sentence under the
    verdict table, its tables named as the family reads them."""
    names = list(NOTEBOOKS if notebooks is None else notebooks)
    tables = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return FAMILY.format(tables=tables, n=n)


def _configs(folder, name: str) -> dict:
    """key -> the run's config without its seed and where its data lives (config.WHERE_FIELDS), as JSON, in this
    version's full spelling (Config.from_dict(...).to_dict()): a configs file written before a field was added lacks
    it, and its run (the same key) is still the same hypothesis as a later table's."""
    from ..engine.config import WHERE_FIELDS, Config

    out = {}
    for line in (folder / f"{name}_configs.jsonl").read_text().splitlines():
        row = json.loads(line)
        full = Config.from_dict(row["config"]).to_dict()
        cfg = {k: v for k, v in full.items() if k != "seed" and k not in WHERE_FIELDS}
        out[row["key"]] = json.dumps(cfg, sort_keys=True)
    return out


def _hypothesis(rows: pd.DataFrame, configs: dict) -> str:
    """One arm's hypothesis: the set of its runs' configs up to the seed, with what it measures in them."""
    selectors = [c for c in MEASURE_SELECTORS if c in rows.columns]
    return json.dumps(sorted({(configs[k], *[str(v) for v in sel]) for k, *sel in
                              rows[["key", *selectors]].itertuples(index=False)}))


def verdicts(profile: str) -> pd.DataFrame:
    """The claim notebooks' verdict tables, concatenated in claim order, each row with its hypothesis (`hypothesis`:
    the measure and both arms' configs up to the seed, JSON); a missing table is named."""
    folder = plots.figures_dir(profile)
    frames = []
    for nb in NOTEBOOKS:
        runs_name, configs_name = SOURCES.get(nb, (nb, nb))
        path, runs_path = folder / f"{nb}_verdicts.csv", folder / f"{runs_name}_per_seed.csv"
        configs_path = folder / f"{configs_name}_configs.jsonl"
        for p in (path, runs_path, configs_path):
            if not p.exists():
                raise FileNotFoundError(f"{p} is missing: run notebook {nb[:2]} at the {profile} profile first")
        table, runs = pd.read_csv(path, index_col=0), pd.read_csv(runs_path, index_col=0)
        configs = _configs(folder, configs_name)
        table["hypothesis"] = [json.dumps([v.measure, *[_hypothesis(ff_tables.arm_rows(runs, json.loads(v.by),
                                                                                       json.loads(lab)), configs)
                                                        for lab in (v.a, v.b)]])
                               for v in table.itertuples(index=False)]
        frames.append(table.assign(source=nb))
    return pd.concat(frames, ignore_index=True)


def family(df: pd.DataFrame) -> pd.DataFrame:
    """Every verdict of `verdicts(...)` judged as one family (the README's; FAMILY): each hypothesis once, the
    notebook's own Holm columns replaced by the family's, each row with its 95% interval's ends (`low`, `high`: an
    unresolved row's bound), its Holm-level half-width and `source`, the verdict table it was read from."""
    raw = df.drop(columns=[c for c in ff_tables.ADJUSTED_COLUMNS if c in df.columns]).reset_index(drop=True)
    keep = {}  # hypothesis -> the row that stands for it: most seeds, then the first table's
    for i, row in enumerate(raw.itertuples(index=False)):
        j = keep.get(row.hypothesis)
        if j is not None and raw.at[j, "source"] == row.source:
            keep[(row.hypothesis, i)] = i  # within one table, every row is its own comparison
        elif j is None or row.n > raw.at[j, "n"]:
            keep[row.hypothesis] = i
    raw = raw.loc[sorted(keep.values())].drop(columns=["hypothesis"]).reset_index(drop=True)
    out = ff_tables.adjust(raw)
    out["low"], out["high"] = out["d"] - out["half_width"], out["d"] + out["half_width"]
    out["half_width_holm"] = [ff_tables.adjusted_half_width(*r) for r in
                              zip(out["d"], out["half_width"], out["n"], out["p"], out["p_holm"])]
    return out




@dataclass(frozen=True)
class Quote:
    """One comparison a document quotes, named by its data: `source`, the verdict table it is read from (NOTEBOOKS);
    `a` and `b`, each arm's values of that table's grouping columns ({column: value}, the table's `by`); `measure`;
    and `label`, the few words the document's cell calls it. Never matched by the comparison's label."""

    source: str
    a: dict
    b: dict
    label: str
    measure: str = "late_acc"


def cell(source: str, name: str, a: tuple, b: tuple, label: str, measure: str = "late_acc") -> Quote:
    """A comparison of a study whose per-seed table groups by cell and arm (03 § 3, 13, 14): each arm as (method, T0
    fraction, rate), its label generated by `controls.arm_label` as the study generates it; or a label already
    generated (`roles.penalty_arm`)."""
    def arm(x):
        return {"cell": name, "arm": x if isinstance(x, str) else arm_label(*x)}
    return Quote(source, arm(a), arm(b), label, measure)


def groups(source: str, common: dict, a: dict, b: dict, label: str, measure: str = "late_acc") -> Quote:
    """A comparison of a notebook that groups by its own columns (03-06): the values both arms share, and each
    arm's own."""
    return Quote(source, {**common, **a}, {**common, **b}, label, measure)


@dataclass(frozen=True)
class Row:
    """One row of the verdict table: the paper's claim ("C1 stability and performance", or "C1" continuing it), the
    regime in words, and the comparisons it quotes (the first decides the words; `_words`)."""

    claim: str
    regime: str
    quotes: list = field(default_factory=list)

    @property
    def code(self) -> str:
        return self.claim.split()[0]


def _avg(lr):
    return ("fedavg", None, lr)


def _ff(fraction, lr):
    return ("fedfrozen", fraction, lr)


def _h03(spec, a, b, label, measure="late_acc"):
    return groups("03", {"heterogeneity": spec}, {"arm": a}, {"arm": b}, label, measure)


def _t0(regime, alpha, fraction, label):  # notebook 04: T0 as a fraction of the rounds, 1.0 = FedAvg
    return groups("04", {"regime": regime, "alpha": alpha}, {"T0_fraction": fraction}, {"T0_fraction": 1.0}, label)


def _l2(regime, lam, label, measure="late_acc"):  # notebook 05: the value penalty λ against λ = 0
    return groups("05", {"regime": regime, "alpha": 0.1}, {"value_l2": lam}, {"value_l2": 0.0}, label, measure)


def _drift06(regime, group, label):
    return groups("06_drift", {"regime": regime}, {"group": group}, {"group": "qk"}, label, "drift")


def _drift14(start, lr, group, label):
    return groups("14_drift", {"cell": start, "lr": lr}, {"group": group}, {"group": "qk"}, label, "drift")


def _freeze(regime, method, label):
    return groups("06", {"regime": regime}, {"method": method}, {"method": "fedavg"}, label)


def _c3_text(start, lr, label, measure):
    return cell("14", start, penalty_arm(lr), _ff(0.25, lr), label, measure)


ADAMW_RATE, SGD_RATE, TEXT_RATES = 3e-3, 0.3, {"scratch": 3e-3, "pretrained": 1e-3}
D01 = "dirichlet:0.1"
# The rows of the verdict table (docs/claims.md) and, by claim, of the README's; a claim is reproduced in a row when
# its first comparison holds in the claim's direction after Holm (C3: V's dispersion cut within the accuracy margin)
ROWS = [
    Row("C1 stability and performance", "base, IID", [_h03("iid", "fedfrozen", "fedavg", "accuracy")]),
    Row("C1", "base, Dir 0.5", [_h03("dirichlet:0.5", "fedfrozen", "fedavg", "accuracy")]),
    Row("C1", "base, Dir 0.1", [cell("13", "adamw", _ff(0.25, ADAMW_RATE), _avg(ADAMW_RATE), "accuracy"),
                                _h03(D01, "fedfrozen", "fedavg", "oscillation", "oscillation")]),
    Row("C1", "pretrained, Dir 0.1", [_h03(D01, "fedfrozen [pretrained]", "fedavg [pretrained]", "one body"),
                                      cell("03_controls", "bodies, Dir 0.1", _ff(0.25, 3e-3), _avg(3e-3),
                                           "a body per seed")]),
    Row("C1", "pretrained (supervised task), Dir 0.1", [cell("03_controls", "classes, Dir 0.1", _ff(0.25, 3e-3),
                                                             _avg(3e-3), "accuracy")]),
    Row("C1", "constant rate, Dir 0.1, both arms at one rate", [
        cell("03_controls", "constant, Dir 0.1", _ff(0.25, 1e-3), _avg(1e-3), "1e-3"),
        cell("03_controls", "constant, Dir 0.1", _ff(0.25, 3e-3), _avg(3e-3), "3e-3"),
        cell("03_controls", "constant, Dir 0.1", _ff(0.25, 3e-3), _avg(3e-3), "oscillation, 3e-3", "oscillation")]),
    Row("C1", "pretrained + constant, Dir 0.1", [
        _h03(D01, "fedfrozen [constant_pretrained]", "fedavg [constant_pretrained]", "accuracy"),
        _h03(D01, "fedfrozen [constant_pretrained]", "fedavg [constant_pretrained]", "oscillation", "oscillation")]),
    Row("C1", "five local epochs, Dir 0.1", [
        cell("03_controls", "local5, Dir 0.1", _ff(0.25, 3e-3), _avg(3e-3), "scratch"),
        _h03(D01, "fedfrozen [local5_pretrained]", "fedavg [local5_pretrained]", "pretrained")]),
    Row("C1", "plain local SGD (5 epochs, 240 rounds), Dir 0.1", [
        cell("13", "sgd", _ff(0.25, SGD_RATE), _avg(SGD_RATE), "accuracy")]),
    Row("C1", "feature shift, IID labels", [
        cell("13", "rotation", _ff(0.25, ADAMW_RATE), _avg(ADAMW_RATE), "rotation"),
        cell("13", "patch_permutation", _ff(0.25, ADAMW_RATE), _avg(ADAMW_RATE), "patch order")]),
    Row("C1", "49 tokens, Dir 0.1", [cell("13", "p4_w48", _ff(0.25, ADAMW_RATE), _avg(ADAMW_RATE), "width 48"),
                                     cell("13", "p4", _ff(0.25, ADAMW_RATE), _avg(ADAMW_RATE), "width 64")]),
    *[Row("C1", f"text: Shakespeare roles, {start}", [
        cell("14", start, _ff(0.25, lr), _avg(lr), "accuracy", "final_sample_acc")])
      for start, lr in TEXT_RATES.items()],
    Row("C1 against the baselines", "base, Dir 0.1, AdamW", [_h03(D01, "fedfrozen", "fedprox", "− FedProx"),
                                                             _h03(D01, "fedfrozen", "scaffold", "− SCAFFOLD")]),
    Row("C2 best T0 shrinks with heterogeneity", "base", [_t0("scratch", 0.1, 0.5, "T0 50%, α 0.1"),
                                                          _t0("scratch", 0.5, 0.5, "T0 50%, α 0.5")]),
    Row("C2", "pretrained", [_t0("pretrained", 0.1, 0.0, "T0 0, α 0.1"),
                             cell("03_controls", "bodies, Dir 0.1", _ff(0.0, 3e-3), _avg(3e-3),
                                  "T0 0, a body per seed"),
                             _t0("pretrained", 0.1, 0.5, "T0 50%, α 0.1"),
                             _t0("pretrained", 0.5, 0.0, "T0 0, α 0.5")]),
    Row("C2", "feature shift, IID labels", [
        cell("13", shift, _ff(f, ADAMW_RATE), _avg(ADAMW_RATE), f"T0 {'0' if f == 0 else '50%'}, {words}")
        for shift, words in (("rotation", "rotation"), ("patch_permutation", "patch order")) for f in (0.0, 0.5)]),
    Row("C2", "plain local SGD; 49 tokens, Dir 0.1", [
        cell("13", "sgd", _ff(0.5, SGD_RATE), _avg(SGD_RATE), "T0 50%, SGD"),
        cell("13", "p4", _ff(0.0, ADAMW_RATE), _avg(ADAMW_RATE), "T0 0, 49 tokens at width 64"),
        cell("13", "p4", _ff(0.5, ADAMW_RATE), _avg(ADAMW_RATE), "T0 50%, 49 tokens at width 64")]),
    Row("C2", "text: Shakespeare roles", [
        cell("14", start, _ff(f, lr), _avg(lr), f"T0 {'0' if f == 0 else '50%'}, {start}", "final_sample_acc")
        for start, lr in TEXT_RATES.items() for f in (0.0, 0.5)]),
    Row("C2", "constant rate, both arms at one rate", [
        cell("03_controls", "constant, Dir 0.1", _ff(0.5, 3e-3), _avg(3e-3), "T0 50%, 3e-3, α 0.1"),
        cell("03_controls", "constant, Dir 0.1", _ff(0.5, 1e-3), _avg(1e-3), "T0 50%, 1e-3, α 0.1"),
        cell("03_controls", "constant, Dir 0.05", _ff(0.5, 3e-3), _avg(3e-3), "T0 50%, 3e-3, α 0.05")]),
    Row("C3 value L2 cuts drift, costs little", "base, Dir 0.1", [
        _l2("scratch", 0.01, "dispersion, λ 0.01", "disp_v"), _l2("scratch", 0.01, "accuracy, λ 0.01"),
        _l2("scratch", 0.1, "accuracy, λ 0.1")]),
    Row("C3", "pretrained, Dir 0.1", [_l2("pretrained", 0.01, "dispersion, λ 0.01", "disp_v"),
                                      _l2("pretrained", 0.01, "accuracy, λ 0.01")]),
    Row("C3", "constant rate, Dir 0.1", [_l2("constant", 0.01, "dispersion, λ 0.01", "disp_v"),
                                         _l2("constant", 0.1, "dispersion, λ 0.1", "disp_v"),
                                         _l2("constant", 0.01, "accuracy, λ 0.01")]),
    *[Row("C3", f"text: Shakespeare roles, {start}", [
        _c3_text(start, lr, f"dispersion, λ 0.01 at {lr:.0e}".replace("e-0", "e-"), "disp_v"),
        _c3_text(start, lr, f"accuracy, {lr:.0e}".replace("e-0", "e-"), "final_sample_acc")])
      for start, lr in TEXT_RATES.items()],
    Row("C4 subcomponents respond differently", "base, Dir 0.1", [_drift06("scratch", "v", "drift V − Q/K"),
                                                                  _drift06("scratch", "attn_out", "output − Q/K")]),
    Row("C4", "pretrained, Dir 0.1", [_drift06("pretrained", "v", "drift V − Q/K"),
                                      _drift06("pretrained", "attn_out", "output − Q/K")]),
    Row("C4", "text: Shakespeare roles", [
        _drift14(start, lr, group, f"{words} − Q/K, {start}") for start, lr in TEXT_RATES.items()
        for group, words in (("v", "V"), ("embed", "embeddings"))]),
    Row("C4 freezing each group", "base, Dir 0.1", [_freeze("scratch", "freeze_v", "freeze V"),
                                                    _freeze("scratch", "freeze_attn", "all attention")]),
    Row("C4 freezing each group", "pretrained, Dir 0.1", [_freeze("pretrained", "freeze_v", "freeze V"),
                                                          _freeze("pretrained", "freeze_attn", "all attention")]),
]

# the direction in which each claim's rows would reproduce it (C3: V's dispersion lower; its accuracy rows bound the
# cost)
DIRECTION = {"C1": "higher", "C2": "higher", "C3": "lower", "C4": None}
# the measures in accuracy units (points), each claim's primary (docs/claims.md, "The measures"): late accuracy on
# images, the final 50,000-window accuracy on text; C3's cut is read on V's dispersion
ACCURACY = ("late_acc", "final_sample_acc")
C3_CUT = "disp_v"
C3_MARGIN = 1.0  # points: C3's "without severely sacrificing accuracy" (docs/claims.md)


def _cell(row) -> str:
    """d ± half (n): the family's verdict, at the row's own scale: at least 3 decimals, and enough to show the first
    significant digit of its half-width (an oscillation row is not printed as ± 0.000)."""
    after = row.verdict_holm if row.verdict_holm in ("higher", "lower") else (
        f"{row.verdict} alone" if row.verdict in ("higher", "lower") else "not resolved")
    k = ff_tables.decimals(row.half_width)
    return f"d = {row.d:+.{k}f} ± {row.half_width:.{k}f} ({int(row.n)}): {after}".replace("-", "−")


def _words(claim: str, rows, labels) -> str:
    """The verdict in a few words, from the first row: reproduced (it holds after Holm in the claim's direction) or
    not, and what its interval allows. C4's drift rows are reproduced when a group's drift differs from Q/K's either
    way; its freezing rows say what freezing costs."""
    direction = DIRECTION[claim.split()[0]]
    main = rows[0]
    if main.measure == "drift":  # C4: an attention group's drift against Q/K's, either way
        held = [r for r in rows if r.verdict_holm in ("higher", "lower")]
        alone = [r for r in rows if r.verdict in ("higher", "lower")]
        if held:
            return f"**reproduced**: {len(held)} of {len(rows)} resolved after Holm"
        return ("**not reproduced**: " + (f"{len(alone)} of {len(rows)} resolved alone, none after Holm" if alone else
                                          "no group's drift resolved from Q/K's"))
    if direction is None:
        costs = sum(r.verdict_holm == "lower" for r in rows)
        return f"freezing costs: {costs} of {len(rows)} lower after Holm, none higher"
    if claim.startswith("C3"):  # both halves: drift cut after Holm, and an accuracy cost within the margin
        drift = [(r, label) for r, label in zip(rows, labels) if r.measure == C3_CUT]
        cut = [label for r, label in drift if r.verdict_holm == "lower"]
        costs = [(-100 * r.low, label) for r, label in zip(rows, labels) if r.measure in ACCURACY]
        if cut:  # the labels say the setting ("dispersion, λ 0.01 at 1e-3"): quoted whole, less the measure
            cost, label = max(costs)
            where = " and ".join(c.removeprefix("dispersion, ") for c in cut)
            others = [f"{label.removeprefix('dispersion, ')}: {_outcome(r, direction)}" for r, label in drift
                      if label not in cut]
            where += f" ({'; '.join(others)})" if others else ""
            if cost <= C3_MARGIN:
                return f"**reproduced**: V's dispersion cut after Holm, {where}"
            return (f"**not reproduced**: V's dispersion cut after Holm, {where}, but "
                    f"{label.removeprefix('accuracy, ')} costs up to {cost:.2f} points (margin {C3_MARGIN:g})")
    head = "**reproduced**" if main.verdict_holm == direction else "**not reproduced**"
    said = _outcome(main, direction)
    # the row's other comparisons of the same measure, where they say something else (each with its own bound)
    others = [f"{label}: {_outcome(r, direction)}" for r, label in zip(rows[1:], labels[1:])
              if r.measure == main.measure and (_outcome(r, direction) != said or said.startswith("no "))]
    if others:
        return f"{head}: {labels[0]}: {said}; " + "; ".join(others)
    return f"{head}: {said}" if main.verdict_holm != direction else head


def _outcome(r, direction: str) -> str:
    """One comparison's verdict in words: lower/higher after Holm, alone, or the bound its interval leaves open in
    the claim's direction (points for accuracy, percent of the reference arm's mean for V's dispersion, whose scale
    is a rate's, drift units for drift) with what it could detect."""
    if r.verdict_holm in ("higher", "lower"):
        return r.verdict_holm
    if r.verdict in ("higher", "lower"):
        return f"{r.verdict} alone, not after Holm"
    if r.measure == C3_CUT:
        bound, scale = -r.low if direction == "lower" else r.high, 100 / abs(r.mean_b)
        return f"no cut above {scale * bound:.1f}% (detects {scale * r.detectable:.1f}%)"
    scale, unit = (100, " points") if r.measure in ACCURACY else (1, "")
    bound = r.high if direction == "higher" else -r.low
    return (f"no {'gain' if direction == 'higher' else 'cut'} above {scale * bound:.2f}{unit} "
            f"(detects {scale * r.detectable:.2f})")


def lookup(df: pd.DataFrame, quote: Quote):
    """The family's row of `quote` (a row of `family(...)`): the one read from `quote.source` on `quote.measure`
    whose arms' grouping values are `quote.a` and `quote.b`. A KeyError names the quote where none or several
    match."""
    found = [r for r in df.itertuples(index=False) if str(r.source) == quote.source and r.measure == quote.measure
             and dict(zip(json.loads(r.by), json.loads(r.a))) == quote.a
             and dict(zip(json.loads(r.by), json.loads(r.b))) == quote.b]
    if len(found) != 1:
        raise KeyError(f"{len(found)} rows of the family match {quote} (one expected): is its notebook's table "
                       f"current, and did its row stand for the hypothesis (the one with the most seeds)?")
    return found[0]


def arm_configs(quote: Quote, side: str = "b", profile: str = "cpu") -> list:
    """The Configs of the runs behind one arm of `quote` (`side` "a" or "b"), one per seed: the rows of its
    notebook's per-seed table whose grouping values are that arm's, their configs from its NN_configs.jsonl. A
    table that is missing is named."""
    from ..engine.config import Config

    if side not in ("a", "b"):
        raise ValueError(f"side must be 'a' or 'b'; got {side!r}")
    folder = plots.figures_dir(profile)
    runs_name, configs_name = SOURCES.get(quote.source, (quote.source, quote.source))
    runs_path, configs_path = folder / f"{runs_name}_per_seed.csv", folder / f"{configs_name}_configs.jsonl"
    for path in (runs_path, configs_path):
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: run notebook {quote.source[:2]} at the {profile} profile "
                                    f"first")
    runs = pd.read_csv(runs_path, index_col=0)
    values = getattr(quote, side)
    chosen = ff_tables.arm_rows(runs, list(values), list(values.values()))
    configs = {}
    for line in configs_path.read_text().splitlines():
        row = json.loads(line)
        configs[row["key"]] = row["config"]
    keys = list(dict.fromkeys(chosen["key"]))
    return [Config.from_dict(configs[k]) for k in keys]


def _claim_rows(df: pd.DataFrame, rows=None):
    """(Row, its family rows) for every Row of `rows` (default ROWS)."""
    return [(row, [lookup(df, q) for q in row.quotes]) for row in (ROWS if rows is None else rows)]


def verdict_table(df: pd.DataFrame, rows=None) -> str:
    """The verdict table (docs/claims.md): one line per Row of `rows` (default ROWS), its words and every comparison
    it quotes, with FAMILY under it."""
    lines = ["| claim | regime | verdict | d ± 95% (n): after Holm over the family |", "|---|---|---|---|"]
    for row, found in _claim_rows(df, rows):
        labels = [q.label for q in row.quotes]
        cells = "; ".join(f"{label} {_cell(r)}" for r, label in zip(found, labels))
        lines.append(f"| {row.claim} | {row.regime} | {_words(row.claim, found, labels)} | {cells} |")
    return "\n".join(lines) + "\n\n" + family_words(len(df))


# the claims as the paper states them, in a few words (docs/claims.md, "The measures", has them whole)
CLAIMS = {"C1": "two-stage training improves stability and performance under heterogeneity",
          "C2": "the best warm-up T0 shrinks as heterogeneity grows",
          "C3": "a moderate L2 penalty on V reduces drift without severely sacrificing accuracy",
          "C4": "attention subcomponents respond differently to client drift"}
TABLE_LINK = "docs/claims.md#the-verdicts-row-by-row"


def claims_table(df: pd.DataFrame, rows=None) -> str:
    """The README's table: one line per claim, how many of its regimes reproduce it (a Row's words, `_words`),
    where, and how many resolve the other way after Holm (the row's first comparison), with the link to its rows."""
    by_code: dict = {}
    for row, found in _claim_rows(df, rows):
        by_code.setdefault(row.code, []).append((row, found, _words(row.claim, found, [q.label for q in row.quotes])))
    lines = ["| claim (the paper's words, shortened) | regimes | reproduced in | resolved the other way after Holm |",
             "|---|---|---|---|"]
    for code, rows in by_code.items():
        tested = [(row, found, words) for row, found, words in rows if not words.startswith("freezing costs")]
        held = [row.regime for row, _, words in tested if words.startswith("**reproduced**")]
        direction = DIRECTION[code]
        against = sum(1 for _, found, _ in tested if direction and found[0].verdict_holm not in (direction, "")
                      and found[0].verdict_holm in ("higher", "lower"))
        where = f"{len(held)}: {'; '.join(held)}" if held else "none"
        other = f"{against} of {len(tested)}" if direction else "n/a (either way reproduces it)"
        lines.append(f"| **{code}** {CLAIMS[code]} | [{len(tested)}]({TABLE_LINK}) | {where} | {other} |")
    return "\n".join(lines)


# the blocks the report writes: document -> (start marker, end marker, the function that renders it)
BLOCKS = {
    "docs/claims.md": ("<!-- verdicts: rendered by `fedfrozen report` from figures/readme_verdicts.csv -->",
                       "<!-- verdicts: end -->", verdict_table),
    "README.md": ("<!-- claims: rendered by `fedfrozen report` from figures/readme_verdicts.csv -->",
                  "<!-- claims: end -->", claims_table),
}


def render(text: str, df: pd.DataFrame, document: str) -> str:
    """`text` (the document named `document`, a key of BLOCKS) with its block replaced by the one rendered from
    `df` (the family)."""
    start, end, make = BLOCKS[document]
    if start not in text or end not in text:
        raise ValueError(f"{document} has no block to render: it needs the lines {start!r} and {end!r}")
    i, j = text.index(start) + len(start), text.index(end)
    return text[:i] + "\n" + make(df) + "\n" + text[j:]


SHORTER = ((", both arms at one rate", ", one rate"), ("pretrained (supervised task)", "pretrained (supervised)"),
           ("pretrained + constant", "pretrained + const."), ("constant rate", "constant"),
           ("five local epochs", "5 local epochs"), ("base, Dir 0.1, AdamW", "base, Dir 0.1"))


def figure_rows(df: pd.DataFrame, rows=None) -> pd.DataFrame:
    """One row per Row that quotes an accuracy comparison: its first one, with a short label (claim, regime, the
    quoted label) and the claim's code. C4's drift rows (drift units, not points) have none."""
    out = []
    for row, found in _claim_rows(df, rows):
        first = next(((r, q.label) for r, q in zip(found, row.quotes) if r.measure in ACCURACY), None)
        if first is None:
            continue
        regime = row.regime
        for long, short in SHORTER:
            regime = regime.replace(long, short)
        r, label = first
        said = f"FedFrozen {label}" if label.startswith("−") else label  # against a baseline
        label = f"{row.code} {regime}: {said}" if len(row.quotes) > 1 else f"{row.code} {regime}"
        out.append(dict(label=label, claim=row.code, d=r.d, half_width_holm=r.half_width_holm,
                        held=r.verdict_holm in ("higher", "lower")))
    return pd.DataFrame(out)


def figure(df: pd.DataFrame, profile: str = "cpu"):
    """The headline figure: one marker per Row that quotes an accuracy comparison (`figure_rows`), d in percentage
    points with its interval at the comparison's Holm level (filled where it holds), the claim as colour. The label
    column is fixed at 40% of the width, so the plot keeps the rest whatever the labels."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows = figure_rows(df)
    width, height = 9.0, 0.28 * len(rows) + 1.9
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes([0.40, 1.05 / height, 0.57, 1 - 1.75 / height])
    y = np.arange(len(rows))[::-1]
    d, hw = 100 * rows["d"].to_numpy(float), 100 * rows["half_width_holm"].to_numpy(float)
    for code, colour in plots.CLAIM_COLOURS.items():
        sel = (rows["claim"] == code).to_numpy()
        ax.errorbar(d[sel], y[sel], xerr=hw[sel], fmt="none", ecolor=colour, capsize=2, lw=1.2)
        for held in (True, False):
            pick = sel & (rows["held"].to_numpy() == held)
            ax.scatter(d[pick], y[pick], s=30, zorder=3, edgecolors=colour, facecolors=colour if held else "white")
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(y, rows["label"], fontsize=8)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.grid(axis="x", color="0.9", lw=0.6)
    ax.set_xlabel("the row's arm − its reference (FedAvg unless named; C3: λ = 0), percentage points\n"
                  "late test accuracy (text: the last round's, on 50,000 windows)", fontsize=8)
    handles = [Line2D([], [], marker="o", ls="", color=c, label=k) for k, c in plots.CLAIM_COLOURS.items()]
    handles.append(Line2D([], [], marker="o", ls="", color="gray", markerfacecolor="white", label="not after Holm"))
    ax.legend(handles=handles, fontsize=7, loc="lower left", ncol=5, frameon=False, bbox_to_anchor=(0, 1.0))
    fig.text(0.01, 1 - 0.25 / height, f"The verdict table's rows, {profile} profile: the first accuracy comparison of "
             f"each, interval at its Holm level over the family of {len(df)} (C4's drift rows: the table)",
             fontsize=8.5)
    return fig


def main(argv=None) -> None:
    """`fedfrozen report`: the family, its figure and (at the cpu profile) the documents' blocks."""
    parser = argparse.ArgumentParser(prog="fedfrozen report", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu", choices=["smoke", "cpu", "paper"])
    args = parser.parse_args(argv)
    write(args.profile)


def write(profile: str = "cpu") -> pd.DataFrame:
    """Judge the family from `profile`'s verdict tables and write readme_verdicts.csv, the headline figure and, at
    the cpu profile (whose outputs are committed), the blocks of BLOCKS' documents. Returns the family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = family(verdicts(profile))
    texts = {}
    if profile == "cpu":  # render every block before writing anything: a missing row stops it with nothing written
        root = plots.project_root()
        texts = {doc: render((root / doc).read_text(), df, doc) for doc in BLOCKS}
    print("wrote", plots.save_table(df, "readme_verdicts", profile))
    print(family_words(len(df)))
    fig = figure(df, profile)
    for path in plots.save_figure(fig, "headline", profile):
        print("wrote", path)
    plt.close(fig)
    for doc, text in texts.items():
        (plots.project_root() / doc).write_text(text)
        print("wrote the block of", doc)
    return df
