import pytest
import torch

from fedfrozen import linear_attention as la


@pytest.fixture(scope="module")
def small():
    c = la.make_clients(n_clients=4, d=4, n_tokens=4, samples=40, sigma=1.0, seed=0)
    K = torch.randn(4, 4, generator=torch.Generator().manual_seed(1), dtype=la.DT)
    return c, K


def test_closed_form_value_optimum_has_zero_gradient(small):
    c, K = small
    v = la.value_optimum(K, c, lam=0.1).requires_grad_(True)
    (g,) = torch.autograd.grad(la.global_loss(K, v, c, 0.1), v)
    _, b = la._gram(K, c)
    assert g.norm() / b.norm() <= 1e-6


def test_closed_form_gradients_match_autograd(small):
    c, K = small
    v = torch.randn(4, dtype=la.DT, generator=torch.Generator().manual_seed(2))
    Kr, vr = K.clone().requires_grad_(True), v.clone().requires_grad_(True)
    gK_auto, gv_auto = torch.autograd.grad(la.global_loss(Kr, vr, c, 0.3), (Kr, vr))
    gK, gv = la._grads_K_v(K.expand(4, -1, -1), v.expand(4, -1), c, 0.3, weighted=True)
    assert torch.allclose(gK, gK_auto, atol=1e-10) and torch.allclose(gv, gv_auto, atol=1e-10)


def test_profile_gradient_matches_finite_differences(small):
    c, K = small
    g = la.profile_gradient(K, c, 0.1)
    eps = 1e-6
    for i, j in [(0, 0), (1, 3), (3, 2)]:
        E = torch.zeros_like(K)
        E[i, j] = eps
        fd = (la.profile_objective(K + E, c, 0.1) - la.profile_objective(K - E, c, 0.1)) / (2 * eps)
        assert float(g[i, j]) == pytest.approx(float(fd), rel=1e-5, abs=1e-8)


@pytest.mark.parametrize("lam", [0.0, 0.01, 1.0])
def test_strong_convexity_is_lambda_plus_gram_eigenvalue(small, lam):
    c, K = small
    mu = la.strong_convexity(K, c, lam)
    H = torch.autograd.functional.hessian(lambda v: la.global_loss(K, v, c, lam), torch.zeros(4, dtype=la.DT))
    assert mu == pytest.approx(float(torch.linalg.eigvalsh(H)[0]), rel=1e-8)
    G, _ = la._gram(K, c)
    assert mu == pytest.approx(lam + float(torch.linalg.eigvalsh(G)[0]), rel=1e-8)
    assert mu >= lam


def test_one_local_step_federated_equals_centralised_gradient_descent():
    c = la.make_clients(n_clients=5, d=4, n_tokens=4, samples=30, sigma=2.0, seed=3)
    sim = la.simulate(c, rounds=7, warmup=7, local_steps=1, lr=0.05, lam=0.01, seed=0)
    K, v = la.centralised(c, steps=7, lr=0.05, lam=0.01, seed=0)
    assert torch.allclose(sim["K"], K, atol=1e-12) and torch.allclose(sim["v"], v, atol=1e-12)


def _frozen_value_drift(sigma, local_steps, shared_inputs=False, rounds=600, samples=40):
    c = la.make_clients(n_clients=4, d=4, n_tokens=4, samples=samples, sigma=sigma, noise=0.0, seed=2)
    if shared_inputs:  # same samples on every client: sigma = 0 then means identical clients
        c = la.Clients(c.r[:1].expand_as(c.r), c.M[:1].expand_as(c.M), c.y[:1].expand_as(c.y), c.p)
    sim = la.simulate(c, rounds=rounds, warmup=0, local_steps=local_steps, lr=0.5, lam=0.05, seed=0)
    return float((sim["v"] - la.value_optimum(sim["K_T0"], c, 0.05)).norm())


def test_frozen_stage_reaches_value_optimum_without_drift():
    assert _frozen_value_drift(sigma=1.0, local_steps=1) < 1e-9   # one local step = centralised GD
    assert _frozen_value_drift(sigma=0.0, local_steps=10, shared_inputs=True) < 1e-9  # identical clients
    # sigma = 0 with each client's own finite sample: some drift, far less than with heterogeneous teachers
    for e in (2, 5, 10):
        assert (_frozen_value_drift(sigma=0.0, local_steps=e, samples=400, rounds=200)
                < 0.5 * _frozen_value_drift(sigma=1.0, local_steps=e, samples=400, rounds=200))


def test_value_drift_positive_and_growing_with_local_steps():
    drifts = [_frozen_value_drift(sigma=1.0, local_steps=e) for e in (2, 5, 10)]
    assert drifts[0] > 1e-4
    assert drifts[0] < drifts[1] < drifts[2]


def test_decomposition_terms_are_consistent():
    c = la.make_clients(n_clients=4, d=4, n_tokens=4, samples=40, sigma=1.0, seed=0)
    h = la.make_clients(n_clients=4, d=4, n_tokens=4, samples=40, sigma=1.0, seed=0, heldout=True)
    assert not torch.equal(c.r, h.r)  # fresh samples from the same clients
    K0 = la.init_weights(4, 0)
    Kc, _ = la.centralised(c, steps=400, lr=0.2, lam=0.01, init=K0)
    phi_min = la.min_profile(c, 0.01, Kc)
    d0 = la.decompose(c, h, rounds=20, warmup=0, local_steps=5, lr=0.2, lam=0.01, phi_min=phi_min)
    assert d0["kernel_drift"] == 0.0  # no warm-up: the kernel is the initial one for both
    assert d0["bias"] > 0
    d = la.decompose(c, h, rounds=20, warmup=10, local_steps=5, lr=0.2, lam=0.01, phi_min=phi_min)
    assert d["bias"] < d0["bias"] and d["bias"] >= -1e-9


def test_bad_sigma():
    with pytest.raises(ValueError, match="sigma"):
        la.make_clients(sigma=-1)


# --- adaptive freezing rules on the simulator ----------------------------------------------------------
RULE = dict(rounds=12, local_steps=5, lr=0.02, lam=1e-3, seed=0)


def test_adaptive_rules_are_deterministic_and_reduce_to_fixed_warmups():
    c = la.make_clients(5, 6, samples=40, sigma=1.0, seed=0)
    a = la.simulate(c, warmup=0, rule="kernel_plateau", tau=0.05, patience=2, **RULE)
    b = la.simulate(c, warmup=0, rule="kernel_plateau", tau=0.05, patience=2, **RULE)
    assert a["T0"] == b["T0"] and a["losses"] == b["losses"]
    never = la.simulate(c, warmup=0, rule="kernel_plateau", tau=0.0, patience=1, **RULE)
    assert never["T0"] == RULE["rounds"]
    assert never["losses"] == la.simulate(c, warmup=RULE["rounds"], **RULE)["losses"]
    first = la.simulate(c, warmup=0, rule="kernel_plateau", tau=float("inf"), patience=1, **RULE)
    assert first["T0"] == 1 and first["losses"] == la.simulate(c, warmup=1, **RULE)["losses"]
    assert la.simulate(c, warmup=0, rule="drift_ratio", rho=float("inf"), **RULE)["T0"] == RULE["rounds"]
    zero = la.simulate(c, warmup=0, rule="drift_ratio", rho=0.0, patience=1, **RULE)
    assert zero["T0"] == 1  # any drift in the kernel exceeds 0 x the value drift


def test_rules_vs_oracle_reports_regret_against_the_best_fixed_warmup():
    df = la.rules_vs_oracle([1.0], [0], warmups=[0, 6, 12], taus=(0.05,), rhos=(4.0,), patience=2, n_clients=5,
                            samples=40, d=6, rounds=12, local_steps=5, lr=0.02)
    assert set(df["rule"]) == {"kernel_plateau", "drift_ratio"}
    c = la.make_clients(5, 6, samples=40, sigma=1.0, seed=0)
    fixed = {T0: la.simulate(c, warmup=T0, rounds=12, local_steps=5, lr=0.02, lam=1e-3, seed=0)["losses"][-1]
             for T0 in (0, 6, 12)}
    assert df["oracle_loss"].iloc[0] == min(fixed.values()) and fixed[df["oracle_T0"].iloc[0]] == min(fixed.values())
    assert ((df["loss"] - df["oracle_loss"]) == df["regret"]).all()


@pytest.mark.parametrize("kw, name", [(dict(rule="plateau"), "rule"), (dict(rule="kernel_plateau", tau=-1), "tau"),
                                      (dict(rule="drift_ratio", rho=-1), "rho"),
                                      (dict(rule="kernel_plateau", patience=0), "patience")])
def test_bad_rule_arguments_are_named(kw, name):
    c = la.make_clients(3, 4, samples=10, sigma=1.0, seed=0)
    with pytest.raises(ValueError, match=name):
        la.simulate(c, warmup=0, **{**RULE, **kw})
