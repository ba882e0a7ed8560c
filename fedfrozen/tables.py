"""Tables for the notebooks: one row per run, then mean ± std over seeds.

`summarise(cfgs, hists)` turns runs into a DataFrame of their settings and headline numbers
(final accuracy, worst-10% client accuracy, rounds and bytes to a target accuracy, stability
over the last evaluations, upload, time per round by stage); `mean_std(df, by, cols)` aggregates
over seeds and `format_mean_std` prints "mean ± std". `compare` is the one rule every notebook
uses to say whether a difference holds (SPREAD_RULE).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["summarise", "mean_std", "format_mean_std", "compare", "compare_runs", "Comparison", "SPREAD_RULE",
           "simulated_clock"]

SPREAD_RULE = ("a difference holds (is 'beyond the spread') when |mean_a - mean_b| > max(std_a, std_b): the "
               "larger of the two sample standard deviations over seeds (ddof 1); a single run has no spread (0)")


@dataclass(frozen=True)
class Comparison:
    """Mean of a against mean of b, judged by SPREAD_RULE."""

    mean_a: float
    mean_b: float
    spread: float  # max(std_a, std_b)

    @property
    def gap(self) -> float:
        return self.mean_a - self.mean_b

    @property
    def beyond(self) -> bool:
        """True when the difference holds: |gap| > spread."""
        return abs(self.gap) > self.spread

    @property
    def verdict(self) -> str:
        """'higher' or 'lower' (a against b) when beyond the spread, else 'within the spread'."""
        if not self.beyond:
            return "within the spread"
        return "higher" if self.gap > 0 else "lower"

    def __str__(self) -> str:
        return f"{self.mean_a:.3f} vs {self.mean_b:.3f} ({self.gap:+.3f}): {self.verdict} (spread {self.spread:.3f})"


def _std(x) -> float:
    return 0.0 if x is None or not math.isfinite(float(x)) else float(x)


def compare(stats, a, b, col: str = "final_acc") -> Comparison:
    """Row `a` against row `b` of a mean_std table in column `col` (SPREAD_RULE)."""
    return Comparison(float(stats.loc[a, (col, "mean")]), float(stats.loc[b, (col, "mean")]),
                      max(_std(stats.loc[a, (col, "std")]), _std(stats.loc[b, (col, "std")])))


def compare_runs(values_a, values_b) -> Comparison:
    """Per-seed values of a against those of b (SPREAD_RULE)."""
    a, b = np.asarray(values_a, dtype=float), np.asarray(values_b, dtype=float)
    if a.size == 0 or b.size == 0:
        raise ValueError("compare_runs needs at least one value on each side")
    sd = lambda v: float(v.std(ddof=1)) if v.size > 1 else 0.0  # noqa: E731
    return Comparison(float(a.mean()), float(b.mean()), max(sd(a), sd(b)))

SETTINGS = ("method", "dataset", "partition", "alpha", "local_epochs", "warmup_rounds", "value_l2", "init", "seed")


def _run_row(cfg, hist, target: float, last: int) -> dict:
    df = hist.to_frame()
    evaluated = df.dropna(subset=["test_acc"])
    reached = evaluated[evaluated["test_acc"] >= target]
    cum_bytes = (df["bytes_up"] + df["bytes_down"]).cumsum()
    row = {k: getattr(cfg, k) for k in SETTINGS}
    row.update(
        final_acc=hist.final_accuracy,
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
    with the number of runs in ("runs", "n"). A column such as rounds_to_target is NaN for a run
    that never reached the target, so its count can be smaller than the number of runs."""
    g = df.groupby(list(by) if not isinstance(by, str) else by)
    out = g[list(cols)].agg(["mean", "std", "count"])
    out[("runs", "n")] = g.size()
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
