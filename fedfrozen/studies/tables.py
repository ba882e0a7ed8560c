"""Tables for the notebooks: one row per run, then mean ± std over seeds, and the verdicts drawn from them.

`summarise(cfgs, hists)` turns runs into a DataFrame of their settings and headline numbers
(final accuracy, worst-10% client accuracy, rounds and bytes to a target accuracy, stability
over the last evaluations, upload, time per round by stage); `mean_std(df, by, cols)` aggregates
over seeds and `format_mean_std` prints "mean ± std". `compare` applies the one paired rule (fedfrozen.studies.verdicts,
re-exported here: PAIRED_RULE, FAMILY_RULE, `adjust`, ...) to two arms of such a table; `per_seed` and `recompute`
give the committed per-seed tables and the verdicts again from them; `format_verdicts` prints them.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

from .verdicts import (
    ADJUSTED_COLUMNS,
    FAMILY_RULE,
    PAIRED_RULE,
    POWER,
    RESOLVED,
    UNRESOLVED,
    VERDICT_COLUMNS,
    Comparison,
    SpreadComparison,
    adjust,
    adjusted_half_width,
    compare_runs,
    compare_spread,
    decimals,
    detectable,
    holm,
    paired_p,
    resolution,
    t_quantile,
    verdict_table,
)

__all__ = ["summarise", "mean_std", "format_mean_std", "compare", "compare_runs", "Comparison", "PAIRED_RULE",
           "FAMILY_RULE", "RESOLVED", "UNRESOLVED", "t_quantile", "resolution", "verdict_table", "VERDICT_COLUMNS",
           "holm", "adjust", "detectable", "paired_p", "POWER", "per_seed", "recompute", "format_verdicts",
           "ADJUSTED_COLUMNS", "simulated_clock", "adjusted_half_width", "arm_rows", "compare_spread",
           "SpreadComparison", "spread_table", "recompute_spread", "SPREAD_COLUMNS", "machine_of", "UNRECORDED",
           "decimals"]


def compare(stats, a, b, col: str = "final_acc") -> Comparison:
    """Row `a` against row `b` of a mean_std table in column `col`, paired on the seeds they share (PAIRED_RULE).

    The table keeps its rows' per-seed values (mean_std stores them in `stats.attrs["per_seed"]`)."""
    per = getattr(stats, "attrs", {}).get("per_seed", {}).get(col)
    if per is None:
        raise ValueError(f"compare needs a table made by tables.mean_std with column {col!r} (it keeps the per-seed "
                         f"values the paired rule needs); got one without them")
    for key in (a, b):
        if key not in per:
            raise KeyError(f"no row {key!r} in the table (rows: {list(per)[:12]})")
    va, vb = per[a], per[b]
    shared = [s for s in va if s in vb]
    if not shared:
        raise ValueError(f"rows {a!r} and {b!r} share no seed (seeds {sorted(va)} and {sorted(vb)}): "
                         f"the paired rule compares runs of the same seeds")
    c = compare_runs([va[s] for s in shared], [vb[s] for s in shared])
    return dataclasses.replace(c, by=tuple(stats.index.names), a=_labels(a), b=_labels(b))


def _labels(row) -> tuple:
    """A mean_std row's labels as a tuple (one label for a table grouped by one column)."""
    return tuple(row) if isinstance(row, tuple) else (row,)


def _row(labels):
    """The inverse of `_labels`: the row key of a mean_std table."""
    return labels[0] if len(labels) == 1 else tuple(labels)


SPREAD_COLUMNS = ["claim", "comparison", "measure", "sd_a", "sd_b", "ratio", "r", "p", "n", "verdict", "by", "a", "b"]


def spread_table(stats, rows, col: str = "late_acc", level: float = 0.05):
    """The spread comparisons of a mean_std table as one family of their own: for each (claim, label, row a, row b),
    `compare_spread` of the two rows' per-seed values in `col` on their shared seeds, then Holm over the table
    (`p_holm`, `verdict_holm`). Their p-values are Pitman–Morgan's, not the paired t-test's, so they never join a
    verdict table's family. `by`, `a`, `b` name the arms, so `recompute_spread` finds them again."""
    import pandas as pd

    per = stats.attrs["per_seed"][col]
    out = []
    for claim, label, a, b in rows:
        shared = [s for s in per[a] if s in per[b]]
        c = compare_spread([per[a][s] for s in shared], [per[b][s] for s in shared])
        out.append(dict(claim=claim, comparison=label, measure=col, sd_a=c.sd_a, sd_b=c.sd_b, ratio=c.ratio, r=c.r,
                        p=c.p, n=c.n, verdict=c.verdict, by=json.dumps(list(stats.index.names)),
                        a=json.dumps(list(_labels(a))), b=json.dumps(list(_labels(b)))))
    table = pd.DataFrame(out, columns=SPREAD_COLUMNS)
    table["p_holm"] = holm(table["p"]) if len(table) else []
    table["verdict_holm"] = [("lower" if r < 1 else "higher") if p < level else UNRESOLVED
                             for r, p in zip(table["ratio"], table["p_holm"])]
    return table


def recompute_spread(table, runs):
    """A spread table again from a per-seed table (the arms found by `by`, `a`, `b`)."""
    if not len(table):
        return table.iloc[0:0]
    by, measure = set(table["by"]), set(table["measure"])
    if len(by) != 1 or len(measure) != 1:
        raise ValueError(f"a spread table compares one measure of one table's rows; got by {by}, measures {measure}")
    stats = mean_std(runs, json.loads(by.pop()), [measure.pop()])
    rows = [(v.claim, v.comparison, _row(json.loads(v.a)), _row(json.loads(v.b)))
            for v in table.itertuples(index=False)]
    return spread_table(stats, rows, table["measure"].iloc[0])


def per_seed(runs):
    """The tidy per-seed table a notebook commits (figures/NN_per_seed.csv): one row per run and arm, its config
    key, seed, settings and every measure (`summarise`'s columns and the notebook's own labels), from which its
    verdict table is recomputed without retraining (`recompute`). One run may stand in two arms (at the smoke
    profile two T0 fractions round to one T0); a seed twice in one arm is refused when the table is grouped."""
    missing = [c for c in ("key", "seed") if c not in runs.columns]
    if missing:
        raise ValueError(f"per_seed needs a table made by tables.summarise (columns key and seed); missing {missing}")
    return runs.reset_index(drop=True)


def recompute(verdicts, runs):
    """The verdict table again, from a per-seed table: each row's two arms found by their labels (`by`, `a`, `b`)
    and paired by seed on its measure, then `adjust`ed as one family. Equal to the committed table when both
    come from the same runs (tests/test_tables.py)."""

    rows = []
    for v in verdicts.itertuples(index=False):
        by = json.loads(v.by)
        if not by:
            raise ValueError(f"verdict {v.comparison!r} does not say which runs it compares (no `by` labels)")
        stats = mean_std(runs, by, [v.measure])
        c = compare(stats, _row(json.loads(v.a)), _row(json.loads(v.b)), v.measure)
        rows.append((v.claim, v.comparison, c, v.measure))
    if not rows:
        return verdicts.iloc[0:0]
    return verdict_table([(cl, lab, c, m) for cl, lab, c, m in rows])


def arm_rows(runs, by, labels):
    """The rows of a per-seed table that form one arm of a verdict: those whose `by` columns equal `labels` (the
    verdict table's `by` and `a`/`b`, JSON-decoded)."""
    mask = np.ones(len(runs), dtype=bool)
    for col, value in zip(by, labels):
        column = runs[col]
        mask &= (column.isna() if value is None else (column == value)).to_numpy()
    return runs[mask]


def format_verdicts(table) -> str:
    """A verdict table as the notebooks print it: each comparison's d +- half-width (n), its own verdict, the
    verdict after Holm over the table, the difference it detects at 80% power, and for an unresolved one the
    bound its interval gives (docs/claims.md); each row at its own scale (`decimals`)."""
    lines = []
    for v in table.itertuples(index=False):
        k = decimals(v.half_width)
        if v.d == 0 and v.half_width == 0:  # the same runs in both arms, or a measure at its floor in both
            lines.append(f"{v.claim} {v.comparison} [{v.measure}]: d = +{0:.{k}f} ± {0:.{k}f} ({int(v.n)}); the "
                         f"same value on every seed in both arms (the same runs, or both at the measure's floor): "
                         f"nothing to judge")
            continue
        after = v.verdict_holm if v.verdict_holm != UNRESOLVED else "not resolved"
        bound = (f"; bound: {v.d - v.half_width:+.{k}f} to {v.d + v.half_width:+.{k}f}"
                 if v.verdict_holm == UNRESOLVED and math.isfinite(v.half_width) else "")
        lines.append(f"{v.claim} {v.comparison} [{v.measure}]: d = {v.d:+.{k}f} ± {v.half_width:.{k}f} ({int(v.n)}); "
                     f"alone {v.verdict}, after Holm over {len(table)}: {after} (p = {v.p_holm:.3g}); detects "
                     f"{v.detectable:.{k}f} at 80% power{bound}")
    return "\n".join(lines)


# the settings a per-seed row names, so that a reader sees what two paired arms differ in (the start's pre-training
# only where the run starts from a pretrained body)
SETTINGS = ("method", "dataset", "model", "partition", "alpha", "shift", "shift_groups", "optimizer", "momentum",
            "weight_decay", "local_epochs", "rounds", "warmup_rounds", "value_l2", "init", "lr", "lr_schedule",
            "pretrain_task", "pretrain_seed", "seed")


def settings_of(cfg) -> dict:
    """A run's SETTINGS as its per-seed row names them (pretrain_task and pretrain_seed None without a pretrained
    start, shift_groups None without a shift)."""
    row = {k: getattr(cfg, k) for k in SETTINGS}
    if cfg.init != "pretrained":
        row.update(pretrain_task=None, pretrain_seed=None)
    if cfg.shift == "none":
        row["shift_groups"] = None
    return row


def _median_seconds(df, stage: int) -> float:
    """Median seconds of the rounds of `stage` in a History frame (NaN when the run has none)."""
    seconds = df.loc[df["stage"] == stage, "seconds"]
    return float(seconds.median()) if len(seconds) else np.nan


def _run_row(cfg, hist, target: float, last: int) -> dict:
    df = hist.to_frame()
    evaluated = df.dropna(subset=["test_acc"])
    reached = evaluated[evaluated["test_acc"] >= target]
    cum_bytes = (df["bytes_up"] + df["bytes_down"]).cumsum()
    from ..runs.experiments import config_key

    row = {"key": config_key(cfg), **settings_of(cfg), "machine": machine_of(hist)}
    row.update(
        final_acc=hist.final_accuracy,
        late_acc=hist.late_accuracy,
        worst10_acc=hist.last("client_acc_worst10"),
        rounds_to_target=float(reached["round"].iloc[0] + 1) if len(reached) else np.nan,
        MB_to_target=float(cum_bytes[reached.index[0]] / 1e6) if len(reached) else np.nan,
        stability=float(evaluated["test_acc"].tail(last).std()) if len(evaluated) >= 2 else np.nan,
        oscillation=hist.oscillation("test_acc"),
        upload_MB=float(df["bytes_up"].sum() / 1e6),
        download_MB=float(df["bytes_down"].sum() / 1e6),
        sec_per_round_stage1=_median_seconds(df, 1),
        sec_per_round_stage2=_median_seconds(df, 2),
        diverged=hist.diverged is not None,
    )
    return row


UNRECORDED = "unrecorded"  # the machine of a run whose History predates the machine signature (ff.io.machine)


def machine_of(hist) -> str:
    """The short machine signature a History was computed on (`ff.io.machine_id`), UNRECORDED for one written
    before runs recorded it."""
    from ..base.io import machine_id

    sig = (hist.env or {}).get("machine")
    return machine_id(sig) if sig else UNRECORDED


def summarise(cfgs, hists, target: float = 0.8, last: int = 3):
    """One row per run: its settings and headline numbers.

    key: the run's cache key (`experiments.config_key`); machine: the short signature of the machine that
    computed it (`machine_of`: runs of one key and one machine are bit-identical, docs/claims.md); late_acc: test
    accuracy over the late window
    (`History.late`); target: the test accuracy for `rounds_to_target` / `MB_to_target` (NaN when never
    reached); stability: std of the last `last` evaluated test accuracies (follows a trend as much as a swing);
    oscillation: the late window's swing around its trend (`History.oscillation`, docs/claims.md: C1 stability).
    """
    import pandas as pd

    return pd.DataFrame([_run_row(c, h, target, last) for c, h in zip(cfgs, hists)])


def mean_std(df, by, cols):
    """Mean, std and count of finite values over the rows sharing `by` (typically: over seeds),
    with the number of runs in ("runs", "n"). The per-seed values (from the `seed` column, else the
    row's position in its group) are kept in `.attrs["per_seed"][col][row]` for `compare`. A column such as
    rounds_to_target is NaN for a run that never reached the target, so its count can be smaller than the number of
    runs."""
    g = df.groupby(list(by) if not isinstance(by, str) else by)
    out = g[list(cols)].agg(["mean", "std", "count"])
    out[("runs", "n")] = g.size()
    flat = df.reset_index(drop=True)
    flat = flat.assign(_seed=flat["seed"] if "seed" in flat.columns else flat.groupby(by).cumcount())
    keys = list(by) if not isinstance(by, str) else by
    dup = flat.duplicated(subset=[*(keys if isinstance(keys, list) else [keys]), "_seed"], keep=False)
    if dup.any():
        first = flat.loc[dup].iloc[0]
        where = {k: first[k] for k in (keys if isinstance(keys, list) else [keys])}
        raise ValueError(f"mean_std: seed {first['_seed']} appears {int(dup.sum())} times in row {where} (rows are "
                         f"grouped by {by!r}): a seed is one run per row; add the column that tells the runs apart "
                         f"to `by`")
    row = (lambda k: k[0]) if not isinstance(by, str) and len(keys) == 1 else (lambda k: k)  # the index's own labels
    out.attrs["per_seed"] = {c: {row(key): dict(zip(sub["_seed"].tolist(), sub[c].astype(float).tolist()))
                                 for key, sub in flat.groupby(keys)}
                             for c in cols}
    return out


def _cell(mean, std, count, runs, digits):
    if not count:
        return "n/a"
    text = f"{mean:.{digits}f} ± {std:.{digits}f}" if count >= 2 else f"{mean:.{digits}f}"
    return text if count == runs else f"{text} ({count:d} of {runs:d} runs)"


def format_mean_std(stats, digits: int = 3):
    """'mean ± std' strings from a mean_std table (for display and CSV).

    A std needs two values: a single value prints without one, and when only some runs have a
    value (a target reached by 1 of 3 seeds) the cell says how many, e.g. '4.215 (1 of 3 runs)'.
    """
    import pandas as pd

    cols = [c for c in stats.columns.get_level_values(0).unique() if c != "runs"]
    runs = stats[("runs", "n")]
    return pd.DataFrame({c: [_cell(m, s, int(k), int(n), digits)
                             for m, s, k, n in zip(stats[(c, "mean")], stats[(c, "std")], stats[(c, "count")], runs)]
                         for c in cols}, index=stats.index)


def simulated_clock(cfg, hist) -> list:
    """Cumulative simulated seconds after each round, on AFedLF's seeded device profiles (the same for every
    method of a config's seed): AFedLF's own clock when the run has one; otherwise a client trains the whole
    model and exchanges what the History says a client exchanged that round, and a round lasts as long as the
    slowest of all clients (exact when every client takes part, as at the cpu profile; an upper bound when
    only some are sampled, since the History does not record which)."""
    if hist.rows and hist.rows[0].get("sim_clock") is not None:
        return [r["sim_clock"] for r in hist.rows]
    from ..engine.loop import prepare
    from ..methods.afedlf import client_seconds, device_profiles

    s = prepare(cfg.replace(device="cpu"))
    compute, bandwidth = device_profiles(cfg)
    sizes = [len(t) for t in s.client_train]
    m = cfg.clients_per_round or cfg.n_clients
    clock, out = 0.0, []
    for r in hist.rows:
        down, up = r["bytes_down"] / m, r["bytes_up"] / m  # per client (every sampled client exchanges the same)
        clock += max(client_seconds(sizes[i], compute[i], bandwidth[i], 1.0, down, up) for i in range(cfg.n_clients))
        out.append(clock)
    return out
