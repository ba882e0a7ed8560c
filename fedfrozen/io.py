"""The ground floor: atomic writes, provenance and the project root. Imports nothing of the package
but its version.

`atomic_write(path, write)` is the one way files are written: `write(tmp)` fills a temporary
file next to `path`, which is then renamed over it, so a reader never sees a half-written file.
`atomic_dir(folder, fill)` does the same for a whole folder (a cached run appears only once
complete).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["atomic_write", "atomic_dir", "environment", "project_root", "notebooks", "DRY_RUN_ENV", "dry_run_settings"]

DRY_RUN_ENV = "FEDFROZEN_DRY_RUN"  # JSON settings of `fedfrozen dry-run`, set only in the kernels it starts


def atomic_write(path, write) -> Path:
    """Call `write(tmp_path)` on a temporary file beside `path`, then rename it to `path`.

    Parent folders are created; on any error the temporary file is removed and `path` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=f"{path.suffix}.tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_dir(folder, fill) -> Path:
    """Call `fill(tmp_folder)` on a fresh temporary folder beside `folder`, then put it in `folder`'s place
    (replacing an existing one). On any error the temporary folder is removed."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        fill(tmp)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def _git_commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: str | None = None) -> dict:
    """Versions and machine facts stored with every result."""
    import numpy
    import timm
    import torch

    from . import __version__

    return {"fedfrozen": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "timm": timm.__version__, "numpy": numpy.__version__, "platform": platform.platform(),
            "device": device or ("cuda" if torch.cuda.is_available() else "cpu"),
            "git_commit": _git_commit()}


def project_root() -> Path:
    """The repository root: the folder holding notebooks/ and pyproject.toml above the cwd or the
    package; the cwd when there is none (an installed package, e.g. on Colab)."""
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for folder in (start, *start.parents):
            if (folder / "notebooks").is_dir() and (folder / "pyproject.toml").is_file():
                return folder
    return Path.cwd()


def notebooks(only: str | None = None) -> list[Path]:
    """The project's numbered notebooks (notebooks/NN_*.ipynb), optionally only those numbered in
    `only` ("02,03"); a ValueError names an unknown number."""
    books = sorted((project_root() / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if only:
        wanted = {w.strip() for w in only.split(",") if w.strip()}
        unknown = wanted - {b.name[:2] for b in books}
        if unknown:
            raise ValueError(f"--only: no notebook numbered {sorted(unknown)}; have {[b.name[:2] for b in books]}")
        books = [b for b in books if b.name[:2] in wanted]
    return books


def dry_run_settings() -> dict | None:
    """The settings of a running `fedfrozen dry-run` in this process (log, rounds, model_kwargs, one_seed,
    notebook), or None. Only fedfrozen.dryrun sets them, in the notebook kernels it starts."""
    import json

    text = os.environ.get(DRY_RUN_ENV)
    return json.loads(text) if text else None
