"""The headline figure: every verdict of the claim notebooks (03-06, 13, 14) in one forest plot, judged as one family.

    python tools/headline.py            # reads figures/{03-06,13,14}_verdicts.csv, writes figures/headline.{png,pdf}
                                        # and figures/readme_verdicts.csv
    python tools/headline.py --profile smoke   # from runs/smoke/figures/ into the same folder

It also renders the README's verdict table (between README_START and README_END) from the family, so that every
number the README's table quotes is its row's (tests/test_readme.py renders it again and compares).

The notebooks write the verdict tables (`ff.tables.verdict_table`: each notebook's table is its own family) when
they run; this draws them and judges all of them together as the README's family (`ff.tables.adjust`, Holm over
every comparison of 03-06 and 13: the README quotes from this family), so the figure and readme_verdicts.csv are current
whenever the notebooks' outputs are. The README and the book's front page show it.
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from fedfrozen import plots  # noqa: E402
from fedfrozen import tables as ff_tables  # noqa: E402

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
FAMILY = ("The family: every comparison of notebooks 03–06, 13 and 14 (their verdict tables, 06's and 14's drift of "
          "each group against Q/K's, 03 § 3's controlled cells and its rates), each hypothesis once (the same "
          "measure on arms whose configs agree up to the seed counts once, with its most seeds): {n} comparisons, "
          "Holm at 0.05.")


def _configs(folder, name: str) -> dict:
    """key -> the run's config without its seed and where its data lives (config.WHERE_FIELDS), as JSON, in this
    version's full spelling (Config.from_dict(...).to_dict()): a configs file written before a field was added lacks
    it, and its run (the same key) is still the same hypothesis as a later table's."""
    from fedfrozen.engine.config import WHERE_FIELDS, Config

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


def readme_family(df: pd.DataFrame) -> pd.DataFrame:
    """Every verdict of 03-06 judged as one family (the README's; FAMILY): each hypothesis once, the notebook's own
    Holm columns replaced by the family's, and each row with its 95% interval's ends (`low`, `high`: an unresolved
    row's bound)."""
    raw = df.drop(columns=[c for c in ff_tables.ADJUSTED_COLUMNS if c in df.columns]).reset_index(drop=True)
    keep = {}  # hypothesis -> the row that stands for it: most seeds, then the first table's
    for i, row in enumerate(raw.itertuples(index=False)):
        j = keep.get(row.hypothesis)
        if j is not None and raw.at[j, "source"] == row.source:
            keep[(row.hypothesis, i)] = i  # within one table, every row is its own comparison
        elif j is None or row.n > raw.at[j, "n"]:
            keep[row.hypothesis] = i
    raw = raw.loc[sorted(keep.values())].drop(columns=["hypothesis", "source"]).reset_index(drop=True)
    out = ff_tables.adjust(raw)
    out["low"], out["high"] = out["d"] - out["half_width"], out["d"] + out["half_width"]
    out["half_width_holm"] = [ff_tables.adjusted_half_width(*r) for r in
                              zip(out["d"], out["half_width"], out["n"], out["p"], out["p_holm"])]
    return out


README_START = "<!-- verdicts: rendered by tools/headline.py from figures/readme_verdicts.csv -->"
README_END = "<!-- verdicts: end -->"
# The README's rows: (claim, regime, the comparisons it quotes, in figures/readme_verdicts.csv); the paper's claim
# is reproduced in a row when one of its comparisons holds in the claim's direction after Holm.
README_ROWS = [
    ("C1 stability and performance", "base, IID", [("FedFrozen − FedAvg, iid", "accuracy")]),
    ("C1", "base, Dir 0.5", [("FedFrozen − FedAvg, dirichlet:0.5", "accuracy")]),
    ("C1", "base, Dir 0.1", [("FedFrozen T0 25% − FedAvg, both at 0.003, adamw", "accuracy"),  # 03's, at 15 seeds
                             ("FedFrozen − FedAvg, dirichlet:0.1: oscillation", "oscillation")]),
    ("C1", "pretrained, Dir 0.1", [("FedFrozen − FedAvg, dirichlet:0.1, pretrained", "one body"),
                                   ("FedFrozen T0 25% − FedAvg, bodies, Dir 0.1", "a body per seed")]),
    ("C1", "pretrained (supervised task), Dir 0.1", [("FedFrozen T0 25% − FedAvg, classes, Dir 0.1", "accuracy")]),
    ("C1", "constant rate, Dir 0.1, both arms at one rate", [
        ("FedFrozen T0 25% − FedAvg, both at 0.001, constant, Dir 0.1", "1e-3"),
        ("FedFrozen T0 25% − FedAvg, both at 0.003, constant, Dir 0.1", "3e-3"),
        ("FedFrozen T0 25% − FedAvg, both at 0.003, constant, Dir 0.1: oscillation", "oscillation, 3e-3")]),
    ("C1", "pretrained + constant, Dir 0.1", [
        ("FedFrozen − FedAvg, dirichlet:0.1, constant_pretrained", "accuracy"),
        ("FedFrozen − FedAvg, dirichlet:0.1, constant_pretrained: oscillation", "oscillation")]),
    ("C1", "five local epochs, Dir 0.1", [("FedFrozen T0 25% − FedAvg, local5, Dir 0.1", "scratch"),
                                          ("FedFrozen − FedAvg, dirichlet:0.1, local5_pretrained", "pretrained")]),
    ("C1", "plain local SGD (5 epochs, 240 rounds), Dir 0.1", [
        ("FedFrozen T0 25% − FedAvg, both at 0.3, sgd", "accuracy")]),
    ("C1", "feature shift, IID labels", [
        ("FedFrozen T0 25% − FedAvg, both at 0.003, rotation", "rotation"),
        ("FedFrozen T0 25% − FedAvg, both at 0.003, patch_permutation", "patch order")]),
    ("C1", "49 tokens, Dir 0.1", [("FedFrozen T0 25% − FedAvg, both at 0.003, p4_w48", "width 48"),
                                  ("FedFrozen T0 25% − FedAvg, both at 0.003, p4", "width 64")]),
    ("C1", "text: Shakespeare roles, scratch", [
        ("FedFrozen T0 25% − FedAvg, both at 0.003, scratch", "accuracy")]),
    ("C1", "text: Shakespeare roles, pretrained", [
        ("FedFrozen T0 25% − FedAvg, both at 0.001, pretrained", "accuracy")]),
    ("C1 against the baselines", "base, Dir 0.1, AdamW", [
        ("FedFrozen − FedProx (AdamW), dirichlet:0.1", "− FedProx"),
        ("FedFrozen − SCAFFOLD (AdamW, option I), dirichlet:0.1", "− SCAFFOLD")]),
    ("C2 best T0 shrinks with heterogeneity", "base", [("T0 = 50% of T − FedAvg, α=0.1", "T0 50%, α 0.1"),
                                                       ("T0 = 50% of T − FedAvg, α=0.5", "T0 50%, α 0.5")]),
    ("C2", "pretrained", [("T0 = 0% of T − FedAvg, α=0.1, pretrained", "T0 0, α 0.1"),
                          ("FedFrozen T0 0% − FedAvg, bodies, Dir 0.1", "T0 0, a body per seed"),
                          ("T0 = 50% of T − FedAvg, α=0.1, pretrained", "T0 50%, α 0.1"),
                          ("T0 = 0% of T − FedAvg, α=0.5, pretrained", "T0 0, α 0.5")]),
    ("C2", "feature shift, IID labels", [
        ("FedFrozen T0 0% − FedAvg, both at 0.003, rotation", "T0 0, rotation"),
        ("FedFrozen T0 50% − FedAvg, both at 0.003, rotation", "T0 50%, rotation"),
        ("FedFrozen T0 0% − FedAvg, both at 0.003, patch_permutation", "T0 0, patch order"),
        ("FedFrozen T0 50% − FedAvg, both at 0.003, patch_permutation", "T0 50%, patch order")]),
    ("C2", "plain local SGD; 49 tokens, Dir 0.1", [
        ("FedFrozen T0 50% − FedAvg, both at 0.3, sgd", "T0 50%, SGD"),
        ("FedFrozen T0 0% − FedAvg, both at 0.003, p4", "T0 0, 49 tokens at width 64"),
        ("FedFrozen T0 50% − FedAvg, both at 0.003, p4", "T0 50%, 49 tokens at width 64")]),
    ("C2", "text: Shakespeare roles", [
        ("FedFrozen T0 0% − FedAvg, both at 0.003, scratch", "T0 0, scratch"),
        ("FedFrozen T0 50% − FedAvg, both at 0.003, scratch", "T0 50%, scratch"),
        ("FedFrozen T0 0% − FedAvg, both at 0.001, pretrained", "T0 0, pretrained"),
        ("FedFrozen T0 50% − FedAvg, both at 0.001, pretrained", "T0 50%, pretrained")]),
    ("C2", "constant rate, both arms at one rate", [
        ("FedFrozen T0 50% − FedAvg, both at 0.003, constant, Dir 0.1", "T0 50%, 3e-3, α 0.1"),
        ("FedFrozen T0 50% − FedAvg, both at 0.001, constant, Dir 0.1", "T0 50%, 1e-3, α 0.1"),
        ("FedFrozen T0 50% − FedAvg, both at 0.003, constant, Dir 0.05", "T0 50%, 3e-3, α 0.05")]),
    ("C3 value L2 cuts drift, costs little", "base, Dir 0.1", [
        ("value L2 λ=0.01 − λ=0, α=0.1: value dispersion", "dispersion, λ 0.01"),
        ("value L2 λ=0.01 − λ=0, α=0.1", "accuracy, λ 0.01"), ("value L2 λ=0.1 − λ=0, α=0.1", "accuracy, λ 0.1")]),
    ("C3", "pretrained, Dir 0.1", [("value L2 λ=0.01 − λ=0, α=0.1, pretrained: value dispersion",
                                    "dispersion, λ 0.01"),
                                   ("value L2 λ=0.01 − λ=0, α=0.1, pretrained", "accuracy, λ 0.01")]),
    ("C3", "constant rate, Dir 0.1", [("value L2 λ=0.01 − λ=0, α=0.1, constant: value dispersion",
                                       "dispersion, λ 0.01"),
                                      ("value L2 λ=0.1 − λ=0, α=0.1, constant: value dispersion", "dispersion, λ 0.1"),
                                      ("value L2 λ=0.01 − λ=0, α=0.1, constant", "accuracy, λ 0.01")]),
    ("C3", "text: Shakespeare roles, scratch", [
        ("FedFrozen T0 25% with V L2 0.01 − without, at 0.003, scratch: value dispersion",
         "dispersion, λ 0.01 at 3e-3"),
        ("FedFrozen T0 25% with V L2 0.01 − without, at 0.003, scratch", "accuracy, 3e-3")]),
    ("C3", "text: Shakespeare roles, pretrained", [
        ("FedFrozen T0 25% with V L2 0.01 − without, at 0.001, pretrained: value dispersion",
         "dispersion, λ 0.01 at 1e-3"),
        ("FedFrozen T0 25% with V L2 0.01 − without, at 0.001, pretrained", "accuracy, 1e-3")]),
    ("C4 subcomponents respond differently", "base, Dir 0.1", [("v drift − Q/K drift, FedAvg", "drift V − Q/K"),
                                                               ("attn_out drift − Q/K drift, FedAvg", "output − Q/K")]),
    ("C4", "pretrained, Dir 0.1", [("v drift − Q/K drift, FedAvg, pretrained", "drift V − Q/K"),
                                   ("attn_out drift − Q/K drift, FedAvg, pretrained", "output − Q/K")]),
    ("C4", "text: Shakespeare roles", [
        ("v drift − Q/K drift, FedAvg at 0.003, scratch", "V − Q/K, scratch"),
        ("embed drift − Q/K drift, FedAvg at 0.003, scratch", "embeddings − Q/K, scratch"),
        ("v drift − Q/K drift, FedAvg at 0.001, pretrained", "V − Q/K, pretrained"),
        ("embed drift − Q/K drift, FedAvg at 0.001, pretrained", "embeddings − Q/K, pretrained")]),
    ("C4 freezing each group", "base, Dir 0.1", [("freeze V − FedAvg", "freeze V"),
                                                 ("freeze all attention − FedAvg", "all attention")]),
    ("C4 freezing each group", "pretrained, Dir 0.1", [("freeze V − FedAvg, pretrained", "freeze V"),
                                                       ("freeze all attention − FedAvg, pretrained", "all attention")]),
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


def readme_table(df: pd.DataFrame) -> str:
    """The README's verdict table, rendered from the family (README_ROWS)."""
    by_name = {r.comparison: r for r in df.itertuples(index=False)}
    missing = [c for _, _, quoted in README_ROWS for c, _ in quoted if c not in by_name]
    if missing:
        raise KeyError(f"the README's rows name comparisons the family does not hold: {missing}")
    lines = ["| claim | regime | verdict | d ± 95% (n): after Holm over the family |", "|---|---|---|---|"]
    for claim, regime, quoted in README_ROWS:
        rows = [by_name[c] for c, _ in quoted]
        cells = "; ".join(f"{label} {_cell(r)}" for r, (_, label) in zip(rows, quoted))
        lines.append(f"| {claim} | {regime} | {_words(claim, rows, [label for _, label in quoted])} | {cells} |")
    return "\n".join(lines) + "\n\n" + FAMILY.format(n=len(df))


def render_readme(text: str, df: pd.DataFrame) -> str:
    """`text` (the README) with its verdict table replaced by the one rendered from `df`."""
    start, end = text.index(README_START) + len(README_START), text.index(README_END)
    return text[:start] + "\n" + readme_table(df) + "\n" + text[end:]


SHORTER = ((", both arms at one rate", ", one rate"), ("pretrained (supervised task)", "pretrained (supervised)"),
           ("pretrained + constant", "pretrained + const."), ("constant rate", "constant"),
           ("five local epochs", "5 local epochs"), ("base, Dir 0.1, AdamW", "base, Dir 0.1"))


def figure_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per README row (README_ROWS) that quotes an accuracy comparison: its first one, with a short label
    (claim, regime, the quoted label) and the claim's code. C4's drift rows (drift units, not points) have none."""
    by_name = {r.comparison: r for r in df.itertuples(index=False)}
    out = []
    for claim, regime, quoted in README_ROWS:
        code = claim.split()[0]
        first = next(((c, label) for c, label in quoted if by_name[c].measure in ACCURACY), None)
        if first is None:
            continue
        for long, short in SHORTER:
            regime = regime.replace(long, short)
        row = by_name[first[0]]
        said = f"FedFrozen {first[1]}" if first[1].startswith("−") else first[1]  # against a baseline
        label = f"{code} {regime}: {said}" if len(quoted) > 1 else f"{code} {regime}"
        out.append(dict(label=label, claim=code, d=row.d, half_width_holm=row.half_width_holm,
                        held=row.verdict_holm in ("higher", "lower")))
    return pd.DataFrame(out)


def readme_figure(df: pd.DataFrame, profile: str = "cpu"):
    """The README's picture: one marker per README row that quotes an accuracy comparison (`figure_rows`), d in
    percentage points with its interval at the comparison's Holm level (filled where it holds), the claim as colour.
    The label column is fixed at 40% of the width, so the plot keeps the rest whatever the labels."""
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
    fig.text(0.01, 1 - 0.25 / height, f"The README's rows, {profile} profile: the first accuracy comparison of each, "
             f"interval at its Holm level over the family of {len(df)} (C4's drift rows: the table)", fontsize=8.5)
    return fig


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    args = parser.parse_args(argv)
    df = readme_family(verdicts(args.profile))
    print("wrote", plots.save_table(df, "readme_verdicts", args.profile))
    print(FAMILY.format(n=len(df)))
    fig = readme_figure(df, args.profile)
    for path in plots.save_figure(fig, "headline", args.profile):
        print("wrote", path)
    if args.profile == "cpu":
        readme = plots.project_root() / "README.md"
        readme.write_text(render_readme(readme.read_text(), df))
        print("wrote the verdict table of", readme.name)


if __name__ == "__main__":
    main()
