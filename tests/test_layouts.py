"""The splitter's rows mean what the model means, on one small model of every timm family (from timm's registry).

For every attention module of the model, by the groups `param_groups` gives after the split:
- zero the value block (the rows the splitter calls V, and the module's other value parameters): the
  module's output no longer depends on its input;
- make every value the same constant (V weights 0, V biases c): changing the query/key block (Q, K
  rows and whatever else `qk` holds, except talking-heads mixing after the softmax) changes nothing,
  because it changes only the attention weights, which sum to 1;
- with the values left as they are, changing the query/key block does change the output.
A family whose attention the table refuses must say so by name; a class the table does not know fails.
"""

from __future__ import annotations

import warnings

import pytest
import timm
import torch
from torch import nn

import fedfrozen as ff
from fedfrozen.nets.layouts import Layout, Refused, class_path, lookup

SIZE_TOKENS = ("test", "atto", "femto", "pico", "nano", "xxtiny", "xxs", "xtiny", "xs", "tiny", "t8", "s0", "b0",
               "m0", "small", "s12", "s18", "mini")
MAX_CANDIDATES = 6
MAX_PARAMS = 40e6


def _rank(name: str):
    hits = [i for i, t in enumerate(SIZE_TOKENS) if t in name.split("_") or name.startswith(t + "_")]
    return (min(hits) if hits else len(SIZE_TOKENS), len(name), name)


def _meta(name):
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        return timm.create_model(name)


def _attention_classes(model):
    return sorted({class_path(type(m)) for _, m in model.named_modules() if ff.qkv._is_attention(m)})


def _representative(family: str):
    """The smallest of the family's first candidates (by size in the name) that has attention, else None."""
    best = None
    for name in sorted(timm.list_models(module=family), key=_rank)[:MAX_CANDIDATES]:
        try:
            m = _meta(name)
        except Exception:  # noqa: BLE001 - some entries need arguments; the next candidate stands in
            continue
        if not _attention_classes(m):
            continue
        n = sum(p.numel() for p in m.parameters())
        if best is None or n < best[1]:
            best = (name, n)
    return best


FAMILIES = sorted(timm.list_modules())


SMALL = 224  # the input side models with larger defaults are checked at where they run on it


def _runs_at(model, side: int) -> bool:
    try:
        with torch.no_grad():
            model(torch.zeros(1, 3, side, side))
        return True
    except Exception:  # noqa: BLE001 - it needs its own size
        return False


def _build(name):
    """The family's model with fewer blocks where it takes `depth`, on a smaller input (SMALL) where it runs on one
    (built with `img_size`, or as it is): the same attention, faster; else at its own size."""
    default = getattr(timm.models.get_pretrained_cfg(name), "input_size", None) or (3, 224, 224)
    small = max(default[1:]) > SMALL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kw in [*([dict(depth=2, img_size=SMALL), dict(img_size=SMALL)] if small else []), dict(depth=2), {}]:
            torch.manual_seed(0)
            try:
                model = timm.create_model(name, **kw).eval()
            except (TypeError, ValueError, AssertionError):
                continue
            if "img_size" in kw and not _runs_at(model, SMALL):
                continue
            break
    size = (3, SMALL, SMALL) if small and ("img_size" in kw or _runs_at(model, SMALL)) else default
    g = torch.Generator().manual_seed(1)
    return model, torch.randn(2, *size, generator=g)


def _perturb(params, g):
    """Large changes (untrained models' logits are near 0, where a small change barely moves the softmax)."""
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=g))


def _outputs(model, x, modules, inputs):
    """Each attention module's output when it is fed its own fixed random input (`inputs`, filled on first use:
    an untrained model's tokens are nearly alike, so its own inputs would hide what Q/K do)."""
    seen = {}

    def feed(name):
        def replace(_, args):
            if not args or not torch.is_tensor(args[0]) or not args[0].is_floating_point():
                return None
            if name not in inputs:
                g = torch.Generator().manual_seed(len(inputs))
                inputs[name] = torch.randn(args[0].shape, generator=g, dtype=args[0].dtype)
            return (inputs[name], *args[1:])
        return replace

    def record(name):
        def hook(_, args, out):
            out = out[0] if isinstance(out, tuple) else out
            seen[name] = (out.detach().clone(), args[0].detach().clone() if args else None)
        return hook

    handles = [h for n, m in modules
               for h in (m.register_forward_pre_hook(feed(n)), m.register_forward_hook(record(n)))]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return seen


def _module_params(model, prefix, names):
    """(name, parameter) of the `names` (one group's) that lie inside the module at `prefix`."""
    names = set(names)
    return [(n, p) for n, p in model.named_parameters() if n in names and n.startswith(prefix + ".")]


def _query_in_output(model, prefix, module, groups):
    entry = lookup(module)
    parts = entry.query_in_output if isinstance(entry, Layout) else ()
    return [p for n, p in _module_params(model, prefix, groups["qk"])
            if any(n.startswith(f"{prefix}.{q}.") for q in parts)]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_split_rows_mean_what_the_model_means(family):
    chosen = _representative(family)
    if chosen is None:
        pytest.skip(f"no attention in the first {MAX_CANDIDATES} models of timm.models.{family}")
    _check(*chosen)


def _check(name, n_params):
    """Split `name` and run the three checks; skips where the table refuses the family or it is too large."""
    model, x = _build(name)
    entries = {class_path(type(m)): lookup(m) for _, m in model.named_modules() if ff.qkv._is_attention(m)}
    unknown = [c for c, e in entries.items() if e is None]
    assert not unknown, f"{name}: attention classes with no entry in fedfrozen.nets.layouts: {unknown}"
    refused = [c for c, e in entries.items() if isinstance(e, Refused)]
    if refused:
        with pytest.raises(TypeError, match="refused by the QK/V splitter"):
            ff.qkv.split_qkv(model)
        pytest.skip(f"{name}: refused ({', '.join(refused)})")
    if sum(p.numel() for p in model.parameters()) > MAX_PARAMS:
        pytest.skip(f"{name}: {n_params / 1e6:.0f}M parameters even with fewer blocks; too large for CI")

    with torch.no_grad():
        before = model(x)
    ff.qkv.split_qkv(model)
    with torch.no_grad():
        after = model(x)
    assert (before - after).abs().max() <= 1e-4 * (1 + before.abs().max()), f"{name}: split changed the output"

    groups = ff.qkv.param_groups(model)
    attn = [(n, m) for n, m, e in ff.qkv.attention_modules(model) if not isinstance(m, nn.MultiheadAttention)]
    block = {prefix for prefix, m in attn if getattr(lookup(m), "residual", False)}
    with torch.no_grad():  # a block's layer scale (1e-5 at init in timm's) would hide its branch from every check
        for n, p in model.named_parameters():
            if any(n.startswith(f"{prefix}.") and set(n.split(".")) & ff.qkv._LAYER_SCALES for prefix in block):
                p.fill_(1.0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    fed = {}
    g = torch.Generator().manual_seed(2)

    # 1. no values, no dependence on the input (where the query is added to the output too, no query either; a
    # whole block, as a parallel one, without its MLP and minus its input, which it adds to its output)
    carried = {prefix: _query_in_output(model, prefix, m, groups) for prefix, m in attn}
    for prefix, _ in attn:
        mlp = [p for _, p in _module_params(model, prefix, groups["mlp"])] if prefix in block else []
        with torch.no_grad():
            for p in [p for _, p in _module_params(model, prefix, groups["v"])] + carried[prefix] + mlp:
                p.zero_()
    for prefix, (out, inp) in _outputs(model, x, attn, fed).items():
        assert inp is None or (inp - inp[:1]).abs().max() > 1e-6, f"{prefix}: its inputs do not vary"
        out = out - inp if prefix in block else out
        assert (out - out[:1]).abs().max() <= 1e-5 * (1 + out.abs().max()), \
            f"{name}: {prefix} still depends on its input with the rows called V zeroed"

    # 2. constant values: the query/key block changes only the attention weights
    model.load_state_dict(state)
    qk_of = {}
    for prefix, m in attn:
        entry = lookup(m)
        post = tuple(entry.post_softmax) if isinstance(entry, Layout) else ()
        qk_of[prefix] = [p for n, p in _module_params(model, prefix, groups["qk"])
                         if n[len(prefix) + 1:].split(".")[0] not in post and not any(p is c for c in carried[prefix])]
        with torch.no_grad():
            for n, p in _module_params(model, prefix, groups["v"]):
                p.fill_(0.37) if n.endswith("bias") else p.zero_()
    reference = _outputs(model, x, attn, fed)
    for prefix, _ in attn:
        _perturb(qk_of[prefix], g)
    for prefix, (out, _) in _outputs(model, x, attn, fed).items():
        ref = reference[prefix][0]
        assert (out - ref).abs().max() <= 1e-4 * (1 + ref.abs().max()), \
            f"{name}: {prefix}: the query/key block changed more than the attention weights"

    # 3. and with the real values, it matters
    model.load_state_dict(state)
    reference = _outputs(model, x, attn, fed)
    for prefix, _ in attn:
        _perturb(qk_of[prefix], g)
    unchanged = [p for p, (out, _) in _outputs(model, x, attn, fed).items()
                 if qk_of[p] and (out - reference[p][0]).abs().max() <= 1e-5 * (1 + reference[p][0].abs().max())]
    assert not unchanged, f"{name}: changing the query/key block changed nothing in {unchanged}"
    assert [p for p, _ in attn if qk_of[p]] and groups["v"]


# families whose representative (the first small model) does not show every attention class of the family: ViT's
# parallel blocks (ViT-22B's; with differential attention) and differential attention in standard blocks
NAMED = ["vit_pwee_patch16_reg1_gap_256", "vit_dpwee_patch16_reg1_gap_256", "vit_dwee_patch16_reg1_gap_256"]


@pytest.mark.parametrize("name", NAMED)
def test_the_split_rows_mean_what_the_model_means_in_named_models(name):
    _check(name, 0)


@pytest.mark.parametrize("name, cls, wrong", [
    ("maxvit_rmlp_pico_rw_256", "timm.models.maxxvit.AttentionCl", Layout(qk=("relative_position_bias_table",))),
    ("davit_tiny", "timm.models.davit.ChannelAttention", Layout(token_kernel=False)),
    ("vit_pwee_patch16_reg1_gap_256", "timm.models.vision_transformer.ParallelScalingBlock",
     Layout(proj="in_proj", roles=("v", "q", "k"), mlp_rows=lambda m: m.in_split[0], mlp=("mlp_bias", "mlp_out_proj"),
            residual=True)),
], ids=["maxvit heads-first read as blocks", "davit channel attention read as q,k,v",
        "parallel block read as q,k,v then the MLP"])
def test_the_checks_catch_the_old_guess(name, cls, wrong, monkeypatch):
    """Rows [0:d], [d:2d], [2d:3d] as Q, K, V (the guess the splitter made before it read layouts): the split
    keeps the outputs, but the semantic checks see that the rows called V are not the values."""
    _check(name, 0)  # right with the table's layout
    monkeypatch.setitem(ff.layouts.LAYOUTS, cls, wrong)
    with pytest.raises(AssertionError, match="still depends on its input|changed more than the attention weights"):
        _check(name, 0)
