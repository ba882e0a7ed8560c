"""The doubling criterion (fedfrozen.studies.convergence): a budget passes when doubling it is bounded below a point
of FedAvg's accuracy, fails when it is bounded above, and the last tenth's gain screens a run."""

import math
from types import SimpleNamespace

import pytest

from fedfrozen.studies import convergence as cv
from fedfrozen.studies.verdicts import t_quantile


def test_a_budget_passes_fails_or_is_undetermined_by_the_paired_interval_of_the_gain():
    at_b = {s: 0.70 for s in range(5)}
    flat = {s: 0.70 + g for s, g in enumerate([0.001, 0.002, 0.000, 0.003, 0.001])}
    rising = {s: 0.70 + g for s, g in enumerate([0.030, 0.025, 0.035, 0.028, 0.032])}
    noisy = {s: 0.70 + g for s, g in enumerate([0.03, -0.02, 0.04, -0.01, 0.02])}
    assert cv.doubling(at_b, flat)["status"] == cv.PASSES
    assert cv.doubling(at_b, rising)["status"] == cv.FAILS
    assert cv.doubling(at_b, noisy)["status"] == cv.UNDETERMINED
    got = cv.doubling(at_b, rising)
    gains = [0.030, 0.025, 0.035, 0.028, 0.032]
    mean = sum(gains) / 5
    sd = math.sqrt(sum((g - mean) ** 2 for g in gains) / 4)
    assert got["gain"] == pytest.approx(mean) and got["n"] == 5
    assert got["half_width"] == pytest.approx(t_quantile(5) * sd / math.sqrt(5))
    assert got["low"] == pytest.approx(mean - got["half_width"]) and got["low"] >= cv.THRESHOLD


def test_the_threshold_is_a_bound_on_the_gain_not_on_its_mean():
    """A gain of 1.5 points whose interval reaches below a point is undetermined, not a fail."""
    at_b = {s: 0.5 for s in range(3)}
    at_2b = {0: 0.505, 1: 0.515, 2: 0.525}
    got = cv.doubling(at_b, at_2b)
    assert got["gain"] == pytest.approx(0.015) and got["low"] < cv.THRESHOLD < got["high"]
    assert got["status"] == cv.UNDETERMINED
    tight = cv.doubling(at_b, {0: 0.514, 1: 0.515, 2: 0.516})  # the same mean gain, seeds that agree
    assert tight["gain"] == pytest.approx(0.015) and tight["status"] == cv.FAILS


def test_only_shared_seeds_are_paired_and_bad_input_is_refused():
    assert cv.doubling({0: 0.5, 1: 0.5, 7: 0.1}, {0: 0.5, 1: 0.501, 9: 0.9})["n"] == 2
    assert cv.doubling({0: 0.5}, {0: 0.6})["status"] == cv.UNDETERMINED  # one seed: no interval
    with pytest.raises(ValueError, match="share no seed"):
        cv.doubling({0: 0.5}, {1: 0.5})
    with pytest.raises(ValueError, match="threshold must be a positive"):
        cv.doubling({0: 0.5}, {0: 0.5}, threshold=0)


def _hist(values, rounds=100, eval_window=10, diverged=None):
    rows = [dict(round=r, test_acc=v) for r, v in values.items()]
    return SimpleNamespace(rows=rows, config=dict(rounds=rounds, eval_window=eval_window), diverged=diverged,
                           late=lambda key: sum(row[key] for row in rows if row["round"] >= rounds - eval_window)
                           / sum(1 for row in rows if row["round"] >= rounds - eval_window))


def test_the_last_tenth_gain_is_the_slope_through_the_last_fifth_times_a_tenth():
    # evaluated every 10 rounds, then every round of the last 10; a line of 0.001 a round from round 80 on
    values = {r: 0.2 for r in range(0, 80, 10)} | {r: 0.5 + 0.001 * r for r in (80, 85, *range(90, 100))}
    assert cv.last_tenth_gain(_hist(values)) == pytest.approx(0.001 * 10)  # 100 rounds: a tenth is 10
    noisy = {r: 0.5 + 0.001 * r + (0.01 if r % 2 else -0.01) for r in range(80, 100)}
    assert cv.last_tenth_gain(_hist(noisy)) == pytest.approx(0.01, abs=0.003)  # the swing averages out
    assert math.isnan(cv.last_tenth_gain(_hist(values, diverged={"round": 50})))
    assert math.isnan(cv.last_tenth_gain(_hist({10: 0.3, 99: 0.6})))  # one evaluation in the last fifth


def test_a_real_run_has_a_finite_last_tenth_gain():
    import numpy as np
    from conftest import tiny_config

    import fedfrozen as ff

    hist = ff.run(tiny_config(rounds=10, eval_every=1, method="fedavg"), progress=False)
    frame = hist.to_frame().dropna(subset=["test_acc"])
    last = frame[frame["round"] + 1 > 8]  # rounds 9 and 10 of 10
    slope = np.polyfit(last["round"], last["test_acc"], 1)[0]
    assert cv.last_tenth_gain(hist) == pytest.approx(slope * 1.0)
