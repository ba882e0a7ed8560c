import pytest
import torch

from fedfrozen import linear_attention as la


@pytest.fixture(scope="module")
def small():
    clients, p = la.make_clients(n_clients=4, d=4, n_tokens=4, samples=40, sigma=1.0, seed=0)
    g = torch.Generator().manual_seed(1)
    K = torch.randn(4, 4, generator=g, dtype=la.DT)
    return clients, p, K


def test_closed_form_value_optimum_has_zero_gradient(small):
    clients, p, K = small
    v = la.value_optimum(K, clients, p, lam=0.1).requires_grad_(True)
    (g,) = torch.autograd.grad(la.global_loss(K, v, clients, p, 0.1), v)
    _, b = la._gram(K, clients, p)
    assert g.norm() / b.norm() <= 1e-6


def test_profile_gradient_matches_finite_differences(small):
    clients, p, K = small
    g = la.profile_gradient(K, clients, p, 0.1)
    eps = 1e-6
    for i, j in [(0, 0), (1, 3), (3, 2)]:
        E = torch.zeros_like(K)
        E[i, j] = eps
        fd = (la.profile_objective(K + E, clients, p, 0.1) - la.profile_objective(K - E, clients, p, 0.1)) / (2 * eps)
        assert float(g[i, j]) == pytest.approx(float(fd), rel=1e-5, abs=1e-8)


@pytest.mark.parametrize("lam", [0.0, 0.01, 1.0])
def test_strong_convexity_is_lambda_plus_gram_eigenvalue(small, lam):
    clients, p, K = small
    mu = la.strong_convexity(K, clients, p, lam)
    H = torch.autograd.functional.hessian(lambda v: la.global_loss(K, v, clients, p, lam), torch.zeros(4, dtype=la.DT))
    assert mu == pytest.approx(float(torch.linalg.eigvalsh(H)[0]), rel=1e-8)
    G, _ = la._gram(K, clients, p)
    assert mu == pytest.approx(lam + float(torch.linalg.eigvalsh(G)[0]), rel=1e-8)
    assert mu >= lam


def _frozen_value_drift(sigma, local_steps, rounds=200):
    clients, p = la.make_clients(n_clients=4, d=4, n_tokens=4, samples=40, sigma=sigma, noise=0.0, seed=2)
    sim = la.simulate(clients, p, rounds=rounds, warmup=0, local_steps=local_steps, lr=2.0, lam=0.05, seed=0)
    return float((sim["v"] - la.value_optimum(sim["K_T0"], clients, p, 0.05)).norm())


def test_frozen_stage_reaches_value_optimum_without_drift():
    assert _frozen_value_drift(sigma=1.0, local_steps=1) < 1e-9   # one local step = centralised GD
    # sigma = 0: same teacher, but each client has its own finite sample, so some drift remains;
    # it is smaller than under heterogeneous teachers at the same number of local steps
    for e in (2, 5, 10):
        assert _frozen_value_drift(sigma=0.0, local_steps=e) < 0.7 * _frozen_value_drift(sigma=1.0, local_steps=e)


def test_value_drift_positive_and_growing_with_local_steps():
    drifts = [_frozen_value_drift(sigma=1.0, local_steps=e) for e in (2, 5, 10)]
    assert drifts[0] > 1e-4
    assert drifts[0] < drifts[1] < drifts[2]


def test_bad_sigma():
    with pytest.raises(ValueError, match="sigma"):
        la.make_clients(sigma=-1)
