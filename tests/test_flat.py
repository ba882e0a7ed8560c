import copy

import torch
import torch.nn.functional as F

import fedfrozen as ff
from fedfrozen.nets.flat import FlatParams, merged_slices


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


def test_merged_slices_join_adjacent_groups():
    flat = FlatParams(_model())
    assert merged_slices(flat, ["v", "attn_out"]) == [slice(flat.group_range["v"][0], flat.group_range["attn_out"][1])]
    assert len(merged_slices(flat, ["qk", "mlp"])) == 2
    assert merged_slices(flat, [g for g in ff.qkv.GROUPS if g != "qk"]) == [slice(flat.group_range["v"][0], flat.numel)]


def test_mask_slices_are_the_kept_entries_in_order():
    from fedfrozen.nets.update import mask_slices

    flat = FlatParams(_model())
    for trainable in ([g for g in ff.qkv.GROUPS if g != "qk"], ["qk", "mlp"], ["v"], list(ff.qkv.GROUPS)):
        assert mask_slices(flat.mask(trainable)) == merged_slices(flat, trainable)
    assert mask_slices(torch.tensor([0.0, 1, 1, 0, 1])) == [slice(1, 3), slice(4, 5)]
    assert mask_slices(torch.zeros(3)) == []
