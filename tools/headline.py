"""The headline figure: every verdict of the claim notebooks (03-06) in one forest plot.

    python tools/headline.py            # reads figures/0[3-6]_verdicts.csv, writes figures/headline.{png,pdf}
    python tools/headline.py --profile smoke   # from runs/smoke/figures/ into the same folder

The notebooks write the verdict tables (`ff.tables.verdict_table`) when they run; this only draws them, so the
figure is current whenever the notebooks' outputs are. The README and the book's front page show it.
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402

from fedfrozen import plots  # noqa: E402

NOTEBOOKS = ("03", "04", "05", "06")  # C1, C2, C3, C4


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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    args = parser.parse_args(argv)
    df = verdicts(args.profile)
    n = "/".join(str(k) for k in sorted(set(df["n"])))
    ax = plots.plot_verdicts(df, title=f"FedFrozen's claims, {args.profile} profile: late test accuracy, paired over "
                             f"{n} shared seeds")
    for path in plots.save_figure(ax.figure, "headline", args.profile):
        print("wrote", path)


if __name__ == "__main__":
    main()
