"""The headline figure: every verdict of the claim notebooks (03-06) in one forest plot, judged as one family.

    python tools/headline.py            # reads figures/0[3-6]_verdicts.csv, writes figures/headline.{png,pdf}
                                        # and figures/readme_verdicts.csv
    python tools/headline.py --profile smoke   # from runs/smoke/figures/ into the same folder

It also renders the README's verdict table (between README_START and README_END) from the family, so that every
number the README's table quotes is its row's (tests/test_readme.py renders it again and compares).

The notebooks write the verdict tables (`ff.tables.verdict_table`: each notebook's table is its own family) when
they run; this draws them and judges all of them together as the README's family (`ff.tables.adjust`, Holm over
every comparison of 03-06: the README quotes from this family), so the figure and readme_verdicts.csv are current
whenever the notebooks' outputs are. The README and the book's front page show it.
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402

from fedfrozen import plots  # noqa: E402
from fedfrozen import tables as ff_tables  # noqa: E402

# C1, C2, C3, C4 (and C4's drift family), then notebook 03's controlled cells (§ 3): each NN_verdicts.csv with the
# per-seed table NN_per_seed.csv it follows from
NOTEBOOKS = ("03", "04", "05", "06", "06_drift", "03_controls")
# one comparison, whichever notebook wrote it: the same measure over the same runs (their cache keys; one trained
# again on another machine is the same comparison, counted once with the first notebook's digits)
SAME = ["measure", "runs"]


def verdicts(profile: str) -> pd.DataFrame:
    """The claim notebooks' verdict tables, concatenated in claim order, each row with the cache keys of its two
    arms (`runs`: JSON); a missing table is named."""
    folder = plots.figures_dir(profile)
    frames = []
    for nb in NOTEBOOKS:
        path, runs_path = folder / f"{nb}_verdicts.csv", folder / f"{nb}_per_seed.csv"
        for p in (path, runs_path):
            if not p.exists():
                raise FileNotFoundError(f"{p} is missing: run notebook {nb[:2]} at the {profile} profile first")
        table, runs = pd.read_csv(path, index_col=0), pd.read_csv(runs_path, index_col=0)
        table["runs"] = [json.dumps([sorted(ff_tables.arm_rows(runs, json.loads(v.by), json.loads(lab))["key"])
                                     for lab in (v.a, v.b)]) for v in table.itertuples(index=False)]
        frames.append(table.assign(source=nb))
    return pd.concat(frames, ignore_index=True)


def readme_family(df: pd.DataFrame) -> pd.DataFrame:
    """Every verdict of 03-06 judged as one family (the README's): the notebook's own Holm columns are replaced by
    the family's, and each row gets its 95% interval's ends (`low`, `high`: an unresolved row's bound). A comparison
    two notebooks both make (the same measure on the same runs, `SAME`: notebook 04's T0 = 25% is notebook 03's
    FedFrozen − FedAvg) counts once, under the first notebook that makes it."""
    raw = df.drop(columns=[c for c in ff_tables.ADJUSTED_COLUMNS if c in df.columns])
    # a row is another notebook's comparison again when an earlier notebook made it on the same runs (within one
    # table rows are distinct comparisons even on the same runs: 06's drift of each group against Q/K's)
    seen, keep = {}, []
    for row in raw.itertuples(index=False):
        first = seen.setdefault((row.measure, row.runs), row.source)
        keep.append(first == row.source)
    raw = raw[keep].drop(columns=["runs", "source"]).reset_index(drop=True)
    out = ff_tables.adjust(raw)
    out["low"], out["high"] = out["d"] - out["half_width"], out["d"] + out["half_width"]
    out["half_width_holm"] = [ff_tables.adjusted_half_width(*r) for r in
                              zip(out["d"], out["half_width"], out["n"], out["p"], out["p_holm"])]
    return out


def is_fedfrozen(comparison: str) -> bool:
    """A row of FedFrozen against FedAvg (at any T0, in any regime); the others are the baselines and ablations (C1's
    baselines, FedFrozen against them, C3's penalties, C4's other freezes), drawn on their own axis."""
    return comparison.startswith(("FedFrozen − FedAvg", "FedFrozen T0", "T0 =", "freeze Q/K (FedFrozen)"))


README_START = "<!-- verdicts: rendered by tools/headline.py from figures/readme_verdicts.csv -->"
README_END = "<!-- verdicts: end -->"
# The README's rows: (claim, regime, the comparisons it quotes, in figures/readme_verdicts.csv); the paper's claim
# is reproduced in a row when one of its comparisons holds in the claim's direction after Holm.
README_ROWS = [
    ("C1 stability and performance", "base, IID", [("FedFrozen − FedAvg, iid", "accuracy")]),
    ("C1", "base, Dir 0.5", [("FedFrozen − FedAvg, dirichlet:0.5", "accuracy")]),
    ("C1", "base, Dir 0.1", [("FedFrozen − FedAvg, dirichlet:0.1", "accuracy"),
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
    ("C1", "five local epochs, Dir 0.1", [("FedFrozen T0 25% − FedAvg, local5, Dir 0.1", "scratch, 15 seeds"),
                                          ("FedFrozen − FedAvg, dirichlet:0.1, local5", "scratch, 5 seeds"),
                                          ("FedFrozen − FedAvg, dirichlet:0.1, local5_pretrained", "pretrained")]),
    ("C1 against the baselines", "base, Dir 0.1, AdamW", [
        ("FedFrozen − FedProx (AdamW), dirichlet:0.1", "− FedProx"),
        ("FedFrozen − SCAFFOLD (AdamW, option I), dirichlet:0.1", "− SCAFFOLD")]),
    ("C2 best T0 shrinks with heterogeneity", "base", [("T0 = 50% of T − FedAvg, α=0.1", "T0 50%, α 0.1"),
                                                       ("T0 = 50% of T − FedAvg, α=0.5", "T0 50%, α 0.5")]),
    ("C2", "pretrained", [("T0 = 0% of T − FedAvg, α=0.1, pretrained", "T0 0, α 0.1"),
                          ("FedFrozen T0 0% − FedAvg, bodies, Dir 0.1", "T0 0, a body per seed"),
                          ("T0 = 50% of T − FedAvg, α=0.1, pretrained", "T0 50%, α 0.1"),
                          ("T0 = 0% of T − FedAvg, α=0.5, pretrained", "T0 0, α 0.5")]),
    ("C2", "constant rate, both arms at one rate", [
        ("FedFrozen T0 50% − FedAvg, both at 0.003, constant, Dir 0.1", "T0 50%, 3e-3, α 0.1"),
        ("FedFrozen T0 50% − FedAvg, both at 0.001, constant, Dir 0.1", "T0 50%, 1e-3, α 0.1"),
        ("FedFrozen T0 50% − FedAvg, both at 0.003, constant, Dir 0.05", "T0 50%, 3e-3, α 0.05")]),
    ("C3 value L2 cuts drift, costs little", "base, Dir 0.1", [
        ("value L2 λ=0.01 − λ=0, α=0.1: value drift", "drift, λ 0.01"),
        ("value L2 λ=0.01 − λ=0, α=0.1", "accuracy, λ 0.01"), ("value L2 λ=0.1 − λ=0, α=0.1", "accuracy, λ 0.1")]),
    ("C3", "pretrained, Dir 0.1", [("value L2 λ=0.01 − λ=0, α=0.1, pretrained: value drift", "drift, λ 0.01"),
                                   ("value L2 λ=0.01 − λ=0, α=0.1, pretrained", "accuracy, λ 0.01")]),
    ("C3", "constant rate, Dir 0.1", [("value L2 λ=0.01 − λ=0, α=0.1, constant: value drift", "drift, λ 0.01"),
                                      ("value L2 λ=0.1 − λ=0, α=0.1, constant: value drift", "drift, λ 0.1"),
                                      ("value L2 λ=0.01 − λ=0, α=0.1, constant", "accuracy, λ 0.01")]),
    ("C4 subcomponents respond differently", "base, Dir 0.1", [("v drift − Q/K drift, FedAvg", "drift V − Q/K"),
                                                               ("attn_out drift − Q/K drift, FedAvg", "output − Q/K")]),
    ("C4", "pretrained, Dir 0.1", [("v drift − Q/K drift, FedAvg, pretrained", "drift V − Q/K"),
                                   ("attn_out drift − Q/K drift, FedAvg, pretrained", "output − Q/K")]),
    ("C4 freezing each group", "base, Dir 0.1", [("freeze V − FedAvg", "freeze V"),
                                                 ("freeze all attention − FedAvg", "all attention")]),
    ("C4 freezing each group", "pretrained, Dir 0.1", [("freeze Q/K (FedFrozen) − FedAvg, pretrained", "freeze Q/K"),
                                                       ("freeze all attention − FedAvg, pretrained", "all attention")]),
]
# the direction in which each claim's rows would reproduce it (C3: drift lower; its accuracy rows bound the cost)
DIRECTION = {"C1": "higher", "C2": "higher", "C3": "lower", "C4": None}
C3_MARGIN = 1.0  # points: C3's "without severely sacrificing accuracy" (docs/claims.md)


def _cell(row) -> str:
    """d ± half (n): the family's verdict, in points for accuracy and oscillation."""
    after = row.verdict_holm if row.verdict_holm in ("higher", "lower") else (
        f"{row.verdict} alone" if row.verdict in ("higher", "lower") else "not resolved")
    return f"d = {row.d:+.3f} ± {row.half_width:.3f} ({int(row.n)}): {after}".replace("-", "−")


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
        cut = [r for r in rows if r.measure == "drift_v" and r.verdict_holm == "lower"]
        costs = [(-100 * r.low, label) for r, label in zip(rows, labels) if r.measure == "late_acc"]
        if cut:
            cost, label = max(costs)
            if cost <= C3_MARGIN:
                return "**reproduced**"
            return (f"**not reproduced**: drift cut after Holm, but {label.split(', ')[-1]} costs up to {cost:.2f} "
                    f"points (margin {C3_MARGIN:g})")
    if main.verdict_holm == direction:
        return "**reproduced**"
    if main.verdict_holm in ("higher", "lower"):
        return f"**not reproduced**: {main.verdict_holm}"
    if main.verdict in ("higher", "lower"):
        return f"**not reproduced**: {main.verdict} alone, not after Holm"
    scale, unit = (1, "") if main.measure == "drift_v" else (100, " points")
    bound = main.high if direction == "higher" else -main.low
    return (f"**not reproduced**: no {'gain' if direction == 'higher' else 'cut'} above {scale * bound:.2f}{unit} "
            f"(detects {scale * main.detectable:.2f})")


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
    return "\n".join(lines)


def render_readme(text: str, df: pd.DataFrame) -> str:
    """`text` (the README) with its verdict table replaced by the one rendered from `df`."""
    start, end = text.index(README_START) + len(README_START), text.index(README_END)
    return text[:start] + "\n" + readme_table(df) + "\n" + text[end:]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    args = parser.parse_args(argv)
    df = readme_family(verdicts(args.profile))
    print("wrote", plots.save_table(df, "readme_verdicts", args.profile))
    acc = df[df["measure"] == "late_acc"]  # the rows in accuracy units (drift and oscillation are in the tables)
    mine = acc[[is_fedfrozen(c) for c in acc["comparison"]]]
    other = acc[[not is_fedfrozen(c) for c in acc["comparison"]]]
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 0.3 * len(acc) + 3.2),
                                      gridspec_kw={"height_ratios": [len(mine) + 2, len(other) + 2]})
    n = "/".join(str(k) for k in sorted(set(acc["n"])))
    plots.plot_verdicts(mine, ax=top, interval="half_width_holm",
                        title=f"FedFrozen's claims, {args.profile} profile: late test accuracy, paired over {n} shared "
                        f"seeds; {len(acc)} accuracy comparisons of the family's {len(df)}\n"
                        f"FedFrozen against FedAvg at every T0 and regime (intervals and fill: Holm over all "
                        f"{len(df)})")
    plots.plot_verdicts(other, ax=bottom, interval="half_width_holm",
                        title="the baselines and ablations (C1's baselines, and FedFrozen against them; C3's value L2; "
                        "C4's other freezes), on their own axis")
    fig.tight_layout()
    for path in plots.save_figure(fig, "headline", args.profile):
        print("wrote", path)
    if args.profile == "cpu":
        readme = plots.project_root() / "README.md"
        readme.write_text(render_readme(readme.read_text(), df))
        print("wrote the verdict table of", readme.name)


if __name__ == "__main__":
    main()
