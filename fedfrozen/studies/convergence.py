"""Has FedAvg stopped climbing at a budget? The doubling criterion (docs/cpu_profile.md, "The doubling criterion").

A verdict decided while FedAvg is still rising may say what freezing costs early in training, not what it costs.
One run cannot settle whether a budget B is long enough (a single evaluation at Dirichlet 0.1 swings 5-7 points), so
the criterion pairs runs by seed:

    gain_i = late accuracy of FedAvg at 2B − at B, seed i;  d ± h its mean and 95% t half-width (PAIRED_RULE)

B **passes** when the upper end d + h is below THRESHOLD (1 point): doubling would not raise FedAvg by a point;
B **fails** when the lower end d − h is THRESHOLD or more: doubling raises it by at least a point; otherwise it is
**undetermined** (more seeds would tell). Where no 2B runs exist, `last_tenth_gain` screens a cell from the runs it
has: the evaluated accuracy a line through the last fifth of the rounds gains over a tenth of them (a cell whose
mean gain there is above a point needs the doubling runs).
"""

from __future__ import annotations

import math

from .verdicts import compare_runs

__all__ = ["THRESHOLD", "PASSES", "FAILS", "UNDETERMINED", "doubling", "last_tenth_gain"]

THRESHOLD = 0.01  # one point of accuracy: about what another CPU moves a run (docs/claims.md)
PASSES, FAILS, UNDETERMINED = "passes", "fails", "undetermined"


def doubling(at_b: dict, at_2b: dict, threshold: float = THRESHOLD) -> dict:
    """The doubling criterion for budget B: `at_b`, `at_2b` are {seed: FedAvg's late accuracy} at B and at 2B
    (paired on the seeds they share). Returns gain (d), half_width, n, low, high and status (PASSES, FAILS or
    UNDETERMINED; UNDETERMINED also where fewer than 2 seeds are shared)."""
    if not isinstance(threshold, (int, float)) or not threshold > 0:
        raise ValueError(f"threshold must be a positive accuracy (0.01 = one point); got {threshold!r}")
    shared = sorted(set(at_b) & set(at_2b))
    if not shared:
        raise ValueError(f"at_b and at_2b share no seed (seeds {sorted(at_b)} and {sorted(at_2b)}): the criterion "
                         f"pairs runs by seed")
    c = compare_runs([at_2b[s] for s in shared], [at_b[s] for s in shared])
    low, high = c.diff - c.half_width, c.diff + c.half_width
    if not math.isfinite(c.half_width):
        status = UNDETERMINED
    elif high < threshold:
        status = PASSES
    elif low >= threshold:
        status = FAILS
    else:
        status = UNDETERMINED
    return dict(gain=c.diff, half_width=c.half_width, n=c.n, low=low, high=high, status=status)


def last_tenth_gain(hist, key: str = "test_acc") -> float:
    """What a run's evaluated `key` gains over a tenth of its rounds at its end: the slope of a least-squares line
    through its evaluations in the last fifth of the rounds, times a tenth of the rounds (a line, not two single
    evaluations: one evaluation at Dirichlet 0.1 swings by points). NaN for a run that diverged or has fewer than two
    evaluated rounds there."""
    import numpy as np

    if hist.diverged:
        return math.nan
    rounds = int(hist.config.get("rounds") or len(hist.rows))
    points = [(row["round"], row[key]) for row in hist.rows
              if row.get(key) is not None and row["round"] + 1 > 0.8 * rounds]
    if len({r for r, _ in points}) < 2:
        return math.nan
    x, y = np.array(points, dtype=float).T
    slope = float(np.polyfit(x, y, 1)[0])
    return slope * rounds / 10
