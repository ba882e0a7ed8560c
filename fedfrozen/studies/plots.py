"""Figures and tables for the notebooks: one function per figure, one saver for all.

`save_figure(fig, "02_partitions", profile)` writes figures/02_partitions.{pdf,png} at the
project root (atomically), `save_table(df, "02_partitions", profile)` writes
figures/02_partitions.csv with floats to 6 significant digits (a rerun on another machine then
rewrites the same text). Only the committed profile (`profiles.COMMITTED`, cpu) writes there: under any other
(smoke in CI, paper on a GPU) both go to runs/<profile>/figures/, so no run overwrites the committed figures;
the profile is an explicit argument. FEDFROZEN_FIGURES (fedfrozen.base.io.FIGURES_ENV), where set, names a folder
that takes them instead under every profile (`fedfrozen budget`'s executions write there, not to figures/).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..base.io import FIGURES_ENV, atomic_write, project_root
from ..inputs.partition import label_counts
from .profiles import COMMITTED, PROFILES

__all__ = ["figures_dir", "save_figure", "save_table", "plot_label_distribution", "plot_mean_std", "best_by",
           "plot_regime_map", "plot_verdicts", "save_per_seed", "legend_below", "TABLE_FLOAT_FORMAT",
           "PRECISE_FLOAT_FORMAT"]

TABLE_FLOAT_FORMAT = "%.6g"
PRECISE_FLOAT_FORMAT = "%.17g"  # round-trips every float64


def figures_dir(profile: str) -> Path:
    """figures/ at the project root under the committed profile (cpu), else runs/<profile>/figures/ (created);
    under any profile the folder FEDFROZEN_FIGURES names, where it is set."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}; got {profile!r}")
    root = project_root()
    if os.environ.get(FIGURES_ENV):
        folder = Path(os.environ[FIGURES_ENV]).resolve()
    else:
        folder = root / "figures" if profile == COMMITTED else root / "runs" / profile / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _relative(path: Path) -> str:
    """`path` relative to the project root, or whole where it lies outside (FEDFROZEN_FIGURES)."""
    root = project_root()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def save_figure(fig, name: str, profile: str) -> list[str]:
    """Write `fig` to <figures_dir(profile)>/<name>.pdf and .png; returns the paths relative to the project root."""
    folder = figures_dir(profile)
    out = []
    for ext in ("pdf", "png"):
        path = folder / f"{name}.{ext}"
        atomic_write(path, lambda tmp, ext=ext: fig.savefig(tmp, format=ext, dpi=150, bbox_inches="tight",
                                                            metadata={"CreationDate": None} if ext == "pdf" else None))
        out.append(_relative(path))
    return out


def save_table(df, name: str, profile: str, float_format: str = TABLE_FLOAT_FORMAT) -> str:
    """Write `df` to <figures_dir(profile)>/<name>.csv, floats as `float_format` (TABLE_FLOAT_FORMAT; a per-seed
    table keeps every digit, PRECISE_FLOAT_FORMAT, so that its verdicts are recomputed exactly)."""
    path = figures_dir(profile) / f"{name}.csv"
    atomic_write(path, lambda tmp: df.to_csv(tmp, float_format=float_format))
    return _relative(path)


def save_per_seed(table, number: str, profile: str) -> list[str]:
    """Write a notebook's per-seed table (`ff.tables.per_seed(runs)`: every run, every digit) to NN_per_seed.csv and the
    full Config of each of its runs to NN_configs.jsonl beside it, one line per distinct cache key in the table's
    order: {"key", "experiment", "config"}, so that any committed row can be retrained exactly (`fedfrozen verify`).
    The configs are the ones this process asked `run_or_load` for (`ff.experiments.asked`)."""
    import json

    from ..runs.experiments import asked

    lines = []
    for key in dict.fromkeys(table["key"]):
        experiment, cfg = asked(key)
        lines.append(json.dumps({"key": key, "experiment": experiment, "config": cfg.to_dict()}, sort_keys=True))
    path = figures_dir(profile) / f"{number}_configs.jsonl"
    out = [save_table(table, f"{number}_per_seed", profile, PRECISE_FLOAT_FORMAT)]
    atomic_write(path, lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
    return [*out, _relative(path)]


def plot_label_distribution(labels, parts, ax=None, title: str | None = None, max_clients: int = 50):
    """Stacked bars: each client's samples by class (the usual non-IID picture)."""
    import matplotlib.pyplot as plt

    counts = label_counts(labels, parts)[:max_clients]
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 2.5))
    cmap = plt.get_cmap("tab10" if counts.shape[1] <= 10 else "tab20")
    bottom = np.zeros(counts.shape[0])
    for c in range(counts.shape[1]):
        ax.bar(np.arange(counts.shape[0]), counts[:, c], bottom=bottom, color=cmap(c % cmap.N), width=0.9,
               label=str(c))
        bottom += counts[:, c]
    ax.set_xlabel("client")
    ax.set_ylabel("samples")
    if title:
        ax.set_title(title)
    return ax


def plot_mean_std(df, x: str, y: str, by: str | None = None, ax=None, label: str | None = None,
                  xscale: str = "linear", marker: str = "o"):
    """Mean ± std of `y` over repeated rows (seeds) at each `x`, one line per value of `by`."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 3))
    groups = [(None, df)] if by is None else list(df.groupby(by))
    for key, sub in groups:
        stats = sub.groupby(x)[y].agg(["mean", "std"]).reset_index()
        name = label if by is None else f"{by}={key:g}" if isinstance(key, (int, float)) else f"{by}={key}"
        ax.plot(stats[x], stats["mean"], marker=marker, ms=3, label=name)
        ax.fill_between(stats[x], stats["mean"] - stats["std"].fillna(0), stats["mean"] + stats["std"].fillna(0),
                        alpha=0.2)
    if xscale == "symlog":
        ax.set_xscale("symlog", linthresh=1)
    else:
        ax.set_xscale(xscale)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    return ax


def legend_below(fig, ax=None, ncol: int | None = None, title: str | None = None, fontsize: int = 8):
    """One legend for the whole figure, below its axes, so it covers no data: the entries of `ax` (default: the
    first axes), the per-axes legends removed. Call after `fig.tight_layout()`; saving with bbox_inches="tight"
    (as save_figure does) keeps it in the file."""
    axes = fig.get_axes()
    handles, labels = (ax or axes[0]).get_legend_handles_labels()
    for a in axes:
        if a.get_legend() is not None:
            a.get_legend().remove()
    return fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol or len(labels),
                      frameon=False, fontsize=fontsize, title=title, title_fontsize=fontsize)


CLAIM_COLOURS = {"C1": "tab:blue", "C2": "tab:orange", "C3": "tab:green", "C4": "tab:red"}  # a claim's colour


def plot_verdicts(df, ax=None, title: str | None = None, interval: str = "half_width"):
    """Forest plot of paired verdicts (a `tables.verdict_table`, several concatenated): one row per comparison,
    grouped by claim, the mean paired difference d in percentage points with the interval of column `interval`
    (the 95% half-width; "half_width_holm" for the Holm-adjusted one, `tables.adjusted_half_width`, which excludes 0
    exactly where the fill says it holds); filled markers where the difference holds (by `verdict_holm`, the
    family's Holm-adjusted verdict, when the table has it; else the interval excludes 0), hollow where it does not.
    The x axis is symmetric about 0."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows = df.reset_index(drop=True)
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 0.32 * len(rows) + 1.2))
    y = np.arange(len(rows))[::-1]
    d, hw = 100 * rows["d"].to_numpy(float), 100 * rows[interval].to_numpy(float)
    resolved = rows["verdict_holm" if "verdict_holm" in rows else "verdict"].isin(["higher", "lower"]).to_numpy()
    colours = CLAIM_COLOURS
    handles = []
    for claim in dict.fromkeys(rows["claim"]):
        sel = (rows["claim"] == claim).to_numpy()
        colour = colours.get(claim, "tab:gray")
        ax.errorbar(d[sel], y[sel], xerr=hw[sel], fmt="none", ecolor=colour, capsize=2, lw=1)
        for filled in (True, False):
            pick = sel & (resolved == filled)
            ax.scatter(d[pick], y[pick], s=28, zorder=3, edgecolors=colour, facecolors=colour if filled else "white")
        handles.append(Line2D([], [], marker="o", ls="", color=colour, label=claim))
    handles.append(Line2D([], [], marker="o", ls="", color="gray", markerfacecolor="white",
                          label="hollow: no difference resolved" + (" (Holm)" if "verdict_holm" in rows else "")))
    ax.axvline(0, color="black", lw=0.8)
    reach = float(np.nanmax(np.abs(np.r_[d - hw, d + hw]))) if len(rows) else 1.0
    ax.set_xlim(-1.1 * reach, 1.1 * reach)
    ax.set_yticks(y, [f"{c}  {t}" for c, t in zip(rows["claim"], rows["comparison"])], fontsize=8)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlabel("paired difference in test accuracy, d (percentage points; "
                  + ("interval at each comparison's Holm level)" if interval == "half_width_holm" else "95% interval)"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def best_by(df, x: str, y: str, by: str, maximize: bool = False) -> dict:
    """For each value of `by`, the `x` with the lowest mean `y` over seeds (the highest with maximize=True)."""
    means = df.groupby([by, x])[y].mean().reset_index()
    best = {k: sub.loc[sub[y].idxmax() if maximize else sub[y].idxmin(), x] for k, sub in means.groupby(by)}
    plain = lambda v: v.item() if hasattr(v, "item") else v  # noqa: E731  (numpy scalars print as np.int64(..))
    return {plain(k): plain(v) for k, v in best.items()}


def plot_regime_map(table, fraction: float, ax=None, higher_is_better: bool = True, title: str | None = None):
    """Heat map of one T0/T of a regime map (fedfrozen.studies.regime.regime_map): rows (start, local epochs),
    columns alpha. The colour is the paired gap FedFrozen - FedAvg in units of its 95% half-width (the one rule's
    yardstick, tables.PAIRED_RULE), clipped to +-2: pale where no difference is resolved (|gap| <= half-width),
    strong beyond it; blue where FedFrozen is better (for a measure where lower is better pass
    higher_is_better=False). The text is the gap, '*' where it is resolved (after Holm when the table has
    verdict_holm); cells not run are grey; rows name the schedule when the map has more than one."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(4, 2.5))
    sub = table[np.isclose(table["fraction"], fraction)]
    alphas = sorted(table["alpha"].unique())
    schedules = table["schedule"] if "schedule" in table.columns else [""] * len(table)
    rows = sorted({(s, int(e), str(sc)) for s, e, sc in zip(table["start"], table["local_epochs"], schedules)},
                  key=lambda t: (t[0] != "scratch", t))
    several = len({r[2] for r in rows}) > 1  # name the schedule only where the map has more than one
    verdict = "verdict_holm" if "verdict_holm" in table.columns else "verdict"
    values = np.full((len(rows), len(alphas)), np.nan)
    texts = {}
    for _, r in sub.iterrows():
        i = rows.index((r["start"], int(r["local_epochs"]), str(r["schedule"]) if "schedule" in r.index else ""))
        j = alphas.index(r["alpha"])
        hw = r["half_width"]
        z = r["gap"] / hw if 0 < hw < np.inf else np.sign(r["gap"]) * 2.0 if hw == 0 else 0.0
        values[i, j] = z if higher_is_better else -z
        texts[i, j] = f"{r['gap']:+.3f}" + ("*" if r[verdict] in ("better", "worse") else "")
    cmap = plt.get_cmap("RdBu").copy()
    cmap.set_bad("0.85")
    image = ax.imshow(np.ma.masked_invalid(np.clip(values, -2, 2)), cmap=cmap, vmin=-2, vmax=2, aspect="auto")
    for (i, j), text in texts.items():
        ax.text(j, i, text, ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(alphas)), [f"{a:g}" for a in alphas])
    ax.set_yticks(range(len(rows)), [f"{s}, E={e}" + (f", {sc}" if several else "") for s, e, sc in rows])
    ax.set_xlabel("Dirichlet alpha")
    ax.set_title(title or f"T0/T = {fraction:g}", fontsize=9)
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="gap / 95% half-width")
    return ax
