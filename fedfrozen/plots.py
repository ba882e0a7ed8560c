"""Figures and tables for the notebooks: one function per figure, one saver for all.

`save_figure(fig, "02_partitions")` writes figures/02_partitions.{pdf,png} at the project
root (atomically), `save_table(df, "02_partitions")` writes figures/02_partitions.csv.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from .partition import label_counts

__all__ = ["figures_dir", "save_figure", "save_table", "plot_label_distribution", "plot_mean_std", "best_by",
           "select_profile"]

PROFILES = ("smoke", "cpu", "paper")
_active = {"profile": None}  # set by select_profile; smoke-profile outputs stay out of figures/


def select_profile(profile: str, **settings):
    """The settings of `profile` (one keyword per profile), with a clear error for a typo.

    It also records the profile: under `smoke`, save_figure/save_table write to runs/smoke/figures/
    so that a CI run never overwrites the committed cpu-profile figures.
    """
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}; got {profile!r}")
    if profile not in settings:
        raise ValueError(f"no settings given for profile {profile!r}")
    _active["profile"] = profile
    return settings[profile]


def figures_dir() -> Path:
    from .cli import project_root

    root = project_root()
    folder = root / "runs" / "smoke" / "figures" if _active["profile"] == "smoke" else root / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _relative(path: Path) -> str:
    from .cli import project_root

    return str(path.relative_to(project_root()))


def _atomic(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_figure(fig, name: str) -> list[str]:
    """Write `fig` to figures/<name>.pdf and .png (runs/smoke/figures/ under the smoke profile);
    returns the paths relative to the project root."""
    folder = figures_dir()
    out = []
    for ext in ("pdf", "png"):
        path = folder / f"{name}.{ext}"
        _atomic(path, lambda tmp, ext=ext: fig.savefig(tmp, format=ext, dpi=150, bbox_inches="tight",
                                                       metadata={"CreationDate": None} if ext == "pdf" else None))
        out.append(_relative(path))
    return out


def save_table(df, name: str) -> str:
    path = figures_dir() / f"{name}.csv"
    _atomic(path, lambda tmp: df.to_csv(tmp))
    return _relative(path)


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


def best_by(df, x: str, y: str, by: str, maximize: bool = False) -> dict:
    """For each value of `by`, the `x` with the lowest mean `y` over seeds (the highest with maximize=True)."""
    means = df.groupby([by, x])[y].mean().reset_index()
    best = {k: sub.loc[sub[y].idxmax() if maximize else sub[y].idxmin(), x] for k, sub in means.groupby(by)}
    plain = lambda v: v.item() if hasattr(v, "item") else v  # noqa: E731  (numpy scalars print as np.int64(..))
    return {plain(k): plain(v) for k, v in best.items()}
