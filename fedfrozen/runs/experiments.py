"""Experiments: the run-or-load cache, parallel runs, and resumption after an interruption.

`run_or_load(cfg)` keys a run by the hash of its config and the package version and stores it
under `results/<experiment>/<key>/` (config.json, history.json, env.json and, written last,
digest.json: their SHA-256), so a notebook re-run loads instead of training. A run directory
appears only once complete. While a run trains, a checkpoint is kept in
`results/<experiment>/.<key>.partial/` (once a minute by default): if the process dies (a Colab
disconnect, a killed GPU job), running the same config again continues from it, and the History
equals an uninterrupted run's.

Nothing is served on trust: a cached entry is used only if its files match its digest, its
config is the one asked for and its History has every round the config implies (or stops at a
divergence); anything else (short, malformed, a directory, edited) is moved aside with a warning
naming it and trained again. A checkpoint that cannot be read is moved aside the same way and the
run starts from scratch. One process trains a config at a time: an advisory lock per key
(`.<key>.lock`) makes a second process with the same config wait and load the first one's
result; different configs never wait for each other.

Under `fedfrozen dry-run` (fedfrozen.runs.dryrun) the environment variable FEDFROZEN_DRY_RUN is set
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
import tempfile
import time
import warnings
from pathlib import Path

from ..base.history import History
from ..base.io import atomic_dir, dry_run_settings, file_lock, log_run, project_root
from ..engine.loop import CheckpointError, run
from ..inputs import data

__all__ = ["run_or_load", "run_many", "config_key", "asked", "results_root", "CHECKPOINT_SECONDS", "CheckpointError",
           "RunningElsewhere", "BACKENDS"]

CHECKPOINT_SECONDS = 60.0  # default interval of the partial-run checkpoint


def config_key(cfg) -> str:
    """Hash of the config's non-default fields and the package version (12 hex digits); `data_root` and `download`
    (where the data is found) are left out, so one run has one key wherever it is started from.

    Fields at their default value are left out, so adding a Config field (with a default that
    keeps the old behaviour) does not invalidate the cache; a method's settings (method_args) enter
    by their flat names (`fedsteer_core`), as when they were Config fields. A method whose results a fix changed
    (Method.results_revision > 0) adds its revision, so its old Histories are not served; the keys
    of every other method stay as they were. A dataset given to ff.data.register adds its version, and Shakespeare
    texts other than the verified release (`data.source_version`: where data_root holds another text, e.g. the smoke
    profile's small one) add their digest, so no run on one text is served for another.
    """
    from .._version import __version__
    from ..engine.config import Config, identity
    from ..inputs.data import source_version
    from ..inputs.data import version as data_version
    from ..methods import flat_names, results_revision, settings_class

    defaults = _defaults(Config)
    d = identity(cfg.to_dict())  # where the data is found is not part of a run's identity (config.WHERE_FIELDS)
    # the method's own settings by their flat names (fedsteer_core: the Config fields of earlier versions), so
    # the keys of runs cached before method_args stay what they were
    names = flat_names(settings_class(cfg.method))
    d.update({names[k]: v for k, v in d.pop("method_args").items()})
    # (the components' changed settings are in d by flat name already: the Config fields they were)
    changed = {k: v for k, v in d.items() if k not in defaults or defaults[k] != v}
    content = {"config": changed, "version": __version__}
    revision = results_revision(cfg.method)
    if revision:
        content["revision"] = revision
    if data_version(cfg.dataset) is not None:  # a registered dataset: its loader's version (ff.data.register)
        content["dataset_version"] = data_version(cfg.dataset)
    source = source_version(cfg)
    if source is not None:  # texts other than the Shakespeare release (e.g. the smoke profile's small text)
        content["dataset_source"] = source
    payload = json.dumps(content, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def _defaults(config_cls) -> dict:
    import dataclasses

    defaults = {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
                for f in dataclasses.fields(config_cls)}
    return defaults | {"freeze": list(defaults["freeze"])}


_ASKED: dict = {}  # cache key -> (experiment, Config) of every run this process asked run_or_load for


def asked(key: str) -> tuple:
    """(experiment, Config) of the run with cache key `key` that this process asked `run_or_load` (or `run_many`)
    for: what `ff.plots.save_per_seed` commits beside a per-seed row. A KeyError names a key never asked for."""
    if key not in _ASKED:
        raise KeyError(f"no run with key {key!r} was asked for in this process (per-seed rows come from "
                       f"run_or_load/run_many; {len(_ASKED)} keys were)")
    return _ASKED[key]


def results_root(root=None) -> Path:
    """`root`, or by default the project's results/ folder (so notebooks, run from notebooks/,
    share one cache with scripts run from the project root)."""
    return Path(root) if root is not None else project_root() / "results"


_FILES = ("config.json", "env.json", "history.json")


def _digest(folder: Path, files=_FILES) -> dict:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in files
            if (folder / name).exists()}


def _store(folder: Path, cfg, hist: History, files=_FILES) -> None:
    """Write the entry atomically: its files, then digest.json over them."""
    def fill(tmp: Path):
        if "config.json" in files:
            (tmp / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1, sort_keys=True))
        if "env.json" in files:
            (tmp / "env.json").write_text(json.dumps(hist.env, indent=1, sort_keys=True))
        hist.save(tmp / "history.json")
        (tmp / "digest.json").write_text(json.dumps(_digest(tmp, files), indent=1, sort_keys=True))

    atomic_dir(folder, fill)


def _problem(folder: Path, cfg, files=_FILES) -> tuple[str | None, History | None]:
    """(what is wrong with the cached entry, or None; its History when it is sound)."""
    if not folder.is_dir():
        return f"{folder} is not a folder", None
    try:
        digest = json.loads((folder / "digest.json").read_text())
    except (OSError, ValueError) as e:
        return f"no readable digest.json ({type(e).__name__})", None
    if not isinstance(digest, dict) or sorted(digest) != sorted(files):
        return "digest.json does not list the entry's files", None
    try:
        now = _digest(folder, files)
    except OSError as e:
        return f"a file cannot be read ({e})", None
    changed = sorted(n for n in files if now.get(n) != digest[n])
    if changed:
        return f"{', '.join(changed)} changed since the digest was written (edited or damaged)", None
    try:
        hist = History.load(folder / "history.json")
    except (OSError, ValueError) as e:
        return str(e), None
    from ..engine.config import identity, stored_form

    if json.loads(json.dumps(identity(stored_form(hist.config)))) != json.loads(json.dumps(identity(cfg.to_dict()))):
        return "its History was written by another config", None
    rounds = [row.get("round") if isinstance(row, dict) else None for row in hist.rows]
    expected = list(range(len(rounds) if hist.diverged else cfg.rounds))
    if rounds != expected or len(rounds) > cfg.rounds:
        return (f"its History has rounds {rounds[:3]}{'...' if len(rounds) > 3 else ''} ({len(rounds)} rows) "
                f"where the config implies {cfg.rounds}"), None
    return None, hist


def _move_aside(path: Path, why: str, what: str) -> Path:
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    os.replace(path, aside)
    warnings.warn(f"{what} {path}: {why}; moved it to {aside}", RuntimeWarning, stacklevel=3)
    return aside


def _load_cached(folder: Path, cfg, files=_FILES) -> History | None:
    """The stored History in `folder` if it is sound, None if there is none; a damaged one is moved aside."""
    if not os.path.lexists(folder):
        return None
    why, hist = _problem(folder, cfg, files)
    if why is not None:
        _move_aside(folder, why + " - training this config again", "cached result")
        return None
    hist.cached = True
    return hist


class RunningElsewhere(RuntimeError):
    """Another process holds the lock of this config (run_or_load with wait=False)."""


def _writable(root: Path) -> None:
    """Create `root` or fail now, naming it, rather than after the training."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=root, prefix=".write-test.", delete=True)
        probe.close()
    except OSError as e:
        raise ValueError(f"results root {str(root)!r} is not a writable folder ({type(e).__name__}: {e})") from None


def _clear_leftovers(folder: Path) -> None:
    """Temporary folders and files of this key left by a killed process (called under the key's lock)."""
    for stale in folder.parent.glob(f".{folder.name}.*"):
        if stale.name.endswith((".lock", ".partial")):
            continue
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
    partial = _partial(folder).parent
    for stale in partial.glob(".*.tmp") if partial.is_dir() else ():
        stale.unlink(missing_ok=True)


def partial_checkpoint(cfg, root=None, experiment: str = "default") -> Path:
    """Where an unfinished run of `cfg` keeps its checkpoint."""
    return _partial(results_root(root) / experiment / config_key(cfg))


def _partial(folder: Path) -> Path:
    return folder.parent / f".{folder.name}.partial" / "checkpoint.pt"


def run_or_load(cfg, root=None, experiment: str = "default", force: bool = False, progress: bool = True,
                checkpoint_seconds: float = CHECKPOINT_SECONDS, wait: bool = True):
    """The History of `cfg`: loaded from `root/experiment/<key>/` if there and sound, else trained and stored.

    `force=True` trains again from scratch and replaces the stored result. An interrupted earlier
    attempt is resumed from its checkpoint (written every `checkpoint_seconds`; 0 writes one every
    round). While another process trains the same config, this one waits for it and loads its result
    (`wait=False`: raises RunningElsewhere instead). The returned History has `.cached` True when it was
    loaded.
    """
    key = config_key(cfg)
    _ASKED[key] = (experiment, cfg)
    dry = dry_run_settings()
    if dry is not None:
        return _dry_run(cfg, dry, root, experiment)
    folder = results_root(root) / experiment / key
    if force or not (folder / "history.json").is_file():  # it will train: its data must be there (a cached run
        data.require(cfg.dataset, cfg.data_root, cfg.download)  # loads without them)
    _writable(folder.parent)

    def waiting():
        warnings.warn(f"another process is training this config ({folder}); waiting for it", RuntimeWarning,
                      stacklevel=4)

    try:
        with file_lock(folder.parent / f".{key}.lock", wait=wait, on_wait=waiting, remove=True):
            hist = _run_or_load_locked(cfg, folder, force, progress, checkpoint_seconds)
    except BlockingIOError:
        raise RunningElsewhere(f"another process is training this config ({folder}); not waiting") from None
    log_run(key, experiment, hist)
    return hist


def _run_or_load_locked(cfg, folder: Path, force: bool, progress: bool, checkpoint_seconds: float) -> History:
    if not force:
        hist = _load_cached(folder, cfg)
        if hist is not None:
            return hist
    _clear_leftovers(folder)
    ckpt = _partial(folder)
    if force and ckpt.parent.exists():
        shutil.rmtree(ckpt.parent)
    resume = ckpt if ckpt.exists() else None
    try:
        hist = run(cfg, progress=progress, resume_from=resume, checkpoint=ckpt, checkpoint_seconds=checkpoint_seconds)
    except CheckpointError as e:
        _move_aside(ckpt.parent, f"{e} - starting this run from scratch", "checkpoint")
        resume = None
        hist = run(cfg, progress=progress, checkpoint=ckpt, checkpoint_seconds=checkpoint_seconds)
    _store(folder, cfg, hist)
    shutil.rmtree(ckpt.parent, ignore_errors=True)
    hist.resumed_from = None if resume is None else str(resume)
    return hist


def _shortened(cfg, dry: dict):
    """`cfg` cut to dry["rounds"] rounds, both stages kept when it has two (the tiny model, if asked for,
    comes from fedfrozen.nets.models.create, so that a notebook's own models are tiny too)."""
    from ..methods import freeze_round

    rounds = dry["rounds"]
    two_stage = freeze_round(cfg) is not None
    changes = dict(rounds=rounds, warmup_rounds=min(cfg.warmup_rounds, 1) if two_stage else rounds, eval_every=1,
                   lr_warmup_rounds=0, server_pretrain_epochs=min(cfg.server_pretrain_epochs, 1),
                   eval_window=min(cfg.eval_window, rounds), pretrain_epochs=min(cfg.pretrain_epochs, 1))
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
    hist = _load_cached(folder, short, files=("history.json",))
    trained = hist is None
    if trained:
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        hist = run(short, progress=False)
        _store(folder, short, hist, files=("history.json",))
    record = {"notebook": dry.get("notebook"), "key": config_key(cfg), "method": cfg.method, "dataset": cfg.dataset,
              "model": cfg.model, "rounds": cfg.rounds, "clients_per_round": cfg.clients_per_round or cfg.n_clients,
              "sec_per_round": statistics.median(r["seconds"] for r in hist.rows[1:] or hist.rows),  # round 0 warms up
              "peak_mem_MB": _peak_memory_mb(hist.env.get("device", "cpu")) if trained else None,
              "device": hist.env.get("device"), "experiment": experiment, "config": cfg.to_dict()}
    with open(dry["log"], "a") as f:
        f.write(json.dumps(record) + "\n")
    return hist


def _ray_task(cfg, root, experiment, checkpoint_seconds, datasets=None) -> dict:
    """Worker (a pool process or a Ray task): one cached run on one thread (module level so that spawned processes
    and Ray workers import it), its History as a dict (a Ray driver stores it where the worker's root is not its).
    `datasets`: the registered datasets the run needs, {name: (version, train, test)} (`_shipped`)."""
    import torch

    from ..inputs import data

    for name, (version, train, test) in (datasets or {}).items():  # a worker process starts with none registered
        data.register(name, lambda train=train, test=test: (train, test), version=version, replace=True)
    torch.set_num_threads(1)
    return run_or_load(cfg, root=root, experiment=experiment, progress=False,
                       checkpoint_seconds=checkpoint_seconds).to_dict()


BACKENDS = ("local", "ray")


def _shipped(cfg) -> dict | None:
    """What a worker needs to know of a registered dataset of `cfg`: its version and loaded splits (a loader defined
    in a notebook cannot be sent to another process; its output can). None for a built-in."""
    from ..inputs import data

    if data.version(cfg.dataset) is None:
        return None
    return {cfg.dataset: (data.version(cfg.dataset), *data.load(cfg.dataset))}


def _work(cfg) -> float:
    """A run's local work, to train the longest runs first (sorted() keeps the given order among equals): rounds times
    local epochs, or local steps over a nominal six a round."""
    per_round = cfg.local_epochs if cfg.local_steps is None else cfg.local_steps / 6
    return cfg.rounds * (per_round or 1)


def _bodies_first(cfgs: list) -> list:
    """`cfgs` (longest first) reordered for a parallel grid: first one run for each pre-trained body that is not yet
    cached (it trains the body), then the runs that need no body to be made, then the other runs of those bodies;
    each group in its given order. A worker then never waits on a body that another is training (the lock of
    pretrain.pretrained_state) while runs that need none are left."""
    from ..engine import pretrain

    makers, free, after, seen = [], [], [], set()
    for cfg in cfgs:
        key = pretrain.weights_key(cfg) if cfg.init == "pretrained" else None
        if key is None or (pretrain.cache_dir() / f"{key}.pt").is_file():
            free.append(cfg)
        elif key in seen:
            after.append(cfg)
        else:
            seen.add(key)
            makers.append(cfg)
    return makers + free + after


def run_many(cfgs, root=None, experiment: str = "default", workers: int | None = None,
             progress: bool = True, backend: str | None = None, checkpoint_seconds: float = CHECKPOINT_SECONDS) -> list:
    """Histories of many configs, in order: cached ones loaded, the rest trained in parallel.

    backend "local": each missing run trains in its own process on one thread (on small models one thread per
    run and one run per core beats one run on all cores); `workers` defaults to the number of cores; workers=1
    trains in this process. Scripts that call it need the `if __name__ == "__main__":` guard (workers are
    spawned); notebooks do not. backend "ray": each missing run is one Ray task (1 CPU; on CUDA, FEDFROZEN_RAY_GPUS
    GPUs, default 1) on the cluster at FEDFROZEN_RAY_ADDRESS, or on a local Ray instance of `workers` CPUs when it
    is unset (fedfrozen.runs.cluster, docs/cluster.md). backend None: "ray" when FEDFROZEN_RAY_ADDRESS is set, else
    "local" (so notebooks and `fedfrozen reproduce --ray ADDRESS` use a cluster unchanged). Either way cached runs
    are never sent, interrupted runs resume from their checkpoints (kept every `checkpoint_seconds`), and the
    Histories are the ones a single process computes.
    """
    from . import cluster

    cfgs = list(cfgs)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be an integer >= 1 (or None: one per core); got {workers!r}")
    if backend is None:
        backend = "ray" if os.environ.get(cluster.ADDRESS_ENV) else "local"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)} (or None); got {backend!r}")
    root = str(results_root(root))
    if dry_run_settings() is not None:  # a dry run times each config alone, in this process
        return [run_or_load(cfg, root=root, experiment=experiment, progress=False) for cfg in cfgs]
    missing = {}
    for cfg in sorted(cfgs, key=_work, reverse=True):  # the longest first: no long run left alone at the end
        if _load_cached(Path(root) / experiment / config_key(cfg), cfg) is None:
            missing.setdefault(config_key(cfg), cfg)
    key_of = {id(cfg): key for key, cfg in missing.items()}  # (a key is not computed twice: it may read the data)
    missing = {key_of[id(cfg)]: cfg for cfg in _bodies_first(list(missing.values()))}  # bodies' makers first
    workers = workers or os.cpu_count() or 1
    if missing and backend == "ray":
        _run_on_ray(list(missing.values()), root, experiment, workers, progress, checkpoint_seconds)
    elif missing and (workers == 1 or len(missing) == 1):
        for cfg in missing.values():
            run_or_load(cfg, root=root, experiment=experiment, progress=progress, checkpoint_seconds=checkpoint_seconds)
    elif missing:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        from ..base.progress import progress_bar

        jobs = [(cfg, root, experiment, checkpoint_seconds, _shipped(cfg)) for cfg in missing.values()]
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=mp.get_context("spawn")) as pool:
            futures = [pool.submit(_ray_task, *job) for job in jobs]
            for f in progress_bar(as_completed(futures), progress, total=len(futures), desc=f"{experiment}: runs",
                                  leave=False):
                f.result()
    return [run_or_load(cfg, root=root, experiment=experiment, progress=False) for cfg in cfgs]


def _run_on_ray(cfgs: list, root: str, experiment: str, workers: int, progress: bool, checkpoint_seconds) -> None:
    """The missing runs as Ray tasks; a History a worker could not store where this process sees it is stored
    here; failures are collected and reported together, naming each run, after the others finished."""
    from . import cluster

    text = os.environ.get(cluster.GPUS_ENV) or "1"
    try:
        per_gpu = float(text)
    except ValueError:
        per_gpu = 0.0
    if not per_gpu > 0:
        raise ValueError(f"{cluster.GPUS_ENV} must be a number > 0 (the GPUs a run on CUDA asks for); got {text!r}")

    def keep(i: int, hist: dict, shared: bool) -> None:
        folder = Path(root) / experiment / config_key(cfgs[i])
        if not shared and _load_cached(folder, cfgs[i]) is None:
            _store(folder, cfgs[i], History.from_dict(hist))

    failed = cluster.run_tasks(_ray_task, [(cfg, root, experiment, checkpoint_seconds, _shipped(cfg)) for cfg in cfgs],
                               address=os.environ.get(cluster.ADDRESS_ENV) or None, num_cpus=workers, root=root,
                               gpus=[per_gpu if cfg.device in ("cuda", "auto") else 0.0 for cfg in cfgs],
                               progress=progress, desc=f"{experiment}: runs", on_result=keep)
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(cfgs)} runs failed on Ray (the others finished and are cached): "
                           + "; ".join(f"{config_key(cfgs[i])} ({cfgs[i].method}, seed {cfgs[i].seed}): {error}"
                                       for i, error in failed))
