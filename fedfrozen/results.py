"""Run-or-load cache, provenance and atomic writes.

`run_or_load(cfg)` keys a run by the hash of its resolved config and the package version and
stores it under `results/<experiment>/<key>/` (config.json, history.json, env.json), so a
notebook re-run loads instead of training. Every file is written to a temporary name and
renamed, and a run directory appears only once complete: nothing half-written on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["run_or_load", "config_key", "environment", "atomic_write_text", "atomic_save"]


def atomic_write_text(path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_save(obj, path) -> None:
    """torch.save through a temporary file and a rename."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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


def config_key(cfg) -> str:
    """Hash of the resolved config and the package version (12 hex digits)."""
    from . import __version__

    payload = json.dumps({"config": cfg.to_dict(), "version": __version__}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def results_root(root=None) -> Path:
    """`root`, or by default the project's results/ folder (so notebooks, run from notebooks/,
    share one cache with scripts run from the project root)."""
    if root is not None:
        return Path(root)
    from .cli import project_root

    return project_root() / "results"


def run_or_load(cfg, root=None, experiment: str = "default", force: bool = False, progress: bool = True):
    """The History of `cfg`: loaded from `root/experiment/<key>/` if there, else trained and stored.

    `force=True` trains again and replaces the stored result. The returned History has
    `.cached` True when it was loaded.
    """
    from .history import History
    from .loop import run

    folder = results_root(root) / experiment / config_key(cfg)
    hist_file = folder / "history.json"
    if hist_file.exists() and not force:
        hist = History.load(hist_file)
        hist.cached = True
        return hist
    hist = run(cfg, progress=progress)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        (tmp / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1, sort_keys=True))
        (tmp / "env.json").write_text(json.dumps(hist.env, indent=1, sort_keys=True))
        hist.save(tmp / "history.json")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return hist


def _run_one(args):
    """Worker: one cached run on one thread (module level so that spawned processes can import it)."""
    import torch

    cfg, root, experiment = args
    torch.set_num_threads(1)
    run_or_load(cfg, root=root, experiment=experiment, progress=False)
    return config_key(cfg)


def run_many(cfgs, root=None, experiment: str = "default", workers: int | None = None,
             progress: bool = True) -> list:
    """Histories of many configs, in order: cached ones loaded, the rest trained in parallel.

    Each missing run trains in its own process on one thread (on small models one thread per run
    and one run per core beats one run on all cores). `workers` defaults to the number of cores;
    workers=1 trains in this process. Scripts that call it need the `if __name__ == "__main__":` guard
    (workers are spawned); notebooks do not.
    """
    cfgs = list(cfgs)
    root = str(results_root(root))
    missing = {}
    for cfg in cfgs:
        if not (Path(root) / experiment / config_key(cfg) / "history.json").exists():
            missing.setdefault(config_key(cfg), cfg)
    workers = workers or os.cpu_count() or 1
    if missing and (workers == 1 or len(missing) == 1):
        for cfg in missing.values():
            run_or_load(cfg, root=root, experiment=experiment, progress=progress)
    elif missing:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        from .progress import progress_bar

        jobs = [(cfg, root, experiment) for cfg in missing.values()]
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=mp.get_context("spawn")) as pool:
            futures = [pool.submit(_run_one, job) for job in jobs]
            for f in progress_bar(as_completed(futures), progress, total=len(futures), desc=f"{experiment}: runs",
                                  leave=False):
                f.result()
    return [run_or_load(cfg, root=root, experiment=experiment, progress=False) for cfg in cfgs]
