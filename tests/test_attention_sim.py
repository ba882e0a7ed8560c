"""The simulator past linear attention (fedfrozen.theory.attention_sim): its linear one-head case is the paper's
model."""

import pytest
import torch

from fedfrozen import attention_sim as sim
from fedfrozen import linear_attention as la


def _as_clients(t):
    X = t.X
    r = X[..., -1, :]
    M = torch.einsum("nsjd,nsje->nsde", X, X) / X.shape[2]
    return la.Clients(r, M, t.y, t.p)


def test_linear_one_head_is_the_closed_form_model():
    t = sim.make_task(n_clients=4, d=6, samples=20, sigma=1.0, kernel="linear", heads=1, seed=3)
    c = _as_clients(t)
    common = dict(rounds=6, warmup=3, local_steps=4, lr=0.02, lam=1e-2, seed=1)
    a, b = sim.simulate(t, **common), la.simulate(c, **common)
    assert a["losses"] == pytest.approx(b["losses"], rel=1e-9)
    K = a["WQ"][0] @ a["WK"][0].T
    assert torch.allclose(K, b["K"], rtol=1e-9, atol=1e-12)
    assert torch.allclose(sim.value_optimum(a["WQ"], a["WK"], t, 1e-2)[0], la.value_optimum(b["K"], c, 1e-2))


@pytest.mark.parametrize("kernel,heads", [("softmax", 1), ("linear", 2), ("softmax", 2)])
def test_frozen_stage_keeps_the_kernel_and_the_value_optimum_is_the_ridge_minimum(kernel, heads):
    t = sim.make_task(n_clients=3, d=4, samples=15, sigma=0.5, kernel=kernel, heads=heads, seed=0)
    out = sim.simulate(t, rounds=4, warmup=2, local_steps=3, lr=0.05, lam=0.1)
    assert torch.equal(out["WQ"], out["WQ_T0"]) and torch.equal(out["WK"], out["WK_T0"])  # frozen after T0
    v = sim.value_optimum(out["WQ"], out["WK"], t, 0.1).requires_grad_()
    loss = sim.global_loss(out["WQ"], out["WK"], v, t, 0.1)
    (g,) = torch.autograd.grad(loss, v)
    assert g.abs().max() < 1e-10  # the closed form is the minimum of the frozen stage's objective
    assert sim.strong_convexity(out["WQ"], out["WK"], t, 0.1) >= 0.1 - 1e-12


def test_homogeneous_clients_do_not_drift():
    """sigma = 0: every client has the same teacher; with one client the federated run is the centralised one."""
    t = sim.make_task(n_clients=1, d=4, samples=10, sigma=0.0, kernel="softmax", heads=2, seed=0)
    out = sim.simulate(t, rounds=3, warmup=3, local_steps=2, lr=0.05, lam=0.0, seed=0)
    ref = sim.centralised(t, steps=6, lr=0.05, seed=0)
    assert torch.allclose(out["WQ"], ref[0]) and torch.allclose(out["v"], ref[2])


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="kernel"):
        sim.make_task(kernel="cosine")
    with pytest.raises(ValueError, match="heads"):
        sim.make_task(d=8, heads=3)
    with pytest.raises(ValueError, match="sigma"):
        sim.make_task(sigma=-1)
