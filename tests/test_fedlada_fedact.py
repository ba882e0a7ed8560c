"""FedLADA and FedACT (fedfrozen.methods.fedlada): the federated-AdamW line's local optimisers."""

import pytest
import torch
from conftest import resumed, tiny_config

import fedfrozen as ff
from fedfrozen.methods import fedlada
from fedfrozen.nets.flat import FlatParams
from fedfrozen.nets.update import FlatOptimizer, UpdateRule

BASE = dict(n_clients=4, rounds=3, lr=1e-2)


def _flat(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Linear(4, 3))
    return model, FlatParams(model)


def test_fedlada_step_is_torch_adam_with_coupled_decay():
    """FedLADA's transform of the one rule (coupled decay before the Adam core, no decoupled decay) is
    torch.optim.Adam's rule."""
    model, flat = _flat()
    ref = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    opt = FlatOptimizer(flat, UpdateRule("adamw", weight_decay=0.0, coupled_decay=fedlada.LADA_COUPLED_WD))
    torch_opt = torch.optim.Adam(ref, lr=1e-2, weight_decay=fedlada.LADA_COUPLED_WD)
    gen = torch.Generator().manual_seed(0)
    for _ in range(4):
        g = torch.randn(flat.numel, generator=gen)
        flat.grad.copy_(g)
        offset = 0
        for p in ref:
            p.grad = g[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        opt.step(1e-2)
        torch_opt.step()
    assert torch.allclose(flat.data, torch.cat([p.detach().flatten() for p in ref]), atol=1e-6)


def test_fedact_trust_scales_agreeing_coordinates_up():
    """m̂ and Δ^G agree on coordinate 0 (trust 1), disagree on 1 (tau_min); the mean trust is renormalised to 1."""
    model, flat = _flat()
    flat.data.zero_()
    trainable = torch.zeros(flat.numel)
    trainable[:2] = 1
    opt = FlatOptimizer(flat, trainable=trainable)
    flat.grad.zero_()
    flat.grad[:2] = torch.tensor([1.0, 1.0])        # m̂ > 0 on both
    delta_bar = torch.zeros(flat.numel)
    delta_bar[:2] = torch.tensor([10.0, -10.0])     # Δ^G = -Δ̄/(Kη): negative on 0 (disagrees), positive on 1 (agrees)
    opt.rule = UpdateRule(direction=lambda o, lr: fedlada._act_direction(o, lr, delta_bar, K=1, alpha=0.0,
                                                                        tau_min=0.1))
    opt.step(0.1)  # the Adam core's moments at t = 1, then FedACT's direction
    # d = m̂/(sqrt(v̂)+eps) = 1 on both (alpha 0); tau = (0.1, 1) renormalised to mean 1 -> (0.2/1.1, 2/1.1)
    step = -flat.data[:2] / 0.1
    assert torch.allclose(step, torch.tensor([0.2 / 1.1, 2.0 / 1.1]), atol=1e-5)


def test_fedact_with_trust_one_is_fedadamw_corrected_adamw(setups):
    """tau_min = 1 makes trust == 1: FedACT at lr eta, decay lam, alpha == FedAdamW at lr eta/(1-g), decay lam(1-g),
    g = alpha."""
    g = 0.5
    ff.run(tiny_config(**BASE, method="fedact", method_args={"tau_min": 1.0, "alpha": g}, weight_decay=0.01),
           progress=False)
    ff.run(tiny_config(**{**BASE, "lr": BASE["lr"] / (1 - g)}, method="fedadamw", method_args={"gamma": g},
                       weight_decay=0.01 * (1 - g)), progress=False)
    a, b = setups[-2].flat.data, setups[-1].flat.data
    close = ((a - b).abs() < 1e-5).float().mean().item()
    assert close >= 0.99, close


def test_fedlada_keeps_a_per_coordinate_v_and_counts_it():
    cfg = tiny_config(**BASE, method="fedlada")
    hist = ff.run(cfg, progress=False)
    avg = ff.run(cfg.replace(method="fedavg"), progress=False)
    for h, f in zip(hist.rows, avg.rows):
        assert h["bytes_up"] == 2 * f["bytes_up"]          # Δ_i and v, each one float per trained weight
        assert h["bytes_down"] == 3 * f["bytes_down"]      # x, Δ̄ and v̄
    s = ff.loop.prepare(cfg)
    m = ff.methods.build(cfg)
    m.setup(s)
    assert m.v_bar.numel() == s.flat.numel


def test_fedlada_server_v_is_the_clients_per_coordinate_v():
    """One client: after the round the server's v̄ is that client's final v, coordinate by coordinate."""
    cfg = tiny_config(**{**BASE, "rounds": 1, "n_clients": 1}, method="fedlada")
    seen = {}
    after, update = fedlada.FedLADA.after_client, fedlada.FedLADA.server_update

    def spy_after(self, r, cid, delta, steps, lr, mask):
        full = torch.zeros_like(self.flat.data)
        offset = 0
        for sl in self.opt.slices:
            full[sl] = self.opt.v[offset:offset + sl.stop - sl.start]
            offset += sl.stop - sl.start
        seen["v"] = full
        return after(self, r, cid, delta, steps, lr, mask)

    def spy_update(self, r, x, acc, mask, sampled):
        update(self, r, x, acc, mask, sampled)
        seen["v_bar"] = self.v_bar.clone()

    fedlada.FedLADA.after_client, fedlada.FedLADA.server_update = spy_after, spy_update
    try:
        ff.run(cfg, progress=False)
    finally:
        fedlada.FedLADA.after_client, fedlada.FedLADA.server_update = after, update
    assert torch.allclose(seen["v_bar"], seen["v"], rtol=1e-6, atol=0)
    assert len(torch.unique(seen["v"][seen["v"] > 0])) > 100   # per coordinate, not one value per tensor


@pytest.mark.parametrize("method", ["fedact", "fedlada"])
def test_resume_equals_uninterrupted(method, tmp_path):
    cfg = tiny_config(**{**BASE, "rounds": 4}, method=method)
    assert resumed(cfg, tmp_path).same_as(ff.run(cfg, progress=False))


def test_bad_input_and_engine():
    with pytest.raises(ValueError, match=r"method_args\['tau_min'\] of method 'fedact' must be > 0 and <= 1"):
        tiny_config(method="fedact", method_args={"tau_min": 0.0})
    with pytest.raises(ValueError, match=r"method_args\['tau_min'\]"):
        tiny_config(method="fedact", method_args={"tau_min": 1.5})
    with pytest.raises(ValueError, match=r"method_args\['alpha'\] of method 'fedact' must be >= 0"):
        tiny_config(method="fedact", method_args={"alpha": -1.0})
    for method in ("fedact", "fedlada"):
        with pytest.raises(ValueError, match=f"{method}.*engine='sequential'"):
            ff.run(tiny_config(method=method, engine="batched"), progress=False)
