"""Experiments: the run-or-load cache, parallel runs, and resumption after an interruption.

`run_or_load(cfg)` keys a run by the hash of its config and the package version and stores it
under `results/<experiment>/<key>/` (config.json, history.json, env.json), so a notebook re-run
loads instead of training. A run directory appears only once complete. While a run trains, a
checkpoint is kept in `results/<experiment>/.<key>.partial/` (once a minute by default): if the
process dies (a Colab disconnect, a killed GPU job), running the same config again continues
from it, and the History equals an uninterrupted run's. A cached history.json that cannot be
read is moved aside (with a warning naming it) and the run trained again.

Under `fedfrozen dry-run` (fedfrozen.dryrun) the environment variable FEDFROZEN_DRY_RUN is set
in the notebooks' kernels: then every run is shortened to a few rounds (optionally on a tiny
model), measured, and logged, so that a notebook's whole paper-profile grid is exercised in
minutes and its full cost can be projected.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import statistics
import time
import warnings
from pathlib import Path

from .history import History
from .io import atomic_dir, dry_run_settings, project_root
from .loop import run

__all__ = ["run_or_load", "run_many", "config_key", "results_root", "CHECKPOINT_SECONDS"]

CHECKPOINT_SECONDS = 60.0  # default interval of the partial-run checkpoint


def config_key(cfg) -> str:
    """Hash of the config's non-default fields and the package version (12 hex digits).

    Fields at their default value are left out, so adding a Config field (with a default that
    keeps the old behaviour) does not invalidate the cache.
    """
    from . import __version__
    from .config import Config

    defaults = _defaults(Config)
    changed = {k: v for k, v in cfg.to_dict().items() if k not in defaults or defaults[k] != v}
    payload = json.dumps({"config": changed, "version": __version__}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def _defaults(config_cls) -> dict:
    import dataclasses

    return {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
            for f in dataclasses.fields(config_cls)} | {"freeze": list(config_cls.__dataclass_fields__["freeze"].default)}


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
    dry = dry_run_settings()
    if dry is not None:
        return _dry_run(cfg, dry, root, experiment)
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


def _shortened(cfg, dry: dict):
    """`cfg` cut to dry["rounds"] rounds, both stages kept when it has two (the tiny model, if asked for,
    comes from fedfrozen.models.create, so that a notebook's own models are tiny too)."""
    rounds = dry["rounds"]
    two_stage = cfg.warmup_rounds < cfg.rounds
    changes = dict(rounds=rounds, warmup_rounds=min(cfg.warmup_rounds, 1) if two_stage else rounds, eval_every=1,
                   lr_warmup_rounds=0, server_pretrain_epochs=min(cfg.server_pretrain_epochs, 1))
    if dry.get("one_seed"):  # --tiny: only proves the paths run, so one seed and two local steps suffice
        changes.update(seed=0, local_epochs=None, local_steps=2, eval_every=rounds)
    return cfg.replace(**changes)


def _peak_memory_mb(device: str) -> float:
    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _dry_run(cfg, dry: dict, root, experiment: str):
    """Train the shortened `cfg` (cached by its own key), log its cost, return its short History."""
    import torch

    short = _shortened(cfg, dry)
    folder = results_root(root) / experiment / config_key(short)
    hist = _load_cached(folder)
    trained = hist is None
    if trained:
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        hist = run(short, progress=False)
        atomic_dir(folder, lambda tmp: hist.save(tmp / "history.json"))
    record = {"notebook": dry.get("notebook"), "key": config_key(cfg), "method": cfg.method, "dataset": cfg.dataset,
              "model": cfg.model, "rounds": cfg.rounds, "clients_per_round": cfg.clients_per_round or cfg.n_clients,
              "sec_per_round": statistics.median(r["seconds"] for r in hist.rows[1:] or hist.rows),  # round 0 warms up
              "peak_mem_MB": _peak_memory_mb(hist.env.get("device", "cpu")) if trained else None,
              "device": hist.env.get("device")}
    with open(dry["log"], "a") as f:
        f.write(json.dumps(record) + "\n")
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
    if dry_run_settings() is not None:  # a dry run times each config alone, in this process
        return [run_or_load(cfg, root=root, experiment=experiment, progress=False) for cfg in cfgs]
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
