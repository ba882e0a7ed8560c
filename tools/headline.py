"""The headline figure: every verdict of the claim notebooks (03-06) in one forest plot, judged as one family.

    python tools/headline.py            # reads figures/0[3-6]_verdicts.csv, writes figures/headline.{png,pdf}
                                        # and figures/readme_verdicts.csv
    python tools/headline.py --profile smoke   # from runs/smoke/figures/ into the same folder

The notebooks write the verdict tables (`ff.tables.verdict_table`: each notebook's table is its own family) when
they run; this draws them and judges all of them together as the README's family (`ff.tables.adjust`, Holm over
every comparison of 03-06: the README quotes from this family), so the figure and readme_verdicts.csv are current
whenever the notebooks' outputs are. The README and the book's front page show it.
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402

from fedfrozen import plots  # noqa: E402
from fedfrozen import tables as ff_tables  # noqa: E402

NOTEBOOKS = ("03", "04", "05", "06")  # C1, C2, C3, C4
# one comparison, whichever notebook wrote it: the same measure over the same paired runs gives the same numbers
SAME = ["measure", "d", "half_width", "n"]


def verdicts(profile: str) -> pd.DataFrame:
    """The claim notebooks' verdict tables, concatenated in claim order; a missing one is named."""
    folder = plots.figures_dir(profile)
    frames = []
    for nb in NOTEBOOKS:
        path = folder / f"{nb}_verdicts.csv"
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: run notebook {nb} at the {profile} profile first")
        frames.append(pd.read_csv(path, index_col=0))
    return pd.concat(frames, ignore_index=True)


def readme_family(df: pd.DataFrame) -> pd.DataFrame:
    """Every verdict of 03-06 judged as one family (the README's): the notebook's own Holm columns are replaced by
    the family's, and each row gets its 95% interval's ends (`low`, `high`: an unresolved row's bound). A comparison
    two notebooks both make (the same runs: notebook 04's T0 = 25% is notebook 03's FedFrozen − FedAvg) counts once,
    under the first notebook that makes it (`SAME`)."""
    raw = df.drop(columns=[c for c in ff_tables.ADJUSTED_COLUMNS if c in df.columns])
    raw = raw.drop_duplicates(subset=SAME, ignore_index=True)
    out = ff_tables.adjust(raw)
    out["low"], out["high"] = out["d"] - out["half_width"], out["d"] + out["half_width"]
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    args = parser.parse_args(argv)
    df = readme_family(verdicts(args.profile))
    print("wrote", plots.save_table(df, "readme_verdicts", args.profile))
    acc = df[df["measure"] == "late_acc"]  # the rows in accuracy units (drift and oscillation are in the tables)
    n = "/".join(str(k) for k in sorted(set(acc["n"])))
    ax = plots.plot_verdicts(acc, title=f"FedFrozen's claims, {args.profile} profile: late test accuracy, paired over "
                             f"{n} shared seeds\n{len(acc)} accuracy comparisons of the family's {len(df)}; filled: "
                             f"holds after Holm over all {len(df)}")
    for path in plots.save_figure(ax.figure, "headline", args.profile):
        print("wrote", path)


if __name__ == "__main__":
    main()
