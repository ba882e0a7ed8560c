"""Tables for the notebooks: one row per run, then mean ± std over seeds.

`summarise(cfgs, hists)` turns runs into a DataFrame of their settings and headline numbers
(final accuracy, worst-10% client accuracy, rounds and bytes to a target accuracy, stability
over the last evaluations, upload, time per round by stage); `mean_std(df, by, cols)` aggregates
over seeds and `format_mean_std` prints "mean ± std". `compare` is the one rule every notebook
uses to say whether a difference holds (PAIRED_RULE: the 95% t-interval of the paired differences
over seeds excludes 0).

Why a t-interval and not a paired bootstrap: at n = 5 seeds a bootstrap has at most 126 distinct
resamples and its percentile interval is too narrow (it ignores that sd(d) is itself estimated),
while the t-interval is exact for normal differences, closed-form and deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["summarise", "mean_std", "format_mean_std", "compare", "compare_runs", "Comparison", "PAIRED_RULE",
           "RESOLVED", "UNRESOLVED", "t_quantile", "resolution", "verdict_table", "VERDICT_COLUMNS",
           "simulated_clock"]

PAIRED_RULE = ("arms compared share their seeds (partition, initialisation, client sampling, batch order), so they are "
               "compared as pairs: d_i = a_i - b_i over the n seeds both have; a difference holds when the 95% "
               "t-interval d_mean +- t(0.975, n-1) * sd(d) / sqrt(n) excludes 0 ('higher' or 'lower'), else "
               "'no difference resolved'; one seed has no interval and resolves nothing")
RESOLVED = ("higher", "lower")
UNRESOLVED = "no difference resolved"


@dataclass(frozen=True)
class Comparison:
    """a against b over n shared seeds, judged by PAIRED_RULE: d = mean of the paired differences,
    half_width = the 95% t-interval's half-width (inf for one seed)."""

    mean_a: float
    mean_b: float
    diff: float
    half_width: float
    n: int

    @property
    def gap(self) -> float:
        """The mean paired difference d (== mean_a - mean_b over the shared seeds)."""
        return self.diff

    @property
    def resolved(self) -> bool:
        """True when the interval excludes 0 (strictly: identical arms, d = 0 +- 0, never resolve)."""
        return abs(self.diff) - self.half_width > 0

    @property
    def verdict(self) -> str:
        """'higher' or 'lower' (a against b) when resolved, else 'no difference resolved'."""
        if not self.resolved:
            return UNRESOLVED
        return "higher" if self.diff > 0 else "lower"

    @property
    def interval(self) -> tuple[float, float]:
        return self.diff - self.half_width, self.diff + self.half_width

    def __str__(self) -> str:
        return (f"{self.mean_a:.3f} vs {self.mean_b:.3f}: d = {self.diff:+.3f} ± {self.half_width:.3f} ({self.n}): "
                f"{self.verdict}")


def t_quantile(n: int) -> float:
    """t(0.975, n - 1): the two-sided 95% quantile of Student's t with n - 1 degrees of freedom (inf for n < 2)."""
    if n < 2:
        return math.inf
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1))


def compare_runs(values_a, values_b) -> Comparison:
    """Paired values of a against b (PAIRED_RULE): position i of each is the same seed. Pairs with a
    non-finite value on either side are left out (n counts the rest)."""
    a, b = np.asarray(values_a, dtype=float), np.asarray(values_b, dtype=float)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"compare_runs pairs values seed by seed: got {a.shape} and {b.shape} values")
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if a.size == 0:
        raise ValueError("compare_runs needs at least one pair of finite values")
    d = a - b
    n = int(d.size)
    hw = t_quantile(n) * float(d.std(ddof=1)) / math.sqrt(n) if n > 1 else math.inf
    return Comparison(float(a.mean()), float(b.mean()), float(d.mean()), hw, n)


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
    return compare_runs([va[s] for s in shared], [vb[s] for s in shared])


def resolution(comparisons) -> float:
    """The smallest difference a set of comparisons could resolve: their smallest half-width."""
    widths = [c.half_width for c in comparisons]
    return min(widths) if widths else math.inf

VERDICT_COLUMNS = ["claim", "comparison", "measure", "mean_a", "mean_b", "d", "half_width", "n", "verdict"]


def verdict_table(rows, measure: str = "late_acc"):
    """The verdicts a notebook decides, one row per (claim, comparison, Comparison) in `rows`: the claim it
    bears on ("C1".."C4"), what was compared ("FedFrozen - FedAvg, dirichlet:0.1"), the means, d, the 95%
    half-width, n and the verdict (VERDICT_COLUMNS). The claim notebooks write it beside their tables
    (figures/NN_verdicts.csv) and the headline figure and the README's numbers are read from it."""
    import pandas as pd

    out = []
    for claim, label, c in rows:
        if not isinstance(c, Comparison):
            raise TypeError(f"verdict_table rows are (claim, comparison, Comparison); got {type(c).__name__} for {label!r}")
        out.append(dict(claim=claim, comparison=label, measure=measure, mean_a=c.mean_a, mean_b=c.mean_b, d=c.diff,
                        half_width=c.half_width, n=c.n, verdict=c.verdict))
    return pd.DataFrame(out, columns=VERDICT_COLUMNS)


SETTINGS = ("method", "dataset", "partition", "alpha", "local_epochs", "warmup_rounds", "value_l2", "init", "seed")


def _run_row(cfg, hist, target: float, last: int) -> dict:
    df = hist.to_frame()
    evaluated = df.dropna(subset=["test_acc"])
    reached = evaluated[evaluated["test_acc"] >= target]
    cum_bytes = (df["bytes_up"] + df["bytes_down"]).cumsum()
    row = {k: getattr(cfg, k) for k in SETTINGS}
    row.update(
        final_acc=hist.final_accuracy,
        late_acc=hist.late_accuracy,
        worst10_acc=hist.last("client_acc_worst10"),
        rounds_to_target=float(reached["round"].iloc[0] + 1) if len(reached) else np.nan,
        MB_to_target=float(cum_bytes[reached.index[0]] / 1e6) if len(reached) else np.nan,
        stability=float(evaluated["test_acc"].tail(last).std()) if len(evaluated) >= 2 else np.nan,
        upload_MB=float(df["bytes_up"].sum() / 1e6),
        download_MB=float(df["bytes_down"].sum() / 1e6),
        sec_per_round_stage1=float(df.loc[df["stage"] == 1, "seconds"].median()) if (df["stage"] == 1).any() else np.nan,
        sec_per_round_stage2=float(df.loc[df["stage"] == 2, "seconds"].median()) if (df["stage"] == 2).any() else np.nan,
        diverged=hist.diverged is not None,
    )
    return row


def summarise(cfgs, hists, target: float = 0.8, last: int = 3):
    """One row per run: its settings and headline numbers.

    target: the test accuracy for `rounds_to_target` / `MB_to_target` (NaN when never reached);
    stability: std of the last `last` evaluated test accuracies.
    """
    import pandas as pd

    return pd.DataFrame([_run_row(c, h, target, last) for c, h in zip(cfgs, hists)])


def mean_std(df, by, cols):
    """Mean, std and count of finite values over the rows sharing `by` (typically: over seeds),
    with the number of runs in ("runs", "n"). The per-seed values (from the `seed` column, else the
    row's position in its group) are kept in `.attrs["per_seed"][col][row]` for `compare`. A column such as rounds_to_target is NaN for a run
    that never reached the target, so its count can be smaller than the number of runs."""
    g = df.groupby(list(by) if not isinstance(by, str) else by)
    out = g[list(cols)].agg(["mean", "std", "count"])
    out[("runs", "n")] = g.size()
    flat = df.reset_index(drop=True)
    flat = flat.assign(_seed=flat["seed"] if "seed" in flat.columns else flat.groupby(by).cumcount())
    keys = list(by) if not isinstance(by, str) else by
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
    from .loop import prepare
    from .methods.afedlf import client_seconds, device_profiles

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
