"""QK/V splitter: re-parameterise attention into a query/key block and a value block.

timm fuses Q, K and V into one `qkv` Linear(dim, 3*dim) (rows [0:d] Q, [d:2d] K, [2d:3d] V),
so `requires_grad` cannot freeze Q/K alone, and masking gradients is fragile (weight decay and
momentum still move masked rows). `split_qkv` replaces the fused projection by `SplitQKV`, which
holds separate `q`, `k`, `v` Linears and returns their concatenation: the attention module's
own forward is unchanged and its output identical. `nn.MultiheadAttention` is replaced by
`SplitMultiheadAttention` likewise. Then the parameters fall into groups (`param_groups`):
`qk` fixes the attention kernel K = W_Q W_K^T (paper, Sec. 3), `v` is the value block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SplitQKV", "SplitMultiheadAttention", "split_qkv", "merge_qkv", "param_groups",
           "group_sizes", "freeze", "unfreeze", "trainable_state", "load_trainable",
           "attention_kernels", "GROUPS"]

GROUPS = ("qk", "v", "attn_out", "mlp", "norm", "embed", "head", "other")
# "other": parameters no rule recognises (e.g. a model family's own local mixing layers); they train
# like any other group and are never frozen unless named.


class SplitQKV(nn.Module):
    """Drop-in for a fused qkv Linear: separate q, k, v Linears, outputs concatenated."""

    def __init__(self, q: nn.Linear, k: nn.Linear, v: nn.Linear, num_heads: int | None = None):
        super().__init__()
        self.q, self.k, self.v = q, k, v
        self.num_heads = num_heads

    @classmethod
    def from_fused(cls, fused: nn.Linear, num_heads: int | None = None) -> "SplitQKV":
        out3, dim = fused.weight.shape
        if out3 % 3:
            raise ValueError(f"fused qkv has {out3} output rows, not a multiple of 3")
        d = out3 // 3
        kw = dict(device=fused.weight.device, dtype=fused.weight.dtype)
        parts = [nn.Linear(dim, d, bias=fused.bias is not None, **kw) for _ in range(3)]
        with torch.no_grad():
            for i, lin in enumerate(parts):
                lin.weight.copy_(fused.weight[i * d:(i + 1) * d])
                if fused.bias is not None:
                    lin.bias.copy_(fused.bias[i * d:(i + 1) * d])
        return cls(*parts, num_heads=num_heads)

    def to_fused(self) -> nn.Linear:
        w = self.weight
        fused = nn.Linear(w.shape[1], w.shape[0], bias=self.q.bias is not None,
                          device=w.device, dtype=w.dtype)
        with torch.no_grad():
            fused.weight.copy_(w)
            if fused.bias is not None:
                fused.bias.copy_(self.bias)
        return fused

    @property
    def weight(self) -> torch.Tensor:
        """The fused (3d, dim) weight, for modules that call F.linear(x, qkv.weight) directly."""
        return torch.cat([self.q.weight, self.k.weight, self.v.weight], dim=0)

    @property
    def bias(self) -> torch.Tensor | None:
        if self.q.bias is None:
            return None
        return torch.cat([self.q.bias, self.k.bias, self.v.bias], dim=0)

    @property
    def in_features(self) -> int:
        return self.q.in_features

    @property
    def out_features(self) -> int:
        return 3 * self.q.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # one matmul with the concatenated weight: same result as cat([q(x), k(x), v(x)]), fewer kernels
        return F.linear(x, self.weight, self.bias)


class SplitMultiheadAttention(nn.Module):
    """`nn.MultiheadAttention` with separate q, k, v Linears (same forward signature).

    `in_proj_bias` is None and `_qkv_same_embed_dim` False, so nn.TransformerEncoderLayer
    takes its regular (non fast-path) route, which calls this module's forward.
    """

    in_proj_weight = None
    in_proj_bias = None
    _qkv_same_embed_dim = False

    def __init__(self, mha: nn.MultiheadAttention):
        super().__init__()
        if not mha._qkv_same_embed_dim:
            raise TypeError("split_qkv supports nn.MultiheadAttention with kdim == vdim == embed_dim")
        self.embed_dim, self.num_heads = mha.embed_dim, mha.num_heads
        self.head_dim = mha.head_dim
        self.dropout, self.batch_first = mha.dropout, mha.batch_first
        self.add_zero_attn = mha.add_zero_attn
        self.bias_k, self.bias_v = mha.bias_k, mha.bias_v
        fused = nn.Linear(self.embed_dim, 3 * self.embed_dim, bias=mha.in_proj_bias is not None,
                          device=mha.in_proj_weight.device, dtype=mha.in_proj_weight.dtype)
        with torch.no_grad():
            fused.weight.copy_(mha.in_proj_weight)
            if mha.in_proj_bias is not None:
                fused.bias.copy_(mha.in_proj_bias)
        split = SplitQKV.from_fused(fused)
        self.q, self.k, self.v = split.q, split.k, split.v
        self.out_proj = mha.out_proj

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        bias = None
        if self.q.bias is not None:
            bias = torch.cat([self.q.bias, self.k.bias, self.v.bias])
        out, weights = F.multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads, None, bias,
            self.bias_k, self.bias_v, self.add_zero_attn, self.dropout,
            self.out_proj.weight, self.out_proj.bias, training=self.training,
            key_padding_mask=key_padding_mask, need_weights=need_weights, attn_mask=attn_mask,
            use_separate_proj_weight=True, q_proj_weight=self.q.weight,
            k_proj_weight=self.k.weight, v_proj_weight=self.v.weight,
            average_attn_weights=average_attn_weights, is_causal=is_causal)
        if self.batch_first:
            out = out.transpose(0, 1)
        return out, weights

    def to_stock(self) -> nn.MultiheadAttention:
        w = self.q.weight
        mha = nn.MultiheadAttention(self.embed_dim, self.num_heads, dropout=self.dropout,
                                    bias=self.q.bias is not None, add_bias_kv=self.bias_k is not None,
                                    add_zero_attn=self.add_zero_attn, batch_first=self.batch_first,
                                    device=w.device, dtype=w.dtype)
        with torch.no_grad():
            mha.in_proj_weight.copy_(torch.cat([self.q.weight, self.k.weight, self.v.weight]))
            if mha.in_proj_bias is not None:
                mha.in_proj_bias.copy_(torch.cat([self.q.bias, self.k.bias, self.v.bias]))
            if self.bias_k is not None:
                mha.bias_k.copy_(self.bias_k)
                mha.bias_v.copy_(self.bias_v)
        mha.out_proj = self.out_proj
        return mha


# --- split / merge ----------------------------------------------------------------------

_SEPARATE = {"q", "k", "v", "q_proj", "k_proj", "v_proj", "query", "key", "value"}


def _has_separate_projections(module: nn.Module) -> bool:
    names = {n for n, c in module.named_children() if isinstance(c, nn.Linear)}
    return ({"q", "k", "v"} <= names or {"q_proj", "k_proj", "v_proj"} <= names
            or {"query", "key", "value"} <= names)


def _is_split(model: nn.Module) -> bool:
    return any(isinstance(m, (SplitQKV, SplitMultiheadAttention)) for m in model.modules())


def split_qkv(model: nn.Module) -> nn.Module:
    """Replace every fused QKV projection by separate q/k/v Linears, in place.

    Outputs are unchanged. Modules with separate projections already are left as they are;
    splitting twice is a no-op. Raises TypeError if the model has no attention at all.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"split_qkv expects a torch.nn.Module; got {type(model).__name__}")
    found = _is_split(model)
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.MultiheadAttention):
                setattr(parent, child_name, SplitMultiheadAttention(child))
                found = True
            elif child_name == "qkv" and isinstance(child, nn.Linear):
                setattr(parent, child_name,
                        SplitQKV.from_fused(child, num_heads=getattr(parent, "num_heads", None)))
                found = True
        if _has_separate_projections(parent):
            found = True
    if not found:
        raise TypeError(f"{type(model).__name__} has no attention to split: no fused `qkv` Linear, "
                        f"no nn.MultiheadAttention and no separate q/k/v projections")
    return model


def merge_qkv(model: nn.Module) -> nn.Module:
    """Inverse of split_qkv, in place: the state_dict loads strictly into the stock model."""
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, SplitQKV):
                setattr(parent, child_name, child.to_fused())
            elif isinstance(child, SplitMultiheadAttention):
                setattr(parent, child_name, child.to_stock())
    return model


# --- parameter groups -------------------------------------------------------------------

# parts of an attention module that shape the attention weights (the kernel): Q/K projections and
# norms, a fused q+k projection (ConViT), logit temperatures and scales (XCiT, Swin-V2), talking-heads
# mixing of logits and weights (CaiT), gated positional attention (ConViT), pooled queries/keys (MViT)
_QK_PARTS = {"q", "k", "q_proj", "k_proj", "query", "key", "q_norm", "k_norm", "q_bias", "k_bias",
             "logit_scale", "qk", "temperature", "proj_l", "proj_w", "gating_param", "pos_proj",
             "pool_q", "pool_k", "norm_q", "norm_k"}
_V_PARTS = {"v", "v_proj", "value", "v_bias", "pool_v", "norm_v"}
_LAYER_SCALES = {"ls1", "ls2", "ls3", "gamma_1", "gamma_2", "gamma_3", "gamma1", "gamma2", "gamma3", "layer_scale",
                 "layer_scale1", "layer_scale2"}
_ATTN_OUT_PARTS = {"proj", "out_proj", "o_proj", "output"}
_EMBED_PARTS = {"patch_embed", "pos_embed", "cls_token", "reg_token", "dist_token", "absolute_pos_embed",
                "relative_position_bias_table", "embed", "embedding", "embeddings", "downsample",
                "reduction", "pos_drop", "token_embed", "stem", "pool", "rel_pos_h", "rel_pos_w",
                "attention_biases", "pos_embed_fourier"}
_EMBED_PREFIXES = ("patch_embed", "pos_embed", "cls_token", "dist_token")  # numbered copies: CoaT, CrossViT
_HEAD_PARTS = {"head", "head_dist", "classifier", "fc_out", "decoder"}
_MLP_PARTS = {"mlp", "ffn", "linear1", "linear2", "feed_forward", "fc1", "fc2"}
_ATTN_MODULES = {"attn", "self_attn", "attention", "self_attention"}


def _group_of(name: str, attn_prefixes: set) -> str:
    parts = name.split(".")
    mods = parts[:-1]
    # inside an attention module: Q/K, V, output projection
    in_attn = any(name.startswith(p + ".") for p in attn_prefixes) or any(m in _ATTN_MODULES for m in mods)
    if in_attn:
        if any(m in _QK_PARTS for m in mods) or parts[-1] in _QK_PARTS:
            return "qk"
        if any(m in _V_PARTS for m in mods) or parts[-1] in _V_PARTS:
            return "v"
        if any(m in _ATTN_OUT_PARTS for m in mods):
            return "attn_out"
        if any(m in ("relative_position_bias_table", "rel_pos_h", "rel_pos_w", "attention_biases") for m in parts):
            return "embed"
        if any("norm" in m for m in mods):
            return "norm"
    if any(m in _HEAD_PARTS for m in parts[:1]) or parts[0] in _HEAD_PARTS:
        return "head"
    if any(m in _LAYER_SCALES for m in parts):
        return "norm"
    if any(m in _EMBED_PARTS for m in parts) or parts[0].startswith(_EMBED_PREFIXES):
        return "embed"
    if any(m in _MLP_PARTS for m in mods):
        return "mlp"
    if any("norm" in m or m == "ln" for m in parts):
        return "norm"
    if parts[0] == "fc" and len(parts) == 2:  # a top-level classifier named fc
        return "head"
    return "other"


def param_groups(model: nn.Module) -> dict[str, list[str]]:
    """Every parameter name in exactly one of GROUPS.

    qk: W_Q, W_K, their biases, q_norm/k_norm and whatever else shapes the attention weights
    (temperatures, talking-heads mixing, gated positional attention); v: W_V and its bias;
    attn_out: the attention output projection; mlp; norm (incl. layer scales); embed
    (patch/position embeddings, class/register tokens, relative position tables, stems, patch
    merging and pooling); head; other: what no rule recognises (listed by `group_sizes`), so
    that every model that split gets groups.
    """
    attn_prefixes = {n for n, m in model.named_modules()
                     if isinstance(m, (SplitQKV, SplitMultiheadAttention, nn.MultiheadAttention))
                     or _has_separate_projections(m)}
    # a SplitQKV's own prefix is the projection, its parent is the attention module
    attn_prefixes |= {n.rsplit(".", 1)[0] for n in attn_prefixes if "." in n}
    fused = [n for n, _ in model.named_parameters() if n.endswith(("qkv.weight", "in_proj_weight"))]
    if fused:
        raise ValueError(f"fused QKV parameters {fused[:3]}: call fedfrozen.qkv.split_qkv(model) first")
    groups = {g: [] for g in GROUPS}
    for name, _ in model.named_parameters():
        groups[_group_of(name, attn_prefixes)].append(name)
    return groups


def _check_groups(groups) -> None:
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise ValueError(f"unknown parameter group(s) {unknown}; groups are {', '.join(GROUPS)}")


def group_sizes(model: nn.Module) -> dict[str, dict[str, int]]:
    """{group: {"params": count, "bytes": bytes}}; communication accounting uses it."""
    params = dict(model.named_parameters())
    return {g: {"params": sum(params[n].numel() for n in names),
                "bytes": sum(params[n].numel() * params[n].element_size() for n in names)}
            for g, names in param_groups(model).items()}


def _set_requires_grad(model: nn.Module, groups, flag: bool) -> nn.Module:
    _check_groups(groups)
    params = dict(model.named_parameters())
    by_group = param_groups(model)
    for g in groups:
        for n in by_group[g]:
            params[n].requires_grad_(flag)
    return model


def freeze(model: nn.Module, *groups: str) -> nn.Module:
    """requires_grad=False on every parameter of the given groups."""
    return _set_requires_grad(model, groups, False)


def unfreeze(model: nn.Module, *groups: str) -> nn.Module:
    """requires_grad=True on every parameter of the given groups."""
    return _set_requires_grad(model, groups, True)


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The entries a client uploads under the current freezing: trainable parameters only."""
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable(model: nn.Module, state: dict[str, torch.Tensor]) -> nn.Module:
    """Copy `state` (as from trainable_state) into the model's parameters, in place."""
    params = dict(model.named_parameters())
    unknown = [n for n in state if n not in params]
    if unknown:
        raise KeyError(f"load_trainable: the model has no parameters {unknown[:5]}")
    with torch.no_grad():
        for n, t in state.items():
            params[n].copy_(t)
    return model


# --- the attention kernel ----------------------------------------------------------------

def attention_kernels(model: nn.Module) -> list[torch.Tensor]:
    """Per layer, the per-head kernels K_h = W_Q,h^T W_K,h as a (heads, dim, dim) tensor.

    Logits of head h are x W_Q,h^T W_K,h x'^T, so K_h fixes the head's attention kernel
    (the paper's K = W_Q W_K^T in column-vector convention). Biases and q/k norms are not
    included; this is the quantity whose change the loop reports.
    """
    kernels = []
    for m in model.modules():
        if isinstance(m, (SplitQKV, SplitMultiheadAttention)):
            heads = m.num_heads or 1
            wq, wk = m.q.weight.detach(), m.k.weight.detach()
            hd = wq.shape[0] // heads
            wq = wq.reshape(heads, hd, -1)
            wk = wk.reshape(heads, hd, -1)
            kernels.append(wq.transpose(1, 2) @ wk)
    return kernels
