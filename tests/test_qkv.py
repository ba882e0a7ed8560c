import copy

import pytest
import timm
import torch
from torch import nn

import fedfrozen as ff
from fedfrozen.nets.qkv import SplitMultiheadAttention, SplitQKV


class Encoder(nn.Module):
    """nn.TransformerEncoder over tokens, with a head; batch_first either way."""

    def __init__(self, batch_first=True):
        super().__init__()
        self.batch_first = batch_first
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, x):  # x: (B, T, 16)
        if not self.batch_first:
            return self.head(self.encoder(x.transpose(0, 1)).mean(0))
        return self.head(self.encoder(x).mean(1))


def _models():
    """(name, constructor, input) for every architecture the splitter supports."""
    img32 = torch.randn(2, 3, 32, 32)
    return [
        ("vit_tiny", lambda: timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, num_classes=5),
         img32),
        ("deit_tiny", lambda: timm.create_model("deit_tiny_patch16_224", img_size=32, patch_size=4, num_classes=5),
         img32),
        ("vit_no_qkv_bias", lambda: timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4,
                                                      qkv_bias=False, num_classes=5), img32),
        ("vit_qk_norm", lambda: timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4,
                                                  qk_norm=True, num_classes=5), img32),
        ("swin", lambda: timm.create_model("swin_tiny_patch4_window7_224", img_size=32, patch_size=2, window_size=4,
                                           embed_dim=24, depths=(1, 1), num_heads=(2, 2), num_classes=5), img32),
        ("eva_fused", lambda: timm.create_model("eva02_tiny_patch14_224", img_size=28, num_classes=5),
         torch.randn(2, 3, 28, 28)),
        ("eva_separate", lambda: timm.create_model("eva02_tiny_patch14_224", img_size=28, qkv_fused=False,
                                                   num_classes=5), torch.randn(2, 3, 28, 28)),
        ("encoder_batch_first", lambda: Encoder(True), torch.randn(2, 7, 16)),
        ("encoder_seq_first", lambda: Encoder(False), torch.randn(2, 7, 16)),
        ("vit_digits", lambda: ff.models.create("vit_digits", 10), torch.randn(2, 1, 8, 8)),
        ("vit_fmnist_w48", lambda: ff.models.create("vit_fmnist_w48", 10), torch.randn(2, 1, 28, 28)),
        ("vit_fmnist_p4", lambda: ff.models.create("vit_fmnist_p4", 10), torch.randn(2, 1, 28, 28)),
        ("vit_cifar", lambda: ff.models.create("vit_cifar", 10), img32),
        ("linear_vit", lambda: ff.models.create("linear_vit", 10), torch.randn(2, 1, 8, 8)),
        ("char_transformer", lambda: ff.models.create("char_transformer", 30), torch.randint(0, 30, (2, 80))),
    ]


MODELS = _models()
IDS = [m[0] for m in MODELS]


def _perturb(model):
    """Non-zero biases/norm scales so the equivalence checks cover every parameter."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("name, make, x", MODELS, ids=IDS)
def test_split_keeps_outputs_and_gradients(name, make, x):
    torch.manual_seed(0)
    model = make()
    _perturb(model)
    model.eval()
    fused = copy.deepcopy(model)
    with torch.no_grad():
        before = fused(x)
    ff.qkv.split_qkv(model)
    with torch.no_grad():
        after = model(x)
    assert (before - after).abs().max().item() <= 1e-5

    # gradients of the split q, k, v equal the row blocks of the fused projection's gradient
    fused(x).pow(2).sum().backward()
    model(x).pow(2).sum().backward()
    fused_mods = dict(fused.named_modules())
    checked = 0
    for mname, m in model.named_modules():
        if isinstance(m, SplitQKV) and isinstance(fused_mods[mname], nn.Linear):
            g = fused_mods[mname].weight.grad
            d = g.shape[0] // 3
            for i, part in enumerate((m.q, m.k, m.v)):
                assert torch.allclose(part.weight.grad, g[i * d:(i + 1) * d], atol=1e-5, rtol=1e-4)
            checked += 1
        elif isinstance(m, SplitMultiheadAttention):
            g = fused_mods[mname].in_proj_weight.grad
            d = g.shape[0] // 3
            for i, part in enumerate((m.q, m.k, m.v)):
                assert torch.allclose(part.weight.grad, g[i * d:(i + 1) * d], atol=1e-5, rtol=1e-4)
            checked += 1
    if name != "eva_separate":
        assert checked > 0


@pytest.mark.parametrize("name, make, x", MODELS, ids=IDS)
def test_groups_partition_every_parameter(name, make, x):
    model = ff.qkv.split_qkv(make())
    groups = ff.qkv.param_groups(model)
    names = [n for names in groups.values() for n in names]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())  # union, no overlap
    assert len(groups["qk"]) > 0 and len(groups["v"]) > 0
    sizes = ff.qkv.group_sizes(model)
    assert sum(s["params"] for s in sizes.values()) == sum(p.numel() for p in model.parameters())
    assert sum(s["bytes"] for s in sizes.values()) == 4 * sum(p.numel() for p in model.parameters())
    # a second split changes nothing
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ff.qkv.split_qkv(model)
    assert list(model.state_dict()) == list(state)


@pytest.mark.parametrize("name, make, x", [m for m in MODELS if m[0] not in ("eva_separate",)],
                         ids=[i for i in IDS if i != "eva_separate"])
def test_merge_round_trip_loads_strictly_into_stock_model(name, make, x):
    torch.manual_seed(0)
    model = make()
    _perturb(model)
    model.eval()
    with torch.no_grad():
        expected = model(x)
    ff.qkv.merge_qkv(ff.qkv.split_qkv(model))
    torch.manual_seed(1)
    stock = make()
    stock.load_state_dict(model.state_dict(), strict=True)
    stock.eval()
    with torch.no_grad():
        assert (stock(x) - expected).abs().max().item() <= 1e-5


def test_frozen_qk_bit_identical_after_adamw_with_weight_decay():
    torch.manual_seed(0)
    model = ff.qkv.split_qkv(ff.models.create("vit_digits", 10))
    ff.qkv.freeze(model, "qk")
    groups = ff.qkv.param_groups(model)
    params = dict(model.named_parameters())
    before = {n: params[n].detach().clone() for n in groups["qk"] + groups["v"]}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    for _ in range(10):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    assert all(torch.equal(params[n], before[n]) for n in groups["qk"])
    assert all(not torch.equal(params[n], before[n]) for n in groups["v"])
    assert set(ff.qkv.trainable_state(model)) == {n for n in params if n not in groups["qk"]}
    ff.qkv.unfreeze(model, "qk")
    assert all(p.requires_grad for p in model.parameters())


def test_trainable_state_round_trip():
    a = ff.qkv.split_qkv(ff.models.create("vit_digits", 10))
    torch.manual_seed(3)
    b = ff.qkv.split_qkv(ff.models.create("vit_digits", 10))
    ff.qkv.freeze(a, "qk", "embed")
    ff.qkv.load_trainable(b, ff.qkv.trainable_state(a))
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    groups = ff.qkv.param_groups(a)
    assert all(torch.equal(pa[n], pb[n]) for n in groups["v"] + groups["mlp"])
    assert not torch.equal(pa[groups["qk"][0]], pb[groups["qk"][0]])
    with pytest.raises(KeyError, match="no parameters"):
        ff.qkv.load_trainable(b, {"nope.weight": torch.zeros(1)})


def test_errors():
    with pytest.raises(TypeError, match="Sequential has no attention"):
        ff.qkv.split_qkv(nn.Sequential(nn.Linear(3, 3)))
    model = ff.qkv.split_qkv(ff.models.create("vit_digits", 10))
    with pytest.raises(ValueError, match="unknown parameter group.*qk, v, attn_out"):
        ff.qkv.freeze(model, "keys")
    with pytest.raises(ValueError, match="split_qkv"):
        ff.qkv.param_groups(ff.models.create("vit_digits", 10))  # not split yet
    with pytest.raises(ValueError, match="unknown model 'resnet_fantasy'"):
        ff.models.create("resnet_fantasy", 10)


def test_kernels_follow_the_definition():
    model = ff.qkv.split_qkv(ff.models.create("vit_digits", 10))
    k = ff.qkv.attention_kernels(model)
    assert len(k) == 3 and k[0].shape == (4, 48, 48)
    attn = model.blocks[0].attn.qkv
    wq, wk = attn.q.weight[12:24], attn.k.weight[12:24]  # head 1
    assert torch.allclose(k[0][1], wq.T @ wk)


def test_project_model_sizes():
    train, _ = ff.data.load("digits")
    m = ff.models.create("vit_digits", 10)
    n = sum(p.numel() for p in m.parameters())
    assert 20_000 < n < 200_000
    assert m(train.x[:4]).shape == (4, 10)
    c = ff.models.create("vit_cifar", 100)
    assert c(torch.randn(2, 3, 32, 32)).shape == (2, 100)
    assert c.embed_dim == 192 and 6 <= len(c.blocks) <= 9


# --- every timm attention family gets groups (XCiT, CaiT, ConViT, MViTv2 were not placed before) ---

FAMILIES = [
    ("xcit", lambda: timm.create_model("xcit_nano_12_p16_224", img_size=32, depth=2, num_classes=5),
     {"blocks.0.gamma1": "norm", "blocks.0.gamma3": "norm", "blocks.0.gamma2": "norm",
      "blocks.0.attn.temperature": "qk", "blocks.0.attn.qkv.v.weight": "v", "blocks.0.local_mp.conv1.weight": "other"}),
    ("cait", lambda: timm.create_model("cait_xxs24_224", img_size=32, patch_size=8, depth=2, num_classes=5),
     {"blocks.0.gamma_1": "norm", "blocks.0.attn.proj_l.weight": "qk", "blocks.0.attn.proj_w.weight": "qk",
      "blocks.0.attn.qkv.q.weight": "qk", "cls_token": "embed"}),
    ("convit", lambda: timm.create_model("convit_tiny", img_size=32, patch_size=8, depth=2,
                                                    local_up_to_layer=1, num_classes=5),
     {"blocks.0.attn.qk.weight": "qk", "blocks.0.attn.v.weight": "v", "blocks.0.attn.gating_param": "qk",
      "blocks.0.attn.pos_proj.weight": "qk"}),
    ("mvitv2", lambda: timm.create_model("mvitv2_tiny", img_size=64, num_classes=5),
     {"stages.0.blocks.0.attn.rel_pos_h": "qk", "stages.0.blocks.0.attn.pool_q.weight": "qk",
      "stages.0.blocks.0.attn.pool_v.weight": "v"}),
]


@pytest.mark.parametrize("name, make, expected", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_every_parameter_of_other_timm_families_lands_in_one_group(name, make, expected):
    torch.manual_seed(0)
    model = make()
    model.eval()
    x = torch.randn(2, 3, 64 if name == "mvitv2" else 32, 64 if name == "mvitv2" else 32)
    with torch.no_grad():
        before = model(x)
    ff.qkv.split_qkv(model)
    with torch.no_grad():
        assert (model(x) - before).abs().max().item() <= 1e-5
    groups = ff.qkv.param_groups(model)
    placed = [n for names in groups.values() for n in names]
    assert sorted(placed) == sorted(n for n, _ in model.named_parameters())  # each exactly once
    where = {n: g for g, names in groups.items() for n in names}
    for param, group in expected.items():
        assert where[param] == group, (param, where[param])
    assert groups["qk"] and groups["v"]
    ff.qkv.freeze(model, "qk")  # and freezing the kernel block works on it
    model(x).sum().backward()
    params = dict(model.named_parameters())
    assert all(params[n].grad is None for n in groups["qk"])
    assert any(params[n].grad is not None for n in groups["v"])


# --- nn.MultiheadAttention beyond the fused case; unknown attention is refused, by name ------------------

def test_multihead_attention_with_own_key_and_value_widths_splits_and_groups():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, kdim=6, vdim=5, add_bias_kv=True, batch_first=True)
    model = nn.ModuleDict({"attn": mha})
    q, k, v = torch.randn(2, 4, 16), torch.randn(2, 7, 6), torch.randn(2, 7, 5)
    with torch.no_grad():
        before = mha(q, k, v)[0]
    with pytest.raises(ValueError, match="split_qkv"):
        ff.qkv.param_groups(model)  # unsplit: refused, never "freeze qk freezes nothing"
    ff.qkv.split_qkv(model)
    split = model["attn"]
    assert isinstance(split, SplitMultiheadAttention)
    assert (split.k.in_features, split.v.in_features) == (6, 5)
    with torch.no_grad():
        assert torch.allclose(split(q, k, v)[0], before, atol=1e-6)
    groups = ff.qkv.param_groups(model)
    assert sorted(groups["qk"]) == ["attn.bias_k", "attn.k.bias", "attn.k.weight", "attn.q.bias", "attn.q.weight"]
    assert sorted(groups["v"]) == ["attn.bias_v", "attn.v.bias", "attn.v.weight"]
    ff.qkv.merge_qkv(model)
    stock = nn.MultiheadAttention(16, 2, kdim=6, vdim=5, add_bias_kv=True, batch_first=True)
    stock.load_state_dict(model["attn"].state_dict(), strict=True)
    with torch.no_grad():
        assert torch.allclose(stock(q, k, v)[0], before, atol=1e-6)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_split_encoder_runs_with_a_padding_mask_in_eval():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2)  # enable_nested_tensor=True: the fast path would skip the split layers
    enc.eval()
    x = torch.randn(3, 5, 16)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    with torch.no_grad():
        before = enc(x, src_key_padding_mask=pad)
    ff.qkv.split_qkv(enc)
    assert enc.use_nested_tensor is False
    with torch.no_grad():
        after = enc(x, src_key_padding_mask=pad)
    keep = ~pad
    assert torch.allclose(after[keep], before[keep], atol=1e-5)  # the fast path zeroes padded positions


def test_an_attention_class_the_table_does_not_know_is_refused_by_name():
    class MyAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.proj = nn.Linear(8, 24), nn.Linear(8, 8)

        def forward(self, x):
            q, k, v = self.qkv(x).view(*x.shape[:-1], 2, 12).split(4, dim=-1)  # its own layout
            return self.proj(v.flatten(-2)[..., :8])

    model = nn.Sequential(MyAttention())
    with pytest.raises(TypeError, match=r"MyAttention \(at 0\).*no layout.*fedfrozen.layouts.register"):
        ff.qkv.split_qkv(model)
    with pytest.raises(TypeError, match="MyAttention"):
        ff.qkv.param_groups(model)
    assert isinstance(model[0].qkv, nn.Linear)  # nothing was replaced
    ff.layouts.register(MyAttention, ff.layouts.Layout(arrange="heads", heads=lambda m: 2))
    try:
        ff.qkv.split_qkv(model)
        split = model[0].qkv
        assert torch.equal(split.rows["v"], torch.tensor([8, 9, 10, 11, 20, 21, 22, 23]))
    finally:
        del ff.layouts.LAYOUTS[ff.layouts.class_path(MyAttention)]


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_merge_gives_an_encoder_back_its_nested_tensor_path():
    """split -> merge -> eval with a padding mask equals the stock encoder at every position (padded ones
    included: the stock fast path zeroes them, which the split had to turn off)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2)
    enc.eval()
    x = torch.randn(3, 5, 16)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    stock = enc.use_nested_tensor
    with torch.no_grad():
        before = enc(x, src_key_padding_mask=pad)
    ff.qkv.split_qkv(enc)
    ff.qkv.split_qkv(enc)  # twice: still the stock value to restore
    ff.qkv.merge_qkv(enc)
    assert enc.use_nested_tensor is stock
    with torch.no_grad():
        after = enc(x, src_key_padding_mask=pad)
    assert torch.allclose(after, before, atol=1e-5)


def test_attention_with_projections_of_other_names_is_named_never_called_no_attention():
    """An attention class the table does not know, whose Q/K/V are not in a projection named like one (as timm's
    parallel-block ViTs were), is named with what to do, not called "no attention"."""
    class GroupAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = nn.ModuleList(nn.Linear(8, 24) for _ in range(2))  # Q, K, V per group

        def forward(self, x):
            return sum(h(x)[..., :8] for h in self.heads)

    model = nn.Sequential(nn.Linear(8, 8), GroupAttention())
    with pytest.raises(TypeError, match=r"has attention the QK/V splitter cannot split: .*GroupAttention \(at 1\)"
                                        r".*fedfrozen.layouts.register"):
        ff.qkv.split_qkv(model)


@pytest.mark.parametrize("name, cls", [("efficientvit_m0", "CascadedGroupAttention"),
                                       ("mobilevitv2_050", "LinearSelfAttention"),
                                       ("swiftformer_xs", "EfficientAdditiveAttention")])
def test_timm_families_that_cannot_be_split_are_told_which_class_and_why(name, cls):
    timm = pytest.importorskip("timm")
    model = timm.create_model(name, pretrained=False)
    with pytest.raises(TypeError, match=f"{cls} \\(at .*\\) is refused by the QK/V splitter: .+"):
        ff.qkv.split_qkv(model)


@pytest.mark.parametrize("name", ["vit_pwee_patch16_reg1_gap_256", "vit_dpwee_patch16_reg1_gap_256",
                                  "vit_dwee_patch16_reg1_gap_256", "lowformer_b0"])
def test_timm_families_once_told_no_attention_now_split(name):
    """The parallel-block ViTs, differential attention and LowFormer split with the outputs unchanged (what the
    rows mean: tests/test_layouts.py)."""
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, depth=1) if "vit" in name else timm.create_model(name)
    model.eval()
    x = torch.randn(1, 3, 256, 256) if "vit" in name else torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        before = model(x)
        after = ff.qkv.split_qkv(model)(x)
    assert torch.allclose(after, before, atol=1e-5)
    assert ff.qkv.param_groups(model)["qk"]


def test_a_parallel_block_freezes_its_query_key_rows_only():
    """timm's parallel block (ViT-22B) fuses [MLP input | Q | K | V] in one in_proj: freezing qk keeps exactly the
    Q and K rows of the merged projection; the MLP's rows and V's move."""
    torch.manual_seed(0)
    dim = 32
    model = timm.create_model("vit_pwee_patch16_reg1_gap_256", depth=1, img_size=32, patch_size=8, embed_dim=dim,
                              num_heads=2, mlp_ratio=2, num_classes=3)
    ff.qkv.split_qkv(model)
    ff.qkv.freeze(model, "qk")
    block = model.blocks[0]
    before = block.in_proj.weight.detach().clone()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(torch.randn(4, 3, 32, 32)).square().sum().backward()
    opt.step()
    moved = (block.in_proj.weight.detach() - before).abs().sum(1) > 0
    hidden = block.in_split[0]
    assert not moved[hidden:hidden + 2 * dim].any()  # Q and K
    assert moved[:hidden].all() and moved[hidden + 2 * dim:].all()  # the MLP's input and V
    groups = ff.qkv.param_groups(model)
    assert "blocks.0.in_proj.mlp.weight" in groups["mlp"] and "blocks.0.mlp_out_proj.weight" in groups["mlp"]
    assert "blocks.0.attn_out_proj.weight" in groups["attn_out"] and "blocks.0.in_proj.v.weight" in groups["v"]


def test_the_split_character_transformer_still_sees_only_the_past():
    """The causal case: after the split, a position's representation does not depend on later characters, and
    Q/K are exactly the self-attention's q and k of every layer."""
    torch.manual_seed(0)
    model = ff.qkv.split_qkv(ff.models.create("char_transformer", 30))
    x = torch.randint(0, 30, (2, 80))
    y = x.clone()
    y[:, 50:] = (y[:, 50:] + 1) % 30  # change every character from position 50 on

    def hidden(t):
        h = model.token_embed(t) + model.pos_embed
        return model.encoder(h, mask=model.mask, is_causal=True)

    assert torch.allclose(hidden(x)[:, :50], hidden(y)[:, :50], atol=1e-6)
    assert not torch.allclose(hidden(x)[:, 50:], hidden(y)[:, 50:])
    qk = ff.qkv.param_groups(model)["qk"]
    depth = len(model.encoder.layers)
    assert sorted(qk) == sorted(f"encoder.layers.{i}.self_attn.{w}.{p}" for i in range(depth) for w in "qk"
                                for p in ("weight", "bias"))
