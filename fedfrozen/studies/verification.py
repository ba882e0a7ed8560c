"""`fedfrozen verify` / `ff.verify`: the committed verdicts, re-judged on your machine.

Float results depend on the CPU's kernels: the same config and seed give other digits on another CPU (about a point of
late accuracy after 120 non-IID rounds), so no committed number can be promised to the digit. What must travel is the
verdict. `verify("04")` samples comparisons of notebook 04's verdict table (`figures/04_verdicts.csv`), retrains every
run of their arms on the first `seeds` seeds from the committed configs (`figures/04_configs.jsonl`; cached and
resumable like any run, two at a time by default), and judges each comparison twice by the paired rule on the same
seeds: on the committed per-seed values (`figures/04_per_seed.csv`) and on the retrained ones. A comparison *agrees*
when both d's have the same sign (or neither interval excludes 0, where the sign is noise) and the two d's differ by
less than their combined 95% half-widths, sqrt(h_committed² + h_here²). Rows committed by a machine with this
machine's signature (their `machine` column, `ff.io.machine_id`) must come back bit-identical, and are checked to be.

Which comparisons: those that hold after Holm first, then those that hold alone, then the rest, in the table's order,
each added while the sample's distinct runs stay within `runs` (a five-epoch run counts as five); a comparison whose
runs are already in the sample is added free.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["verify", "plan", "Plan", "Report", "agrees", "DEFAULT_RUNS", "DEFAULT_SEEDS"]

DEFAULT_RUNS = 16  # one-epoch 120-round runs: notebook 04's default sample, about 11 minutes on 2 cores
DEFAULT_SEEDS = 3  # the fewest seeds a paired interval is worth judging on


def agrees(d_a: float, h_a: float, d_b: float, h_b: float) -> bool:
    """Whether two paired estimates of one comparison agree: the same sign (or neither interval excludes 0) and
    |d_a - d_b| within sqrt(h_a² + h_b²), the combined 95% half-widths."""
    resolved_a, resolved_b = abs(d_a) > h_a, abs(d_b) > h_b
    same_sign = (d_a > 0) == (d_b > 0) or d_a == d_b or not (resolved_a or resolved_b)
    return bool(same_sign and abs(d_a - d_b) <= math.hypot(h_a, h_b))


@dataclass
class Plan:
    """What `verify` retrains: the sampled verdict rows, the committed per-seed rows of their arms on the sampled
    seeds, and the Config of each distinct run (by cache key)."""

    number: str
    verdicts: object  # pandas DataFrame: rows of NN_verdicts.csv
    rows: object  # pandas DataFrame: rows of NN_per_seed.csv
    configs: dict = field(default_factory=dict)  # key -> (experiment, Config)
    seeds: list = field(default_factory=list)

    @property
    def cost(self) -> float:
        return sum(_cost(cfg) for _, cfg in self.configs.values())


@dataclass
class Report:
    """verify's result: one row per sampled comparison (committed and retrained d ± half-width on the same seeds,
    agrees), one row per retrained run (committed and retrained measure, same machine, identical), and `ok`."""

    number: str
    comparisons: object
    runs: object
    seeds: list

    @property
    def ok(self) -> bool:
        same = self.runs[self.runs["same_machine"]]
        return bool(self.comparisons["agrees"].all() and same["identical"].all())

    def __str__(self) -> str:
        return format_report(self)


def _cost(cfg) -> float:
    """A run's work in one-epoch 120-round runs (run_many's own measure of a run's length)."""
    from ..runs.experiments import _work

    return _work(cfg) / 120


def _figures(figures) -> Path:
    from ..base.io import project_root

    return Path(figures) if figures is not None else project_root() / "figures"


def _read(number: str, figures: Path):
    import pandas as pd

    from ..engine.config import Config

    if not isinstance(number, str) or not re.fullmatch(r"\d\d(_[a-z]+)?", number):
        raise ValueError(f"only: a notebook number such as '04' (or one of its tables, '03_controls'); got {number!r}")
    have = sorted(p.name[:-len("_configs.jsonl")] for p in figures.glob("[0-9][0-9]*_configs.jsonl"))
    paths = [figures / f"{number}_{name}" for name in ("verdicts.csv", "per_seed.csv", "configs.jsonl")]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        raise ValueError(f"only: notebook {number} has no {', '.join(missing)} in {figures} (notebooks with committed "
                         f"runs and configs: {', '.join(have) or 'none'})")
    verdicts = pd.read_csv(paths[0], index_col=0)
    runs = pd.read_csv(paths[1], index_col=0)
    configs = {}
    for line in paths[2].read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            configs[entry["key"]] = (entry["experiment"], Config.from_dict(entry["config"]))
    return verdicts, runs, configs


def _priority(v) -> int:
    if v.verdict_holm in ("higher", "lower"):
        return 0
    return 1 if v.verdict in ("higher", "lower") else 2


def plan(number: str = "04", runs: int = DEFAULT_RUNS, seeds: int = DEFAULT_SEEDS, figures=None) -> Plan:
    """The sample `verify` retrains for notebook `number` (see the module's docstring); a ValueError names a bad
    argument or a notebook without committed runs and configs."""
    import pandas as pd

    from .tables import arm_rows

    for name, value, low, kinds in (("runs", runs, 1, (int, float)), ("seeds", seeds, 2, (int,))):
        if isinstance(value, bool) or not isinstance(value, kinds) or not value >= low:
            kind = "an integer" if kinds == (int,) else "a number"
            raise ValueError(f"{name} must be {kind} >= {low}; got {value!r}")
    verdicts, table, configs = _read(number, _figures(figures))
    candidates = []
    for i, v in enumerate(verdicts.itertuples(index=False)):
        if v.measure not in table.columns or v.n < seeds:
            continue
        by = json.loads(v.by)
        arms = [arm_rows(table, by, json.loads(lab)) for lab in (v.a, v.b)]
        shared = sorted(set(arms[0]["seed"]) & set(arms[1]["seed"]))[:seeds]
        if len(shared) < seeds:
            continue
        rows = pd.concat([a[a["seed"].isin(shared)] for a in arms])
        candidates.append((_priority(v), i, rows, shared))
    if not candidates:
        raise ValueError(f"only: notebook {number} has no comparison with {seeds} shared seeds or more")
    unknown = sorted({k for _, _, rows, _ in candidates for k in rows["key"]} - set(configs))
    if unknown:
        raise ValueError(f"figures/{number}_configs.jsonl lacks the configs of committed rows {unknown[:3]}: "
                         f"the per-seed table and its configs disagree")
    chosen, keys = [], set()
    for _, i, rows, shared in sorted(candidates, key=lambda c: (c[0], c[1])):
        new = set(rows["key"]) - keys
        extra = sum(_cost(configs[k][1]) for k in new)
        if not chosen or sum(_cost(configs[k][1]) for k in keys) + extra <= runs:
            chosen.append((i, rows, shared))
            keys |= new
    chosen.sort(key=lambda c: c[0])
    rows = pd.concat([r for _, r, _ in chosen]).drop_duplicates()
    seeds_used = sorted({s for _, _, shared in chosen for s in shared})
    keys = dict.fromkeys(rows["key"])
    return Plan(number, verdicts.iloc[[i for i, _, _ in chosen]], rows, {k: configs[k] for k in keys}, seeds_used)


def _measures(p: Plan) -> list:
    return list(dict.fromkeys(p.verdicts["measure"]))


def verify(only: str = "04", runs: int = DEFAULT_RUNS, seeds: int = DEFAULT_SEEDS, root=None, workers: int | None = 2,
           progress: bool = True, figures=None) -> Report:
    """Retrain the sample of notebook `only`'s committed runs (`plan`) on this machine, cached under `root` (the
    project's results/ by default, so an interrupted verify continues), and re-judge each sampled comparison on the
    same seeds (module docstring). Returns a Report; `str(report)` is what `fedfrozen verify` prints."""
    import numpy as np
    import pandas as pd

    from ..runs.experiments import run_many
    from .tables import recompute, summarise

    p = plan(only, runs=runs, seeds=seeds, figures=figures)
    by_experiment = {}
    for key, (experiment, cfg) in p.configs.items():
        by_experiment.setdefault(experiment, []).append((key, cfg))
    here = {}
    for experiment, items in by_experiment.items():
        cfgs = [cfg for _, cfg in items]
        hists = run_many(cfgs, root=root, experiment=experiment, workers=workers, progress=progress)
        for (key, _), row in zip(items, summarise(cfgs, hists).to_dict("records")):
            here[key] = row
    measures = _measures(p)
    again = p.rows.copy()
    for m in measures:
        again[m] = [here[k][m] for k in again["key"]]
    committed = recompute(p.verdicts, p.rows)
    retrained = recompute(p.verdicts, again)
    comparisons = pd.DataFrame({
        "claim": list(p.verdicts["claim"]), "comparison": list(p.verdicts["comparison"]),
        "measure": list(p.verdicts["measure"]), "n": list(retrained["n"]),
        "d_committed": list(committed["d"]), "half_committed": list(committed["half_width"]),
        "d_here": list(retrained["d"]), "half_here": list(retrained["half_width"])})
    comparisons["agrees"] = [agrees(a, ha, b, hb) for a, ha, b, hb in
                             zip(comparisons["d_committed"], comparisons["half_committed"], comparisons["d_here"],
                                 comparisons["half_here"])]
    one = p.rows.drop_duplicates("key").set_index("key")
    run_rows = []
    for key in p.configs:
        was, now = one.loc[key], here[key]
        same = str(was.get("machine", "")) == str(now["machine"])
        identical = all((np.isnan(was[m]) and np.isnan(now[m])) or was[m] == now[m] for m in measures)
        run_rows.append({"key": key, "method": now["method"], "seed": int(now["seed"]),
                         "machine_committed": was.get("machine", "unrecorded"), "machine_here": now["machine"],
                         "same_machine": same, "identical": identical,
                         **{f"{m}_committed": float(was[m]) for m in measures},
                         **{f"{m}_here": float(now[m]) for m in measures}})
    return Report(only, comparisons, pd.DataFrame(run_rows), p.seeds)


def format_report(r: Report) -> str:
    """The report as `fedfrozen verify` prints it."""
    import numpy as np

    from ..base.io import machine

    lines = [f"notebook {r.number}: {len(r.comparisons)} comparisons re-judged on seeds {r.seeds}, "
             f"{len(r.runs)} runs retrained on {machine(threads=1)}",
             "(d ± 95% half-width on the same seeds; agrees: same sign, or neither resolved, and the two d's within "
             "their combined half-widths)"]
    for c in r.comparisons.itertuples(index=False):
        lines.append(f"  {c.claim} {c.comparison} [{c.measure}]: committed d = {c.d_committed:+.4f} ± "
                     f"{c.half_committed:.4f}, here d = {c.d_here:+.4f} ± {c.half_here:.4f} ({c.n}): "
                     f"{'agrees' if c.agrees else 'DISAGREES'}")
    for m in dict.fromkeys(r.comparisons["measure"]):
        diff = np.abs(r.runs[f"{m}_here"] - r.runs[f"{m}_committed"])
        lines.append(f"per run, {m} here against committed: mean |difference| {diff.mean():.4f}, max {diff.max():.4f}"
                     f" ({len(diff)} runs)")
    same = r.runs[r.runs["same_machine"]]
    if len(same):
        bad = same[~same["identical"]]
        lines.append(f"{len(same)} runs were committed by a machine with this signature: "
                     + ("all bit-identical" if bad.empty else
                        f"{len(bad)} DIFFER ({', '.join(bad['key'])}): same config, seed and machine should not"))
    else:
        lines.append("no sampled run was committed by a machine with this signature: compared by verdict, not digits")
    lines.append(f"verify {r.number}: {'ok' if r.ok else 'FAILED'} "
                 f"({int(r.comparisons['agrees'].sum())} of {len(r.comparisons)} comparisons agree)")
    return "\n".join(lines)
