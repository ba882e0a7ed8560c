"""MIFA, FedVARP and FedSteer (fedfrozen.methods.stale): server caches of stale client updates."""

import numpy as np
import pytest
import torch
from conftest import resumed, tiny_config

import fedfrozen as ff
from fedfrozen import loop
from fedfrozen.methods import build
from fedfrozen.methods.base import participation_probabilities

STALE = ("mifa", "fedvarp", "fedsteer")
# Dirichlet alpha 0.3 over 6 clients: unequal sizes, so data shares differ from 1/N
SGD = dict(n_clients=6, alpha=0.3, rounds=3, optimizer="sgd", lr=0.05)


def core(method, k, **more):
    """FedSteer's settings (its core set of k clients); the other methods have none."""
    return {"method_args": {"core": k, **more}} if method == "fedsteer" else {}


@pytest.mark.parametrize("method", STALE)
def test_full_participation_equals_fedavg(method, setups):
    """Every client active every round: the corrections cancel and the step is FedAvg's."""
    ff.run(tiny_config(**SGD, participation="full", method="fedavg"), progress=False)
    ff.run(tiny_config(**SGD, participation="full", method=method, **core(method, 3)), progress=False)
    a, b = setups[-2].flat.data, setups[-1].flat.data
    assert torch.allclose(a, b, atol=1e-6, rtol=0), (a - b).abs().max()


def _method(name, n=4, settings=None, **kw):
    cfg = tiny_config(method=name, n_clients=n, clients_per_round=2, **core(name, 2, **(settings or {})), **kw)
    s = loop.prepare(cfg)
    m = build(cfg)
    m.setup(s)
    return cfg, s, m


def _round(m, r, updates, x):
    """One server step of `m` from synthetic client updates {cid: vector}; returns the new x."""
    acc = torch.zeros_like(x)
    m.begin_round(r, sorted(updates))
    for cid, u in updates.items():
        m.aggregate(acc, cid, u, 1.0 / len(updates))
    x = x.clone()
    m.server_update(r, x, acc, torch.ones_like(x), sorted(updates))
    return x


def _shares(s):
    sizes = np.asarray(s.client_sizes, dtype=np.float64)
    return torch.as_tensor(sizes / sizes.sum(), dtype=torch.float32)


def test_mifa_and_fedvarp_steps_in_closed_form():
    gen = torch.Generator().manual_seed(0)
    for name in ("mifa", "fedvarp"):
        cfg, s, m = _method(name)
        d, p = _shares(s), torch.as_tensor(participation_probabilities(cfg), dtype=torch.float32)
        numel = s.flat.numel
        u = {i: torch.randn(numel, generator=gen) for i in range(4)}
        u2 = {i: torch.randn(numel, generator=gen) for i in range(4)}
        x0 = torch.zeros(numel)
        x1 = _round(m, 0, {0: u[0], 1: u[1]}, x0)
        x2 = _round(m, 1, {1: u2[1], 2: u2[2]}, x1)
        if name == "mifa":  # every client's latest update, data-weighted; never-seen clients count 0
            want1 = d[0] * u[0] + d[1] * u[1]
            want2 = want1 + d[0] * u[0] + d[1] * u2[1] + d[2] * u2[2]
        else:  # sum_A (d/p)(u - H) + sum_i d H, H the cache before the round
            want1 = (d[0] / p[0]) * u[0] + (d[1] / p[1]) * u[1]
            H = {0: u[0], 1: u[1], 2: torch.zeros(numel), 3: torch.zeros(numel)}
            want2 = want1 + sum(d[i] * H[i] for i in range(4)) + (d[1] / p[1]) * (u2[1] - H[1]) \
                + (d[2] / p[2]) * (u2[2] - H[2])
        assert torch.allclose(x1, want1, atol=1e-5), name
        assert torch.allclose(x2, want2, atol=1e-5), name
        assert int(m.seen.sum()) == 3


def test_fedsteer_step_in_closed_form():
    """FedSteer's step recomputed from its definition: Q = [H_j / K]_{j in core}, ridge coordinates for the
    active clients, the last ones kept for the others, x += sum_A (d/p)(u - Q s) + sum_i d Q s."""
    cfg, s, m = _method("fedsteer", settings={"select_rounds": 0})  # a fixed (seeded) core set
    d, p = _shares(s), torch.as_tensor(participation_probabilities(cfg), dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    numel = s.flat.numel
    H = torch.zeros(4, numel)
    S = torch.zeros(4, 2)
    x = torch.zeros(numel)
    for r, active in enumerate([[0, 1], [1, 2], [0, 3]]):
        u = {i: torch.randn(numel, generator=gen) for i in active}
        Q = H[m.core].T / 2
        for i in active:
            S[i] = torch.linalg.solve(Q.T @ Q + 0.5 * torch.eye(2), Q.T @ u[i])
        want = x + sum(d[i] * (Q @ S[i]) for i in range(4)) + sum((d[i] / p[i]) * (u[i] - Q @ S[i]) for i in active)
        x = _round(m, r, u, x)
        assert torch.allclose(x, want, atol=1e-4), (r, (x - want).abs().max())
        for i in active:
            H[i] = u[i]
    assert torch.equal(m.S, S) or torch.allclose(m.S, S, atol=1e-5)


def test_fedsteer_core_set_choice_is_seeded_and_never_worse_than_its_start():
    cfg, s, m = _method("fedsteer", n=8)
    gen = torch.Generator().manual_seed(2)
    m.H.copy_(torch.randn(m.H.shape, generator=gen))
    m.seen[:] = True
    core = m.select_core(0)
    assert len(core) == 2 and core == sorted(set(core)) and all(0 <= i < 8 for i in core)
    assert core == m.select_core(0)  # same seed and round, same choice
    rng = np.random.default_rng(ff.rng.seed_for("fedsteer_core", cfg.seed, 0))
    start = sorted(int(i) for i in rng.choice(8, 2, replace=False))
    assert m.core_objective(core) <= m.core_objective(start)


def test_partial_participation_reuses_the_cache_and_reports_its_memory():
    cfg = tiny_config(method="mifa", n_clients=6, clients_per_round=2, rounds=4)
    hist = ff.run(cfg, progress=False)
    fedavg = ff.run(cfg.replace(method="fedavg"), progress=False)
    assert [r["test_acc"] for r in hist.rows] != [r["test_acc"] for r in fedavg.rows]
    numel = loop.prepare(cfg).flat.numel
    assert all(r["server_cache_bytes"] == 6 * numel * 4 for r in hist.rows)
    seen = set()
    for r in hist.rows:
        seen |= set(r["clients"])
        assert r["cached_clients"] == len(seen)
    steer = ff.run(cfg.replace(method="fedsteer", method_args={"core": 3}), progress=False)
    assert all(r["server_cache_bytes"] == 6 * numel * 4 + 6 * 3 * 4 for r in steer.rows)
    assert all(len(r["core_set"]) == 3 for r in steer.rows)


@pytest.mark.parametrize("method", ["fedsteer", "fedvarp"])
def test_resume_equals_uninterrupted(method, tmp_path):
    cfg = tiny_config(method=method, n_clients=10, rounds=6, participation="skewed", participation_rate=0.3,
                      participation_skew=1.0, **core(method, 3))
    assert resumed(cfg, tmp_path, stop_after=2).same_as(ff.run(cfg, progress=False))


def test_batched_engine_runs_them():
    cfg = tiny_config(**{**SGD, "rounds": 2}, method="fedsteer", clients_per_round=3, **core("fedsteer", 3))
    a = ff.run(cfg, progress=False)
    b = ff.run(cfg.replace(engine="batched"), progress=False)
    for ra, rb in zip(a.rows, b.rows, strict=True):
        assert abs(ra["test_acc"] - rb["test_acc"]) < 1e-4


def test_bad_input_is_named_before_training():
    with pytest.raises(ValueError, match=r"method_args\['core'\] \(7\) must not exceed n_clients \(6\)"):
        tiny_config(method="fedsteer", n_clients=6, method_args={"core": 7})
    with pytest.raises(ValueError, match=r"method_args\['lambda'\] of method 'fedsteer' must be > 0"):
        tiny_config(method="fedsteer", method_args={"lambda": 0.0})
    with pytest.raises(ValueError, match=r"method_args\['core'\] of method 'fedsteer' must be >= 1"):
        tiny_config(method="fedsteer", method_args={"core": 0})


@pytest.mark.parametrize("method", ["mifa", "fedvarp", "fedsteer"])
def test_drift_metrics_measure_the_plain_mean_of_the_sampled_updates(method):
    """What every method reports: round 0's updates are FedAvg's (same start, same batches), so the drift and
    update-norm columns equal FedAvg's, although the server steps along its own direction (the data shares over
    all N clients; the applied step differs, and so does round 1's model)."""
    kw = dict(n_clients=4, clients_per_round=2, rounds=2)
    hs = ff.run(tiny_config(method=method, **kw, **core(method, 2)), progress=False)
    ha = ff.run(tiny_config(method="fedavg", **kw), progress=False)
    cols = [c for c in ha.rows[0] if c.startswith(("drift_", "update_norm_"))]
    assert cols and all(hs.rows[0][c] == pytest.approx(ha.rows[0][c], rel=1e-6)
                        for c in cols if ha.rows[0][c] is not None)
    assert hs.rows[0]["test_acc"] != ha.rows[0]["test_acc"] or hs.rows[1]["test_acc"] != ha.rows[1]["test_acc"]
