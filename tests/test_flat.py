import copy

import pytest
import torch
import torch.nn.functional as F

import fedfrozen as ff
from fedfrozen.flat import FlatOptimizer, FlatParams, merged_slices


def _model():
    torch.manual_seed(0)
    return ff.qkv.split_qkv(ff.models.create("vit_digits", 10, embed_dim=16, depth=2, num_heads=2))


def test_parameters_and_gradients_are_views_of_the_flat_buffers():
    model = _model()
    reference = copy.deepcopy(model)
    flat = FlatParams(model)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))  # re-homing changes no value
    F.cross_entropy(model(x), y).backward()
    F.cross_entropy(reference(x), y).backward()
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        a, b = flat.param_range[name]
        assert p.data_ptr() == flat.data[a:b].data_ptr()
        assert torch.allclose(flat.grad[a:b].view_as(p), q.grad, atol=1e-6)
    for g, (a, b) in flat.group_range.items():  # groups are contiguous and in order
        assert all(flat.param_range[n][0] >= a and flat.param_range[n][1] <= b
                   for n in ff.qkv.param_groups(model)[g])


@pytest.mark.parametrize("kind, kw, torch_opt", [
    ("adamw", dict(lr=1e-2, weight_decay=0.05), lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.05)),
    ("sgd", dict(lr=0.1, weight_decay=0.01, momentum=0.9),
     lambda ps: torch.optim.SGD(ps, lr=0.1, weight_decay=0.01, momentum=0.9)),
])
def test_flat_optimizer_matches_torch(kind, kw, torch_opt):
    model = _model()
    reference = copy.deepcopy(model)
    flat = FlatParams(model)
    ff.qkv.freeze(model, "qk")
    ff.qkv.freeze(reference, "qk")
    trainable = [g for g in ff.qkv.GROUPS if g != "qk"]
    lr = kw.pop("lr")  # the step's argument: the rule holds the rest
    opt = FlatOptimizer(flat, merged_slices(flat, trainable), kind, **kw)
    ref_opt = torch_opt([p for p in reference.parameters() if p.requires_grad])
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
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


def test_merged_slices_join_adjacent_groups():
    flat = FlatParams(_model())
    assert merged_slices(flat, ["v", "attn_out"]) == [slice(flat.group_range["v"][0], flat.group_range["attn_out"][1])]
    assert len(merged_slices(flat, ["qk", "mlp"])) == 2
    assert merged_slices(flat, [g for g in ff.qkv.GROUPS if g != "qk"]) == [slice(flat.group_range["v"][0], flat.numel)]


def test_the_optimisers_client_entry_points():
    """What FedAdamW / FedLADA / FedACT use instead of setting the optimiser's attributes."""
    model = _model()
    qkv_free = FlatParams(model)
    slices = [slice(0, 10), slice(20, 30)]
    opt = FlatOptimizer(qkv_free, slices, "adamw")
    full = torch.arange(qkv_free.numel, dtype=torch.float32)
    opt.start_from(full, t=7)
    assert opt.t == 7 and torch.equal(opt.v, torch.cat([full[0:10], full[20:30]]))
    back = opt.second_moments()
    assert torch.equal(back[0:10], full[0:10]) and torch.equal(back[20:30], full[20:30])
    assert back[10:20].abs().sum() == 0 and back[30:].abs().sum() == 0
    calls = []
    rule = opt.rule
    opt.configure_client(lr_scale=0.5, weight_decay=0.1, after_step=lambda: calls.append("after"))
    assert (opt.lr_scale, opt.rule.weight_decay) == (0.5, 0.1) and rule.weight_decay == 0.0  # a new rule
    seen = []
    opt.configure_client(step_rule=lambda o, lr: seen.append(lr))
    qkv_free.grad.zero_()
    opt.step(1e-2)
    assert calls == ["after"] and seen == [0.5 * 1e-2]  # the step's lr times the client's scale
    opt.clear_client_rules()
    opt.step(1e-2)
    assert calls == ["after"] and seen == [0.5 * 1e-2] and opt.step_rule is None
    with pytest.raises(ValueError, match="unknown setting.*'momentum'"):
        opt.configure_client(momentum=0.9)
    with pytest.raises(ValueError, match="optimizer must be 'adamw' or 'sgd'"):
        FlatOptimizer(qkv_free, slices, "adam")
    sgd = FlatOptimizer(qkv_free, slices, "sgd")
    with pytest.raises(ValueError, match="SGD; it has no second moments"):
        sgd.start_from(full, 1)


def test_the_trainable_mask_decides_what_moves():
    """requires_grad, the optimiser's slices and the batched engine's entries all follow from one mask; for whole
    groups its slices are merged_slices of the groups."""
    from fedfrozen.flat import mask_slices

    model = _model()
    flat = FlatParams(model)
    for trainable in ([g for g in ff.qkv.GROUPS if g != "qk"], ["qk", "mlp"], ["v"], list(ff.qkv.GROUPS)):
        mask = flat.mask(trainable)
        assert mask_slices(mask) == merged_slices(flat, trainable)
        frozen = [g for g in ff.qkv.GROUPS if g not in trainable]
        assert mask_slices(mask == 0) == merged_slices(flat, frozen)
        flat.train_only(model, mask)
        groups = ff.qkv.param_groups(model)
        for g in ff.qkv.GROUPS:
            assert all(dict(model.named_parameters())[n].requires_grad == (g in trainable) for n in groups[g]), g
    assert mask_slices(torch.tensor([0.0, 1, 1, 0, 1])) == [slice(1, 3), slice(4, 5)]
    assert mask_slices(torch.zeros(3)) == []
