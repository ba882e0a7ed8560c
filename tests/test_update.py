"""The local update rule (fedfrozen.nets.update): one composed rule, the only place where frozen and client masks
apply."""

import copy
import dataclasses
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

import fedfrozen as ff
from fedfrozen import batched, local, loop
from fedfrozen.nets.flat import FlatParams, merged_slices
from fedfrozen.nets.update import FlatOptimizer, UpdateRule, clip_by_norm


def _model():
    torch.manual_seed(0)
    return ff.qkv.split_qkv(ff.models.create("vit_digits", 10, embed_dim=16, depth=2, num_heads=2))


def _batch():
    return torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(1)), torch.arange(8) % 10


@pytest.mark.parametrize("kind, kw, torch_opt", [
    ("adamw", dict(lr=1e-2, weight_decay=0.05), lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.05)),
    ("sgd", dict(lr=0.1, weight_decay=0.01, momentum=0.9),
     lambda ps: torch.optim.SGD(ps, lr=0.1, weight_decay=0.01, momentum=0.9)),
])
def test_the_rule_over_the_stage_mask_matches_torch_on_the_trainable_parameters(kind, kw, torch_opt):
    model = _model()
    reference = copy.deepcopy(model)
    flat = FlatParams(model)
    ff.qkv.freeze(reference, "qk")
    trainable = [g for g in ff.qkv.GROUPS if g != "qk"]
    lr = kw.pop("lr")  # the step's argument: the rule holds the rest
    opt = FlatOptimizer(flat, UpdateRule(kind, **kw), trainable=flat.mask(trainable), model=model)
    ref_opt = torch_opt([p for p in reference.parameters() if p.requires_grad])
    x, y = _batch()
    for _ in range(5):
        flat.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step(lr)
        ref_opt.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        ref_opt.step()
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert torch.allclose(p, q, atol=1e-5, rtol=1e-4), name
    qk = flat.group_slice("qk")
    assert torch.equal(flat.data[qk], torch.cat([p.detach().reshape(-1) for n, p in reference.named_parameters()
                                                 if n in ff.qkv.param_groups(reference)["qk"]]))


def test_the_stage_mask_given_to_the_rule_decides_what_moves():
    """requires_grad, the optimiser's state and the batched engine's stacked entries all come from the one mask the
    rule is built on; for whole groups its slices are merged_slices of the groups."""
    model = _model()
    flat = FlatParams(model)
    for trainable in ([g for g in ff.qkv.GROUPS if g != "qk"], ["qk", "mlp"], ["v"], list(ff.qkv.GROUPS)):
        opt = FlatOptimizer(flat, trainable=flat.mask(trainable), model=model)
        frozen = [g for g in ff.qkv.GROUPS if g not in trainable]
        assert opt.slices == merged_slices(flat, trainable)
        assert opt.m.numel() == sum(flat.group_numel(g) for g in trainable)  # state for the trainable entries only
        layout = batched.EntryMap(model, flat, opt.slices)
        assert layout.tslices == merged_slices(flat, trainable) and layout.fslices == merged_slices(flat, frozen)
        groups = ff.qkv.param_groups(model)
        for g in ff.qkv.GROUPS:
            assert all(dict(model.named_parameters())[n].requires_grad == (g in trainable) for n in groups[g]), g
    FlatOptimizer(flat, model=model)  # no mask: everything trains again
    assert all(p.requires_grad for p in model.parameters())


def test_the_client_mask_and_the_clip_are_the_rules_and_come_in_that_order():
    """Outside the client's mask nothing moves (no gradient, no weight decay); the clip's norm is taken after the
    mask, over the whole buffer."""
    model = _model()
    flat = FlatParams(model)
    opt = FlatOptimizer(flat, UpdateRule("adamw", weight_decay=0.1, clip=0.5))
    mask = (torch.rand(flat.numel, generator=torch.Generator().manual_seed(2)) < 0.5).float()
    opt.mask = mask
    x0 = flat.data.clone()
    g = torch.randn(flat.numel, generator=torch.Generator().manual_seed(3))
    flat.grad.copy_(g)
    opt.step(1e-2)
    off = mask == 0
    assert torch.equal(flat.data[off], x0[off]) and not torch.equal(flat.data[~off], x0[~off])
    assert torch.allclose(flat.grad, clip_by_norm(g * mask, 0.5))  # the gradient the core stepped with
    assert flat.grad.norm() <= 0.5 + 1e-6 < (g * mask).norm()
    rows = torch.randn(3, 10)  # stacked clients: one norm per row, the frozen entries' squared norm added
    extra = torch.tensor([[0.0], [4.0], [0.0]])
    out = clip_by_norm(rows.clone(), 1.0, extra)
    assert torch.allclose((out[1].pow(2).sum() + 4.0 * (out[1].norm() / rows[1].norm()) ** 2).sqrt(),
                          torch.tensor(1.0), atol=1e-5)


def test_methods_transform_the_rule_and_reset_restores_the_runs():
    """FedAdamW's lr_scale and after_step, a direction over the Adam moments; the next client starts from the base."""
    flat = FlatParams(_model())
    opt = FlatOptimizer(flat, UpdateRule("adamw", weight_decay=0.0))
    calls, seen = [], []
    opt.rule = dataclasses.replace(opt.rule, lr_scale=0.5, after_step=lambda: calls.append("after"),
                                   direction=lambda o, lr: seen.append((lr, o.m.abs().sum().item() > 0)))
    flat.grad.copy_(torch.ones(flat.numel))
    x0 = flat.data.clone()
    opt.step(1e-2)
    assert calls == ["after"] and seen == [(0.5 * 1e-2, True)]  # the scaled lr; the core's moments updated first
    assert torch.equal(flat.data, x0)  # the direction replaced AdamW's update (this one moves nothing)
    opt.mask = torch.ones(flat.numel)
    opt.reset()
    assert opt.rule is opt.base and opt.mask is None and opt.t == 0 and opt.m.abs().sum() == 0
    assert opt.rule.plain and not dataclasses.replace(opt.base, lr_scale=0.9).plain


def test_bad_rules_are_refused():
    flat = FlatParams(_model())
    with pytest.raises(ValueError, match="optimizer must be 'adamw' or 'sgd'"):
        UpdateRule("adam")
    with pytest.raises(ValueError, match="transform the Adam core; the optimizer is 'sgd'"):
        UpdateRule("sgd", coupled_decay=1e-3)
    with pytest.raises(TypeError, match="rule must be an UpdateRule"):
        FlatOptimizer(flat, [slice(0, 10)])  # the slices of earlier versions: the trainable mask decides now
    with pytest.raises(ValueError, match=r"trainable must be a 0/1 mask over the flat buffer"):
        FlatOptimizer(flat, trainable=torch.ones(3))
    sgd = FlatOptimizer(flat, UpdateRule("sgd"))
    with pytest.raises(ValueError, match="SGD; it has no second moments"):
        sgd.start_from(torch.zeros(flat.numel), 1)
    cfg = tiny_config(engine="batched")
    s = loop.prepare(cfg)
    opt = local.make_optimizer(cfg, s.flat)
    client = SimpleNamespace(idx=s.client_train[0], gen=torch.Generator().manual_seed(0), correction=None, mask=None)
    scaled = dataclasses.replace(opt.rule, lr_scale=0.5)
    with pytest.raises(ValueError, match="one plain rule"):
        batched.train_chunk(s, batched.EntryMap(s.model, s.flat, opt.slices), scaled, cfg.lr, s.flat.data.clone(),
                            [client])


def test_server_moments_go_in_and_come_back_over_the_slices():
    flat = FlatParams(_model())
    trainable = torch.zeros(flat.numel)
    trainable[0:10] = trainable[20:30] = 1
    opt = FlatOptimizer(flat, trainable=trainable)
    full = torch.arange(flat.numel, dtype=torch.float32)
    opt.start_from(full, t=7)
    assert opt.t == 7 and torch.equal(opt.v, torch.cat([full[0:10], full[20:30]]))
    back = opt.second_moments()
    assert torch.equal(back[0:10], full[0:10]) and torch.equal(back[20:30], full[20:30])
    assert back[10:20].abs().sum() == 0 and back[30:].abs().sum() == 0


def test_the_config_gives_the_rule():
    cfg = tiny_config(optimizer="sgd", momentum=0.5, weight_decay=0.02, grad_clip=2.0, lr=0.05)
    assert UpdateRule.from_config(cfg) == UpdateRule("sgd", weight_decay=0.02, momentum=0.5, clip=2.0)
