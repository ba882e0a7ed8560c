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

__all__ = ["figures_dir", "save_figure", "save_table", "plot_label_distribution", "select_profile"]

PROFILES = ("smoke", "cpu", "paper")


def select_profile(profile: str, **settings):
    """The settings of `profile` (one keyword per profile), with a clear error for a typo."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}; got {profile!r}")
    if profile not in settings:
        raise ValueError(f"no settings given for profile {profile!r}")
    return settings[profile]


def figures_dir() -> Path:
    from .cli import project_root

    folder = project_root() / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


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
    """Write `fig` to figures/<name>.pdf and .png; returns the paths relative to the project."""
    folder = figures_dir()
    out = []
    for ext in ("pdf", "png"):
        path = folder / f"{name}.{ext}"
        _atomic(path, lambda tmp, ext=ext: fig.savefig(tmp, format=ext, dpi=150, bbox_inches="tight",
                                                       metadata={"CreationDate": None} if ext == "pdf" else None))
        out.append(f"figures/{name}.{ext}")
    return out


def save_table(df, name: str) -> str:
    path = figures_dir() / f"{name}.csv"
    _atomic(path, lambda tmp: df.to_csv(tmp))
    return f"figures/{name}.csv"


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
