"""The local objective's gradient terms are exact: zero where they vanish, and FedProx is FedProx under AdamW."""

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

from fedfrozen import batched, local, loop


def _vectors(n=4096, rows=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (n,) if rows is None else (rows, n)
    # gradients far smaller than the weights: where the old two-rounding form left a residue
    return (1e-9 * torch.randn(shape, generator=g), torch.randn(shape, generator=g),
            torch.randn(shape, generator=g))


@pytest.mark.parametrize("rows", [None, 3], ids=["one client", "stacked clients"])
def test_every_term_vanishes_bit_for_bit_where_it_should(rows):
    g, x, c = _vectors(rows=rows)
    vs = slice(100, 900)
    at_anchor = [
        dict(anchor=x.clone(), anchor_coeff=0.1),                                          # FedProx at x^r
        dict(anchor=x.clone(), anchor_coeff=0.1, value_l2=0.3, value_mode="prox", vs=vs),  # + value prox
        dict(anchor=x.clone(), anchor_coeff=0.1, correction=-(c - c)),                     # FedDyn, h_i = 0
        dict(correction=c - c.clone()),                                                     # SCAFFOLD, c == c_i
    ]
    for kw in at_anchor:
        assert torch.equal(local.grad_terms(g.clone(), x, **kw), g), kw


def test_each_term_is_one_rounding_of_its_formula():
    g, x, a = _vectors(seed=1)
    vs = slice(0, 1000)
    out = local.grad_terms(g.clone(), x, anchor=a, anchor_coeff=0.1, value_l2=0.3, value_mode="prox", vs=vs)
    expected = g + 0.1 * (x - a)
    expected[vs] += 0.3 * (x - a)[vs]
    assert torch.allclose(out, expected, rtol=0, atol=1e-7)
    ridge = local.grad_terms(g.clone(), x, anchor=a, value_l2=0.3, value_mode="ridge", vs=vs)
    assert torch.allclose(ridge[vs], g[vs] + 0.3 * x[vs], rtol=0, atol=1e-7) and torch.equal(ridge[1000:], g[1000:])


def _one_step(cfg, anchor_coeff, value_l2=0.0, engine="sequential"):
    s = loop.prepare(cfg)
    x0 = s.flat.data.clone()
    opt = local.make_optimizer(cfg, s.flat)
    gen = torch.Generator().manual_seed(7)
    if engine == "sequential":
        local.train(s, opt, cfg.lr, s.client_train[0], gen, steps=1, anchor=x0, anchor_coeff=anchor_coeff,
                    value_l2=value_l2, value_mode="prox")
        return s.flat.data.clone()
    layout = batched.EntryMap(s.model, s.flat, opt.slices)
    client = SimpleNamespace(idx=s.client_train[0], gen=gen, correction=None, mask=None)
    trained = batched.train_chunk(s, layout, opt.rule, cfg.lr, x0, [client], anchor_coeff=anchor_coeff,
                                  value_l2=value_l2, value_mode="prox")
    return trained[0][0].clone()


@pytest.mark.parametrize("engine", ["sequential", "batched"])
@pytest.mark.parametrize("optimizer, lr", [("adamw", 1e-2), ("sgd", 0.05)])
def test_a_prox_client_at_the_anchor_takes_exactly_the_fedavg_step(optimizer, lr, engine):
    cfg = tiny_config(optimizer=optimizer, lr=lr, local_steps=1)
    fedavg = _one_step(cfg, 0.0, engine=engine)
    assert torch.equal(_one_step(cfg, 0.1, engine=engine), fedavg)
    assert torch.equal(_one_step(cfg, 0.1, value_l2=0.5, engine=engine), fedavg)


def test_fedprox_under_adamw_matches_a_plain_torch_reference_client():
    """The reference is FedProx as written from its definition (and Flower's recipe): autograd of
    loss + mu/2 ||x - x^r||^2, stepped by torch.optim.AdamW, over the same batches."""
    mu, steps = 0.1, 20
    cfg = tiny_config(optimizer="adamw", lr=1e-2, weight_decay=0.01)
    s = loop.prepare(cfg)
    reference = copy.deepcopy(s.model)
    anchor = [p.detach().clone() for p in reference.parameters()]
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    idx = s.client_train[0]
    order, sizes, _ = local.draw_batches(s, idx, torch.Generator().manual_seed(3), steps=steps)
    reference.train()
    for b in torch.split(order, sizes):
        ref_opt.zero_grad()
        loss = F.cross_entropy(reference(s.x[b]), s.y[b])
        loss = loss + mu / 2 * sum((p - a).pow(2).sum() for p, a in zip(reference.parameters(), anchor))
        loss.backward()
        ref_opt.step()

    opt = local.make_optimizer(cfg, s.flat)
    local.train(s, opt, cfg.lr, idx, torch.Generator().manual_seed(3), steps=steps, anchor=s.flat.data.clone(),
                anchor_coeff=mu)
    worst = max((p - q).abs().max().item() for p, q in zip(s.model.parameters(), reference.parameters()))
    assert worst <= 1e-6, worst
    moved = max((p - a).abs().max().item() for p, a in zip(s.model.parameters(), anchor))
    assert moved > 1e-3  # it trained
