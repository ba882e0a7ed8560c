"""A grid of runs on a Ray cluster: the `backend="ray"` of `ff.run_many` (docs/cluster.md).

Each missing run is one Ray task; cached runs are never sent. A task runs `run_or_load` on the worker, into the
same results root, so the cache, its digests, the per-key locks and the checkpoints work as they do on one
machine, and returns the History to the driver. With a **shared** results root (NFS, a cluster filesystem) a
worker that is lost mid-run is replaced by Ray's retry, which resumes from the run's checkpoint; with a root the
workers do not share, the driver writes each returned History into its own root, and a lost worker's run starts
again from round 0 on its retry (no checkpoint survives it): `run_tasks` says so once when it sees it.

This module knows nothing of runs: `ff.experiments.run_many` gives it a module-level task function and its
arguments. Ray is optional: `pip install "fedfrozen[cluster]"` (or `[dev]`, whose Flower brings it).
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
import warnings
from pathlib import Path

from ..base.progress import progress_bar

__all__ = ["ADDRESS_ENV", "GPUS_ENV", "RETRIES", "ray_module", "connected", "run_tasks", "check_address", "probe"]

ADDRESS_ENV = "FEDFROZEN_RAY_ADDRESS"  # auto | host:port | ray://host:port: run_many uses that cluster by default
GPUS_ENV = "FEDFROZEN_RAY_GPUS"  # GPUs a run on CUDA asks for (default 1; a fraction shares a GPU)
RETRIES = 3  # Ray retries a task whose worker died this many times (a task that raises is not retried)


def ray_module():
    """`import ray`, or an ImportError that names the extra that brings it."""
    try:
        import ray
    except ImportError:
        raise ImportError("backend='ray' needs Ray: pip install \"fedfrozen[cluster]\" "
                          "(or \"fedfrozen[dev]\")") from None
    return ray


def check_address(address: str, timeout: float = 3.0) -> None:
    """Fail fast, in one line, when nothing listens at a host:port address (Ray itself would retry for a minute)."""
    if address in ("auto", "local") or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout).close()  # something listens
    except (OSError, ValueError):
        raise ConnectionError(f"no Ray cluster at {address!r} ({ADDRESS_ENV}): start one with `ray start --head` "
                              f"(docs/cluster.md), or unset {ADDRESS_ENV} to run on this machine") from None


@contextlib.contextmanager
def connected(address: str | None, num_cpus: int | None = None):
    """Ray, connected to the cluster at `address`, or to a local instance started here (`address` None or
    "local", with `num_cpus`), and disconnected (the local instance stopped) at the end. A process already
    connected keeps its connection."""
    ray = ray_module()
    if ray.is_initialized():
        yield ray
        return
    if address and address != "local":
        check_address(address)
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError) as e:
            raise ConnectionError(f"no Ray cluster at {address!r} ({ADDRESS_ENV}): {str(e).splitlines()[0]}") from None
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def probe(root: str) -> tuple[str | None, str]:
    """(None, marker) when this process can write into `root` (the marker file it wrote), else (the error, "")."""
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        marker = Path(root) / f".ray-probe-{uuid.uuid4().hex}"
        marker.write_text(str(os.getpid()))
        return None, str(marker)
    except OSError as e:
        return f"{type(e).__name__}: {e}", ""


def _shared_root(ray, root: str) -> bool:
    """Whether a worker can write `root` (else a ValueError naming it) and sees the same folder as this process."""
    error, marker = ray.get(ray.remote(num_cpus=0)(probe).remote(root))
    if error:
        raise ValueError(f"the Ray workers cannot write the results root {root!r} ({error}); give run_many a root "
                         f"on a filesystem every node mounts (docs/cluster.md)")
    shared = Path(marker).is_file()
    if shared:
        Path(marker).unlink(missing_ok=True)
    return shared


def run_tasks(task, jobs: list[tuple], *, address: str | None, num_cpus: int | None, root: str, gpus: list[float],
              progress: bool = True, desc: str = "runs", on_result=None) -> list[tuple[int, str]]:
    """Run `task(*job)` for every job as a Ray task (1 CPU, `gpus[i]` GPUs), `on_result(i, result, shared)` as each
    finishes; returns [(i, error)] for the jobs that raised or lost their worker more than RETRIES times (the
    others still finish). Ctrl-C cancels the tasks still outstanding and re-raises."""
    with connected(address, num_cpus) as ray:
        shared = _shared_root(ray, root)
        if not shared:
            warnings.warn(f"the results root {root!r} is not shared with the Ray workers: each History comes back "
                          f"and is written here, and a run whose worker is lost starts again from round 0 on its "
                          f"retry (no checkpoint survives it); docs/cluster.md", RuntimeWarning, stacklevel=3)
        remote = ray.remote(task)
        res = ray.cluster_resources()
        has_gpu = res.get("GPU", 0) > 0  # a run on device "auto" asks for a GPU only where the cluster has one
        refs = {remote.options(num_cpus=1, num_gpus=g if has_gpu else 0, max_retries=RETRIES,
                               retry_exceptions=False).remote(*job): i
                for i, (job, g) in enumerate(zip(jobs, gpus))}
        label = f"{desc} on Ray ({res.get('CPU', 0):g} CPUs, {res.get('GPU', 0):g} GPUs)"
        failed, pending = [], list(refs)
        bar = progress_bar(range(len(refs)), progress, total=len(refs), desc=label, leave=False)
        ticks = iter(bar)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    i = refs[ref]
                    try:
                        result = ray.get(ref)
                    except Exception as e:  # the task raised, or its worker died RETRIES + 1 times
                        failed.append((i, _one_line(e)))
                    else:
                        if on_result is not None:
                            on_result(i, result, shared)
                    next(ticks, None)
        except KeyboardInterrupt:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        finally:
            close = getattr(bar, "close", None)
            if close:
                close()
    return failed


def _one_line(e: Exception) -> str:
    """The cause of a Ray task's failure in one line (the last line of the task's own traceback)."""
    cause = getattr(e, "cause", None)
    if cause is not None:
        return f"{type(cause).__name__}: {cause}".splitlines()[0]
    lines = [line for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"
