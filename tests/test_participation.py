"""Participation models (Config.participation): full, uniform, and the skewed Bernoulli model."""

import math

import numpy as np
import pytest
from conftest import tiny_config

import fedfrozen as ff
from fedfrozen.methods import build
from fedfrozen.methods.base import participation_probabilities


def schedule(cfg, rounds):
    method = build(cfg)
    return [method.sample_clients(r) for r in range(rounds)]


def test_skewed_probabilities_follow_the_model():
    cfg = tiny_config(participation="skewed", n_clients=20, participation_rate=0.1, participation_skew=5.0)
    p = participation_probabilities(cfg)
    assert math.isclose(p.sum(), 0.1 * 20)                       # sum_i p_i = C N
    assert sorted(set(np.round(p, 12))) == pytest.approx([0.2 / 7, 1.2 / 7])  # half (1 + a)x likelier
    assert (p == p.max()).sum() == 10


def test_skewed_empirical_rates_match_p_and_the_seed_fixes_the_schedule():
    cfg = tiny_config(participation="skewed", n_clients=20, participation_rate=0.1, participation_skew=5.0)
    R = 3000
    draws = schedule(cfg, R)
    counts = np.zeros(20)
    for s in draws:
        counts[s] += 1
    p = participation_probabilities(cfg)
    sigma = np.sqrt(p * (1 - p) / R)
    assert np.all(np.abs(counts / R - p) < 4 * sigma), (counts / R, p)   # within 4 binomial standard deviations
    assert draws == schedule(cfg, R)                                       # same seed, same schedule
    assert draws != schedule(cfg.replace(seed=1), R)


def test_full_and_uniform():
    assert schedule(tiny_config(participation="full", n_clients=5), 3) == [list(range(5))] * 3
    uni = schedule(tiny_config(n_clients=10, clients_per_round=3), 50)
    assert all(len(s) == 3 and s == sorted(set(s)) for s in uni)
    full = ff.run(tiny_config(participation="full"), progress=False)
    default = ff.run(tiny_config(), progress=False)   # uniform without clients_per_round: everyone
    strip = lambda h: [{k: v for k, v in r.items() if k != "seconds"} for r in h.rows]  # noqa: E731
    assert strip(full) == strip(default)


def test_rounds_without_clients_are_recorded_and_change_nothing(setups):
    cfg = tiny_config(participation="skewed", n_clients=20, rounds=8, participation_rate=0.05, participation_skew=1.0)
    hist = ff.run(cfg, progress=False)
    empty = [i for i, r in enumerate(hist.rows) if r["clients"] == []]
    assert empty, [r["clients"] for r in hist.rows]
    for i in empty:
        r = hist.rows[i]
        assert r["train_loss"] is None and r["bytes_up"] == 0 and r["kernel_change"] == 0.0
        if i > 0:
            assert r["test_acc"] == hist.rows[i - 1]["test_acc"]   # the global model did not move
    assert [r["clients"] for r in hist.rows] == schedule(cfg, 8)


@pytest.mark.parametrize("kw, field", [(dict(participation="sometimes"), "participation"),
                                       (dict(participation="skewed", participation_rate=0.0), "participation_rate"),
                                       (dict(participation="skewed", participation_rate=1.5), "participation_rate"),
                                       (dict(participation="skewed", participation_skew=-1.0), "participation_skew"),
                                       (dict(participation="skewed", participation_rate=0.8), "probability"),
                                       (dict(participation="full", clients_per_round=2), "clients_per_round")])
def test_bad_participation_is_named(kw, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**kw)
