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


def test_the_last_tenth_gain_is_the_late_window_against_the_last_evaluation_at_90_percent():
    values = {0: 0.1, 49: 0.5, 79: 0.6, 89: 0.62, **{r: 0.65 for r in range(90, 100)}}
    assert cv.last_tenth_gain(_hist(values)) == pytest.approx(0.65 - 0.62)  # round 89 is the 90th round
    assert math.isnan(cv.last_tenth_gain(_hist(values, diverged={"round": 50})))
    assert math.isnan(cv.last_tenth_gain(_hist({r: 0.6 for r in range(95, 100)})))  # nothing that early


def test_a_real_run_has_a_finite_last_tenth_gain():
    from conftest import tiny_config

    import fedfrozen as ff

    hist = ff.run(tiny_config(rounds=10, eval_every=1, method="fedavg"), progress=False)
    frame = hist.to_frame().dropna(subset=["test_acc"])
    want = hist.late("test_acc") - frame[frame["round"] + 1 <= 9]["test_acc"].iloc[-1]
    assert cv.last_tenth_gain(hist) == pytest.approx(want)
