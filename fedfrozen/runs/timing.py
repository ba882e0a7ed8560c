"""How long the notebooks take from an empty cache on this machine, measured from the runs they use
(`fedfrozen budget`).

    fedfrozen budget              # every notebook, in order, at the cpu profile
    fedfrozen budget --only 03,04 # some of them (runs of the earlier ones still count as already made)

Each notebook is executed (nbclient; its outputs are not written back, and its figures and tables go to a temp dir,
FEDFROZEN_FIGURES, not to figures/) with FEDFROZEN_RUN_LOG set, so that every run it loads or trains is logged with
its training time: the sum of its rounds' seconds, measured when it was trained (fedfrozen.base.io.log_run). A run
counts for the first notebook, in order, that uses it (later notebooks reuse it through the cache). From an empty
cache a notebook trains its new runs `workers` at a time (fedfrozen.run_many: one per core), so its time is the sum
of their seconds over the workers, plus its execution from the cache (measured here) and the pre-training of any
pretrained start (not counted: a few minutes once per setting). Runs not in the cache are trained by the execution
and their time measured as they are, so on an empty cache this is the end-to-end reproduction.

The paper's notebooks (PAPER) and all of them have a budget on the 2-core machine: BUDGET_HOURS
(docs/cpu_profile.md, "Time").

A run's recorded seconds are what it took when it was trained, tests or other runs beside it included (a five-epoch
run recorded 407 s took 175 s with only its pair running). So it also gives an idle estimate: each run at
IDLE_ROUND seconds a round plus IDLE_EPOCH per local epoch, measured on this machine with two 120-round runs at a
time and nothing else running (one epoch: 46 s a run; five: 175 s; benchmarks/round_time.py measures a round).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from ..base.io import FIGURES_ENV, KERNEL_ARGS, RUN_LOG_ENV
from .experiments import results_root

__all__ = ["PAPER", "BUDGET_HOURS", "IDLE_ROUND", "IDLE_EPOCH", "MODEL_COST", "idle_seconds", "runs_of", "execute",
           "measure"]

PAPER = ("00", "03", "04", "05", "06", "07")  # the notebooks of the paper's tables and figures
# notebook 03's controlled cells (§ 3: both rates for both arms, a body per seed, issue "close the confounds") took
# the paper's notebooks past their earlier 3 hours; `fedfrozen reproduce --ray` spreads the runs over a cluster
BUDGET_HOURS = {"paper": 6.0, "all": 19.0}  # all: 12 added ~1.4 h idle, 13 ~3.9 h (233 runs, 45 of them
# plain SGD at 5 epochs x 240 rounds), 14 ~6.1 h (183 text runs; its 16 pre-trained bodies, ~1 h more, are not counted)
IDLE_ROUND, IDLE_EPOCH = 0.114, 0.269  # seconds a round: evaluation and overhead; each local epoch (measured above)
# notebook 12's other models (and 13's patch-4 ViT) against the ViT the idle rates were measured on
# (benchmarks/model_cost.py, medians of 3 turns side by side): (training step, evaluation pass); a model not listed
# costs what the ViT does
MODEL_COST = {"linear_vit": (0.88, 0.86), "swin_tiny_patch4_window7_224": (1.43, 2.92),
              "cait_xxs24_224": (1.33, 1.40),
              "vit_fmnist_p4": (1.98, 4.58),  # notebook 13's 49 tokens (measured with two runs and tests beside it)
              # notebook 14's text model: a step 2.22x (benchmarks/text_cost.py); the evaluation factor is fitted to
              # its measured runs (seeds 11-14's 24, two at a time, nothing else, AMD EPYC: 240 s a run), since a
              # per-evaluation factor (3.1x) priced 135 s and left out the 50,000-window final pass
              "char_transformer": (2.22, 12.3)}


def idle_seconds(experiment: str, key: str) -> float:
    """A run's time on the idle machine, two at a time (IDLE_ROUND, IDLE_EPOCH, scaled by MODEL_COST), from its
    stored config. Local steps count as epochs of the cpu profile's clients (about 6 steps an epoch), whatever the
    client's size (1,000 clients: 6 steps over ~11 images)."""
    d = json.loads((results_root() / experiment / key / "config.json").read_text())
    d = d.get("config", d)
    epochs = d.get("local_epochs") or 1
    if d.get("local_steps"):  # about 6 steps make an epoch at the cpu profile
        epochs = d["local_steps"] / 6
    train, evaluate = MODEL_COST.get(d.get("model"), (1.0, 1.0))
    return d.get("rounds", 60) * (IDLE_ROUND * evaluate + IDLE_EPOCH * epochs * train)


def runs_of(log: Path) -> tuple[dict, int]:
    """((experiment, key) -> seconds of every run in a run log, how many were trained): a run logged twice, by the
    worker that trained it and by its parent that loaded it, counts once."""
    out, trained = {}, 0
    for line in log.read_text().splitlines() if log.exists() else []:
        rec = json.loads(line)
        out[(rec["experiment"], rec["key"])] = max(out.get((rec["experiment"], rec["key"]), 0.0), rec["seconds"])
        trained += rec["cached"] is False
    return out, trained


def execute(path: Path, log: Path, profile: str = "cpu") -> float:
    """Execute the notebook at `profile` (the budget's is the cpu profile's) with its runs logged to `log` and its
    figures and tables written beside it (FEDFROZEN_FIGURES: the committed figures/ stay as they are); returns the
    wall seconds. The environment the kernel reads is this process's only while it runs."""
    import nbclient
    import nbformat

    env = {"FEDFROZEN_PROFILE": profile, "FEDFROZEN_PROGRESS": "0", RUN_LOG_ENV: str(log),
           FIGURES_ENV: str(log.parent / "figures")}
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        nb = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        nbclient.NotebookClient(nb, kernel_name="python3", timeout=6 * 3600, extra_arguments=KERNEL_ARGS,
                                resources={"metadata": {"path": str(path.parent)}}).execute()
        return time.perf_counter() - start
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def measure(books: list[Path], workers: int, print_row=print, profile: str = "cpu") -> dict:
    """Execute `books` (notebook paths, in order) at `profile`, each run counted for the first that uses it; prints
    one row per notebook (`print_row`) and returns {"paper"|"all": (minutes as recorded, idle minutes)}."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1; got {workers!r}")
    seen, totals, idle = set(), {"paper": 0.0, "all": 0.0}, {"paper": 0.0, "all": 0.0}
    print_row(f"{'notebook':<34} {'runs':>5} {'new':>5} {'trained now':>11} {'run hours':>9} {'exec s':>7} "
              f"{'minutes':>8} {'idle min':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for path in books:
            log = Path(tmp) / f"{path.stem}.jsonl"
            wall = execute(path, log, profile)
            runs, trained = runs_of(log)
            new = {k: s for k, s in runs.items() if k not in seen}
            seen.update(runs)
            run_seconds = sum(new.values())
            minutes = (run_seconds / workers + wall) / 60
            calm = (sum(idle_seconds(*k) for k in new) / workers + wall) / 60
            for name in ("all", "paper") if path.name[:2] in PAPER else ("all",):
                totals[name] += minutes
                idle[name] += calm
            print_row(f"{path.stem:<34} {len(runs):>5} {len(new):>5} {trained:>11} {run_seconds / 3600:>9.2f} "
                      f"{wall:>7.0f} {minutes:>8.1f} {calm:>8.1f}")
    for name, minutes in totals.items():
        print_row(f"{name}: {minutes / 60:.2f} h from an empty cache with {workers} workers as recorded, "
                  f"{idle[name] / 60:.2f} h idle (budget {BUDGET_HOURS[name]:g} h)")
    return {name: (totals[name], idle[name]) for name in totals}
