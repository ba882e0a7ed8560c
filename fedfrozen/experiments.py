"""Experiments: the run-or-load cache, parallel runs, and resumption after an interruption.

`run_or_load(cfg)` keys a run by the hash of its config and the package version and stores it
under `results/<experiment>/<key>/` (config.json, history.json, env.json), so a notebook re-run
loads instead of training. A run directory appears only once complete. While a run trains, a
checkpoint is kept in `results/<experiment>/.<key>.partial/` (once a minute by default): if the
process dies (a Colab disconnect, a killed GPU job), running the same config again continues
from it, and the History equals an uninterrupted run's. A cached history.json that cannot be
read is moved aside (with a warning naming it) and the run trained again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import warnings
from pathlib import Path

from .history import History
from .io import atomic_dir, project_root
from .loop import run

__all__ = ["run_or_load", "run_many", "config_key", "results_root", "CHECKPOINT_SECONDS"]

CHECKPOINT_SECONDS = 60.0  # default interval of the partial-run checkpoint


def config_key(cfg) -> str:
    """Hash of the config and the package version (12 hex digits)."""
    from . import __version__

    payload = json.dumps({"config": cfg.to_dict(), "version": __version__}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def results_root(root=None) -> Path:
    """`root`, or by default the project's results/ folder (so notebooks, run from notebooks/,
    share one cache with scripts run from the project root)."""
    return Path(root) if root is not None else project_root() / "results"


def _load_cached(folder: Path) -> History | None:
    """The stored History in `folder`, None if there is none; an unreadable one is moved aside."""
    hist_file = folder / "history.json"
    if not hist_file.exists():
        return None
    try:
        hist = History.load(hist_file)
    except ValueError as e:
        aside = folder.with_name(f"{folder.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(folder, aside)
        warnings.warn(f"cached result {hist_file} could not be read ({e}); moved it to {aside} and "
                      "training this config again", RuntimeWarning, stacklevel=3)
        return None
    hist.cached = True
    return hist


def partial_checkpoint(cfg, root=None, experiment: str = "default") -> Path:
    """Where an unfinished run of `cfg` keeps its checkpoint."""
    return results_root(root) / experiment / f".{config_key(cfg)}.partial" / "checkpoint.pt"


def run_or_load(cfg, root=None, experiment: str = "default", force: bool = False, progress: bool = True,
                checkpoint_seconds: float = CHECKPOINT_SECONDS):
    """The History of `cfg`: loaded from `root/experiment/<key>/` if there, else trained and stored.

    `force=True` trains again from scratch and replaces the stored result. An interrupted earlier
    attempt is resumed from its checkpoint (written every `checkpoint_seconds`; 0 writes one every
    round). The returned History has `.cached` True when it was loaded.
    """
    folder = results_root(root) / experiment / config_key(cfg)
    if not force:
        hist = _load_cached(folder)
        if hist is not None:
            return hist
    ckpt = partial_checkpoint(cfg, root, experiment)
    if force and ckpt.parent.exists():
        shutil.rmtree(ckpt.parent)
    resume = ckpt if ckpt.exists() else None
    hist = run(cfg, progress=progress, resume_from=resume, checkpoint=ckpt, checkpoint_seconds=checkpoint_seconds)

    def fill(tmp: Path):
        (tmp / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1, sort_keys=True))
        (tmp / "env.json").write_text(json.dumps(hist.env, indent=1, sort_keys=True))
        hist.save(tmp / "history.json")

    atomic_dir(folder, fill)
    shutil.rmtree(ckpt.parent, ignore_errors=True)
    hist.resumed_from = None if resume is None else str(resume)
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
    (workers are spawned); notebooks do not. Interrupted runs resume from their checkpoints.
    """
    cfgs = list(cfgs)
    root = str(results_root(root))
    missing = {}
    for cfg in cfgs:
        if _load_cached(Path(root) / experiment / config_key(cfg)) is None:
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
