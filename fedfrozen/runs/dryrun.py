"""`fedfrozen dry-run`: every paper-profile notebook, every config, two rounds, on a fake CIFAR.

A long GPU job that fails in hour three on a typo costs the hours. The dry run copies the
notebooks into a temporary project, writes a learnable fake CIFAR-10 and CIFAR-100 there in
torchvision's format (fedfrozen.inputs.data.write_fake_cifar), and executes each notebook that trains
or loads paper data under the paper profile with papermill, with FEDFROZEN_DRY_RUN set: every
run is cut to `rounds` rounds (both stages kept), optionally on a tiny model, timed and logged
(fedfrozen.runs.experiments). It then prints, per notebook: distinct configs, median seconds per
round, peak memory, and the projected hours of the full profile (sum over configs of rounds ×
seconds per round; evaluation every round in the dry run makes this an overestimate of the
evaluation share). With the real model on a GPU the projection is the one to plan with; with
`tiny=True` on a CPU it only proves that every path runs.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from ..base.io import DRY_RUN_ENV, KERNEL_ARGS, THREADS_ENV, notebooks, project_root
from ..inputs.data import write_fake_cifar
from ..inputs.shakespeare import write_sample

__all__ = ["dry_run", "TINY_MODEL", "format_table"]

TINY_MODEL = dict(embed_dim=16, depth=1, num_heads=2)


def write_data(root: Path, profile: str, tiny: bool) -> None:
    """The data the dry run's notebooks read, under `root`. The paper profile's CIFARs as fake images of the real
    sizes (50,000 / 10,000), so seconds per round project; --tiny: 20,000 training images, enough for 100
    Dirichlet(0.05) clients of two samples or more (notebook 02). --tiny also writes Shakespeare's small text
    (shakespeare.write_sample, 12 roles a play: the paper profile's 349 roles fit): notebook 14 then downloads
    nothing (with the release absent it fetched 5 MB and evaluated each config on 860,000 windows); its ~900k
    windows still take it over 20 minutes.
    Without --tiny, notebook 14 reads the release (fetched into `root` by its notebook when absent)."""
    for name, classes in (("cifar10", 10), ("cifar100", 100)) if profile == "paper" else ():
        per_class, test_per_class = (20_000 // classes, 5) if tiny else (50_000 // classes, 10_000 // classes)
        write_fake_cifar(name, root, per_class=per_class, test_per_class=test_per_class)
    if tiny:  # as many roles as the paper profile's federation (349) outside the server's plays: 12 in each play
        write_sample(root, speeches=40, roles_per_play=12)


TRAINS = ("ff.Config(", "ff.data.load(", "ff.run_many(")  # a notebook that builds runs (a study's too) or loads data


def _executions(books: list[Path]) -> list[tuple[Path, dict]]:
    """(notebook, extra parameters) to run: each that trains or reads paper data; 03 also on CIFAR-100."""
    out = []
    for nb in books:
        text = nb.read_text()
        if not any(call in text for call in TRAINS):
            continue  # synthetic only (the linear-attention theory): nothing of the paper path
        out.append((nb, {}))
        if "paper_dataset" in text:
            out.append((nb, {"paper_dataset": "cifar100"}))
    return out


def _summarise(records: list[dict]) -> dict:
    by_key = {}
    for r in records:
        by_key.setdefault(r["key"], r)
    recs = list(by_key.values())
    secs = [r["sec_per_round"] for r in recs]
    mems = [r["peak_mem_MB"] for r in records if r["peak_mem_MB"] is not None]
    return {"configs": len(recs), "sec_per_round": sorted(secs)[len(secs) // 2] if secs else float("nan"),
            "peak_mem_MB": max(mems) if mems else float("nan"),
            "projected_hours": sum(r["rounds"] * r["sec_per_round"] for r in recs) / 3600,
            "device": recs[0]["device"] if recs else None}


def _execute(nb: str, out: str, profile: str, extra: dict, settings: dict, kernel: str,
             threads: str | None = None) -> tuple[str | None, float]:
    """Execute one notebook with papermill under the dry-run settings (in this process's environment, which the
    kernel inherits; `threads` sets FEDFROZEN_THREADS there); (the error or None, seconds)."""
    import papermill as pm

    if threads:
        os.environ[THREADS_ENV] = threads
    old = os.environ.get(DRY_RUN_ENV)
    os.environ[DRY_RUN_ENV] = json.dumps(settings)
    t0 = time.perf_counter()
    error = None
    try:
        pm.execute_notebook(nb, out, parameters={"profile": profile, **extra}, cwd=str(Path(nb).parent),
                            kernel_name=kernel, progress_bar=False, extra_arguments=KERNEL_ARGS)
    except Exception as e:  # noqa: BLE001 - papermill raises PapermillExecutionError with the failing cell's error
        lines = str(e).strip().splitlines()
        error = f"{type(e).__name__}: {lines[-1][:200] if lines else ''}"
    finally:
        if old is None:
            os.environ.pop(DRY_RUN_ENV, None)
        else:
            os.environ[DRY_RUN_ENV] = old
    return error, time.perf_counter() - t0


def dry_run(profile: str = "paper", tiny: bool = False, rounds: int = 2, only: str | None = None,
            kernel: str = "python3", keep: str | None = None, progress=print, workers: int = 1) -> list[dict]:
    """Run the dry run; returns one row per notebook execution (name, status, seconds, summary, error), in the
    notebooks' order. `workers` > 1 executes that many notebooks at once (each in its own process and kernel;
    their seconds per round then share the cores, so use 1 for the projection). With several workers each
    kernel's torch runs on one thread unless FEDFROZEN_THREADS says otherwise: two kernels of one thread per core
    each, not of every core each (oversubscribed, torch's threads spin against each other: measured 2-3x slower)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    if profile not in ("paper", "cpu"):
        raise ValueError(f"the dry run checks the paper profile (or the cpu one: every config it would run, e.g. to "
                         f"list them, tools/configs.py); got profile {profile!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 2:
        raise ValueError(f"rounds must be an integer >= 2 (both stages); got {rounds!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1; got {workers!r}")
    books = notebooks(only)
    tmp = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="fedfrozen-dry-run-"))
    try:
        (tmp / "notebooks").mkdir(parents=True, exist_ok=True)
        shutil.copy(project_root() / "pyproject.toml", tmp / "pyproject.toml")
        for nb in books:
            shutil.copy(nb, tmp / "notebooks" / nb.name)
        write_data(tmp / "data", profile, tiny)
        jobs = []
        for i, (nb, extra) in enumerate(_executions([tmp / "notebooks" / b.name for b in books])):
            label = nb.name + "".join(f" ({k}={v})" for k, v in extra.items())
            log = tmp / f"dry_run_{i}.jsonl"  # one log per execution: executions may run at once
            settings = dict(log=str(log), rounds=rounds, model_kwargs=TINY_MODEL if tiny else None, one_seed=tiny,
                            notebook=label)
            out = tmp / f"executed_{nb.stem}{'_' + '_'.join(map(str, extra.values())) if extra else ''}.ipynb"
            jobs.append((label, log, (str(nb), str(out), profile, extra, settings, kernel)))

        def row(label, log, error, seconds):
            records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
            r = {"notebook": label, "status": "FAILED" if error else "ok", "seconds": seconds,
                 **_summarise([x for x in records if x["notebook"] == label]), "error": error}
            progress(format_row(r))
            return r

        if workers == 1:
            return [row(label, log, *_execute(*args)) for label, log, args in jobs]
        threads = os.environ.get(THREADS_ENV) or "1"
        with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            futures = [pool.submit(_execute, *args, threads) for _, _, args in jobs]
            return [row(label, log, *f.result()) for (label, log, _), f in zip(jobs, futures)]
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


HEADER = (f"{'notebook':44s} {'status':6s} {'configs':>7s} {'s/round':>8s} {'peak MB':>8s} {'proj. h':>8s} "
          f"{'wall s':>7s}")


def _num(x: float, fmt: str, width: int = 8) -> str:
    return f"{x:{width}{fmt}}" if x == x else f"{'n/a':>{width}s}"  # NaN: nothing trained (all runs cached)


def format_row(r: dict) -> str:
    text = (f"{r['notebook']:44s} {r['status']:6s} {r['configs']:7d} {_num(r['sec_per_round'], '.3f')} "
            f"{_num(r['peak_mem_MB'], '.0f')} {r['projected_hours']:8.2f} {r['seconds']:7.1f}")
    return text + (f"   {r['error']}" if r["error"] else "")


def format_table(rows: list[dict]) -> str:
    """The dry run's table, with the total projected hours and the device it was measured on."""
    total = sum(r["projected_hours"] for r in rows)
    device = next((r["device"] for r in rows if r["device"]), "n/a")
    failed = sum(r["status"] != "ok" for r in rows)
    return "\n".join([HEADER, *map(format_row, rows),
                      f"{len(rows)} notebook runs, {failed} failed; projected {total:.2f} h in all on {device}"])
