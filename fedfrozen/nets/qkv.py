"""QK/V splitter: re-parameterise attention into a query/key block and a value block.

timm fuses Q, K and V into one projection (`qkv`, or `kv` beside a separate `q`), so
`requires_grad` cannot freeze Q/K alone, and masking gradients is fragile (weight decay and
momentum still move masked rows). Which rows are Q, K and V depends on how the module's forward
reshapes them, so `split_qkv` reads each attention class's layout from fedfrozen.nets.layouts (and
refuses a class it does not know) and replaces the fused projection by `SplitQKV`, which holds
separate `q`, `k`, `v` Linears and returns their rows in the module's order: the attention
module's own forward is unchanged and its output identical. `nn.MultiheadAttention` is replaced by
`SplitMultiheadAttention` likewise. Then the parameters fall into groups (`param_groups`):
`qk` fixes the attention kernel K = W_Q W_K^T (paper, Sec. 3), `v` is the value block.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from .layouts import LAYOUTS, PROJECTION_NAMES, Layout, Refused, class_path, lookup

__all__ = ["param_names", "SplitQKV", "SplitMultiheadAttention", "split_qkv", "merge_qkv", "param_groups",
           "group_sizes", "freeze", "unfreeze", "trainable_state", "load_trainable",
           "attention_kernels", "attention_modules", "GROUPS"]

GROUPS = ("qk", "v", "attn_out", "mlp", "norm", "embed", "head", "other")
# "other": parameters no rule recognises (e.g. a model family's own local mixing layers); they train
# like any other group and are never frozen unless named.


class SplitQKV(nn.Module):
    """Drop-in for a fused projection: separate q, k, v Linears whose outputs, put back in the module's
    own row order, are the fused output.

    `q`, `k`, `v` hold the rows of each role, head after head (a K/V-only projection has no `q`);
    `mlp` the rows that feed an MLP in a parallel block (else None); `order` (None where the parts
    simply follow each other) puts the concatenated rows back in the fused order; `conv` marks a 1x1
    Conv2d projection. `rows[role]` are the fused rows of each part.
    """

    def __init__(self, q: nn.Linear | None, k: nn.Linear, v: nn.Linear, num_heads: int | None = None,
                 order: torch.Tensor | None = None, conv: bool = False, token_kernel: bool = True, rows=None,
                 mlp: nn.Linear | None = None):
        super().__init__()
        self.q, self.k, self.v, self.mlp = q, k, v, mlp
        self.num_heads, self.conv, self.token_kernel = num_heads, conv, token_kernel
        self.register_buffer("order", order, persistent=False)
        self.rows = rows

    @classmethod
    def from_fused(cls, fused: nn.Module, layout: Layout | None = None, module: nn.Module | None = None,
                   num_heads: int | None = None) -> "SplitQKV":
        """Split `fused` (a Linear or a 1x1 Conv2d) by `layout` (default: rows [Q; K; V], equal widths)."""
        layout = layout or Layout()
        conv = isinstance(fused, nn.Conv2d)
        name = class_path(type(module)) if module is not None else "fused projection"
        if conv and (fused.kernel_size != (1, 1) or fused.stride != (1, 1) or fused.groups != 1
                     or fused.padding not in ((0, 0), "valid")):
            raise TypeError(f"{name}: its {layout.proj} is a Conv2d that is not 1x1 (kernel {fused.kernel_size}, "
                            f"stride {fused.stride}, groups {fused.groups}): only 1x1 projections split")
        weight = fused.weight.reshape(fused.weight.shape[0], -1)
        heads = num_heads if module is None else layout.num_heads(module)
        rows = _rows(layout, module, weight.shape[0], heads or 1, name)
        kw = dict(device=weight.device, dtype=weight.dtype)
        parts = {}
        for role in _PARTS:
            if role not in rows:
                parts[role] = None
                continue
            idx = rows[role]
            lin = nn.Linear(weight.shape[1], len(idx), bias=fused.bias is not None, **kw)
            with torch.no_grad():
                lin.weight.copy_(weight[idx])
                if fused.bias is not None:
                    lin.bias.copy_(fused.bias[idx])
            parts[role] = lin
        concat = torch.cat([rows[r] for r in _PARTS if r in rows])
        order = None if torch.equal(concat, torch.arange(len(concat))) else torch.argsort(concat).to(weight.device)
        return cls(parts["q"], parts["k"], parts["v"], num_heads=heads, order=order, conv=conv,
                   token_kernel=layout.token_kernel and "q" in rows, rows=rows, mlp=parts["mlp"])

    def _parts(self):
        return [p for p in (self.q, self.k, self.v, self.mlp) if p is not None]

    def to_fused(self) -> nn.Module:
        w = self.weight
        if self.conv:
            fused = nn.Conv2d(w.shape[1], w.shape[0], 1, bias=self.k.bias is not None, device=w.device, dtype=w.dtype)
        else:
            fused = nn.Linear(w.shape[1], w.shape[0], bias=self.k.bias is not None, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            fused.weight.copy_(w.reshape(fused.weight.shape))
            if fused.bias is not None:
                fused.bias.copy_(self.bias)
        return fused

    @property
    def weight(self) -> torch.Tensor:
        """The fused weight in the module's row order, for modules that call F.linear(x, qkv.weight) directly."""
        w = torch.cat([p.weight for p in self._parts()], dim=0)
        w = w if self.order is None else w[self.order]
        return w[:, :, None, None] if self.conv else w

    @property
    def bias(self) -> torch.Tensor | None:
        if self.k.bias is None:
            return None
        b = torch.cat([p.bias for p in self._parts()], dim=0)
        return b if self.order is None else b[self.order]

    @property
    def in_features(self) -> int:
        return self.k.in_features

    @property
    def out_features(self) -> int:
        return sum(p.out_features for p in self._parts())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # one matmul with the concatenated weight: same result as the fused projection, fewer kernels
        if self.conv:
            return F.conv2d(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


_PARTS = ("q", "k", "v", "mlp")  # SplitQKV's parts, in the order their rows are concatenated


def _rows(layout: Layout, module, n_rows: int, heads: int, name: str) -> dict[str, torch.Tensor]:
    """{role: the fused projection's rows of that role, head after head} by the layout (and "mlp": the rows before
    them that feed a parallel block's MLP)."""
    roles = layout.roles
    lead = int(layout.mlp_rows(module)) if layout.mlp_rows is not None else 0
    if not 0 <= lead < n_rows:
        raise TypeError(f"{name}: its {layout.proj} has {n_rows} output rows; the layout puts {lead} before Q/K/V")
    n_rows -= lead
    widths = tuple(layout.widths(module)) if layout.widths is not None else None
    if widths is None:
        if n_rows % (len(roles) * heads):
            raise TypeError(f"{name}: its {layout.proj} has {n_rows} output rows, not {len(roles)} parts "
                            f"({'/'.join(roles)}) of {heads} heads each; the layout does not fit this module")
        widths = (n_rows // (len(roles) * heads),) * len(roles)
    if heads * sum(widths) != n_rows:
        raise TypeError(f"{name}: its {layout.proj} has {n_rows} output rows; the layout expects {heads} heads x "
                        f"{'+'.join(map(str, widths))} ({'/'.join(roles)}) = {heads * sum(widths)}")
    rows, offset = ({"mlp": torch.arange(lead)} if lead else {}), 0
    for role, w in zip(roles, widths):
        if layout.arrange == "blocks":   # (..., parts, heads, width)
            rows[role] = lead + torch.arange(offset * heads, (offset + w) * heads)
        else:                            # (..., heads, parts x width)
            per_head = torch.arange(heads)[:, None] * sum(widths) + offset + torch.arange(w)[None]
            rows[role] = lead + per_head.reshape(-1)
        offset += w
    return rows


class SplitMultiheadAttention(nn.Module):
    """`nn.MultiheadAttention` with separate q, k, v Linears (same forward signature).

    Keys and values may have their own widths (kdim, vdim). `in_proj_bias` is None and
    `_qkv_same_embed_dim` False, so nn.TransformerEncoderLayer takes its regular (non fast-path)
    route, which calls this module's forward; `split_qkv` also turns off an enclosing
    nn.TransformerEncoder's nested-tensor path, which would bypass it.
    """

    in_proj_weight = None
    in_proj_bias = None
    _qkv_same_embed_dim = False

    def __init__(self, mha: nn.MultiheadAttention):
        super().__init__()
        self.embed_dim, self.num_heads = mha.embed_dim, mha.num_heads
        self.kdim, self.vdim = mha.kdim, mha.vdim
        self.head_dim = mha.head_dim
        self.dropout, self.batch_first = mha.dropout, mha.batch_first
        self.add_zero_attn = mha.add_zero_attn
        self.bias_k, self.bias_v = mha.bias_k, mha.bias_v
        E = self.embed_dim
        if mha._qkv_same_embed_dim:
            weights = mha.in_proj_weight.detach().split(E)
        else:
            weights = (mha.q_proj_weight.detach(), mha.k_proj_weight.detach(), mha.v_proj_weight.detach())
        biases = mha.in_proj_bias.detach().split(E) if mha.in_proj_bias is not None else (None,) * 3
        kw = dict(device=weights[0].device, dtype=weights[0].dtype)
        for role, w, b in zip("qkv", weights, biases):
            lin = nn.Linear(w.shape[1], E, bias=b is not None, **kw)
            with torch.no_grad():
                lin.weight.copy_(w)
                if b is not None:
                    lin.bias.copy_(b)
            setattr(self, role, lin)
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
                                    add_zero_attn=self.add_zero_attn, kdim=self.kdim, vdim=self.vdim,
                                    batch_first=self.batch_first, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            if mha._qkv_same_embed_dim:
                mha.in_proj_weight.copy_(torch.cat([self.q.weight, self.k.weight, self.v.weight]))
            else:
                mha.q_proj_weight.copy_(self.q.weight)
                mha.k_proj_weight.copy_(self.k.weight)
                mha.v_proj_weight.copy_(self.v.weight)
            if mha.in_proj_bias is not None:
                mha.in_proj_bias.copy_(torch.cat([self.q.bias, self.k.bias, self.v.bias]))
            if self.bias_k is not None:
                mha.bias_k.copy_(self.bias_k)
                mha.bias_v.copy_(self.bias_v)
        mha.out_proj = self.out_proj
        return mha


# --- which modules are attention, and what the table says of them -----------------------

_SPLIT = (SplitQKV, SplitMultiheadAttention)


def _is_attention(module: nn.Module) -> bool:
    """A module of a class the table describes (whatever its projections are called), or with a child projection
    named like Q, K, V or a fused QKV (then it needs a table entry)."""
    if isinstance(module, _SPLIT):
        return False
    if isinstance(module, nn.MultiheadAttention) or class_path(type(module)) in LAYOUTS:
        return True
    return any(n in PROJECTION_NAMES for n, _ in module.named_children())


def _unknown(name: str, module: nn.Module) -> TypeError:
    kids = sorted(n for n, _ in module.named_children() if n in PROJECTION_NAMES)
    return TypeError(
        f"{class_path(type(module))} (at {name or 'the model'}) has projections {kids}, but the QK/V splitter has no "
        f"layout for this attention class, and splitting by a guess can put the wrong rows in Q, K or V. Read its "
        f"forward and describe it: fedfrozen.layouts.register({type(module).__name__}, fedfrozen.layouts.Layout("
        f"proj=..., roles=..., arrange=...)) (docs/attention_layouts.md); or Refused('why') to refuse it")


# classes that are attention by what they are called, whatever their projections are named: attention, attn, and
# the parallel blocks that fuse Q, K, V with the MLP's input (timm's ParallelScalingBlock, ParallelThingsBlock)
_ATTENTION_CLASS = re.compile(r"attention|attn|parallel\w*block", re.IGNORECASE)


def _no_projections(model: nn.Module) -> TypeError:
    """Why nothing was split: attention classes whose Q/K/V are not in a child projection the table knows (named,
    with what to do), or no attention at all."""
    like = {}
    for name, m in model.named_modules():
        has_weights = any(True for _ in m.parameters())
        if _ATTENTION_CLASS.search(type(m).__name__) and not isinstance(m, _SPLIT) and has_weights:
            like.setdefault(class_path(type(m)), name or "the model")
    if like:
        where = ", ".join(f"{cls} (at {at})" for cls, at in sorted(like.items()))
        return TypeError(
            f"{type(model).__name__} has attention the QK/V splitter cannot split: {where}. Their Q, K and V are not "
            f"in a child projection it knows ({', '.join(sorted(PROJECTION_NAMES))}; e.g. fused with other rows, "
            f"computed per group, or not a dot-product of queries and keys), and no layout describes these classes. "
            f"If one computes softmax(Q K^T) V from projections, describe it: fedfrozen.layouts.register(<class>, "
            f"fedfrozen.layouts.Layout(proj=..., roles=..., arrange=...)), or Refused('why') "
            f"(docs/attention_layouts.md)")
    return TypeError(f"{type(model).__name__} has no attention to split: no fused `qkv` Linear, "
                     f"no nn.MultiheadAttention, no separate q/k/v projections and no class named as attention")


def attention_modules(model: nn.Module):
    """(name, module, entry) of every attention module in `model`; entry is a Layout, "mha" for an
    nn.MultiheadAttention, or "split" for one split_qkv made. Raises TypeError, naming the class and what to do,
    for a class the table does not know or refuses."""
    found = []
    for name, m in model.named_modules():
        if isinstance(m, SplitMultiheadAttention):
            found.append((name, m, "split"))
        elif isinstance(m, nn.MultiheadAttention):
            found.append((name, m, "mha"))
        elif _is_attention(m):
            entry = lookup(m)
            if entry is None:
                raise _unknown(name, m)
            if isinstance(entry, Refused):
                raise TypeError(f"{class_path(type(m))} (at {name or 'the model'}) is refused by the QK/V splitter: "
                                f"{entry.reason}. Its family is listed as unsupported in docs/attention_layouts.md")
            found.append((name, m, entry))
    return found


# --- split / merge ----------------------------------------------------------------------

def split_qkv(model: nn.Module) -> nn.Module:
    """Replace every fused QKV projection by separate q/k/v Linears, in place, by each attention class's layout
    (fedfrozen.nets.layouts). Outputs are unchanged.

    Modules with separate projections already are left as they are; splitting twice is a no-op. Raises
    TypeError, before changing anything, for an attention class the table does not know or refuses, or if the
    model has no attention at all.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"split_qkv expects a torch.nn.Module; got {type(model).__name__}")
    found = attention_modules(model)  # every refusal before anything is replaced
    if not found and not any(isinstance(m, _SPLIT) for m in model.modules()):
        raise _no_projections(model)
    plans = []
    for name, m, entry in found:
        if entry == "mha":
            plans.append((name, None, SplitMultiheadAttention(m)))
        elif isinstance(entry, Layout) and entry.proj is not None:
            fused = getattr(m, entry.proj, None)
            if isinstance(fused, (nn.Linear, nn.Conv2d)):
                plans.append((name, entry.proj, SplitQKV.from_fused(fused, entry, m)))
            elif fused is not None and not isinstance(fused, SplitQKV):
                raise TypeError(f"{class_path(type(m))} (at {name}): its {entry.proj} is a {type(fused).__name__}, "
                                f"not a Linear or a 1x1 Conv2d: it cannot be split")
    modules = dict(model.named_modules())
    for name, attr, new in plans:
        if attr is None:  # an nn.MultiheadAttention: replace the module in its parent
            parent, _, child = name.rpartition(".")
            setattr(modules[parent], child, new)  # modules[""] is the model
        else:
            setattr(modules[name], attr, new)
    for m in model.modules():  # the nested-tensor fast path would skip the split layers' forward
        if isinstance(m, nn.TransformerEncoder) and any(isinstance(x, SplitMultiheadAttention) for x in m.modules()):
            if not hasattr(m, _NESTED):  # splitting twice keeps the stock value
                setattr(m, _NESTED, m.use_nested_tensor)
            m.use_nested_tensor = False
    return model


_NESTED = "_fedfrozen_use_nested_tensor"  # an encoder's own use_nested_tensor, kept by split_qkv for merge_qkv


def merge_qkv(model: nn.Module) -> nn.Module:
    """Inverse of split_qkv, in place: the state_dict loads strictly into the stock model, and an enclosing
    nn.TransformerEncoder gets back its own nested-tensor fast path (which split_qkv turned off)."""
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, SplitQKV):
                setattr(parent, child_name, child.to_fused())
            elif isinstance(child, SplitMultiheadAttention):
                setattr(parent, child_name, child.to_stock())
    for m in model.modules():
        if isinstance(m, nn.TransformerEncoder) and hasattr(m, _NESTED):
            m.use_nested_tensor = getattr(m, _NESTED)
            delattr(m, _NESTED)
    return model


# --- parameter groups -------------------------------------------------------------------

# Outside the attention modules the table describes, by name: layer scales, patch/position embeddings,
# heads, MLPs, norms. Inside them the table decides (qk: whatever shapes the attention weights).
_LAYER_SCALES = {"ls", "ls1", "ls2", "ls3", "gamma", "gamma_1", "gamma_2", "gamma_3", "gamma1", "gamma2", "gamma3",
                 "gamma_xca", "layer_scale", "layer_scale1", "layer_scale2", "layer_scale_1", "layer_scale_2",
                 "res_scale1", "res_scale2", "layerscale"}
_ATTN_OUT_PARTS = {"proj", "out_proj", "o_proj", "output"}
_EMBED_PARTS = {"patch_embed", "pos_embed", "cls_token", "reg_token", "dist_token", "absolute_pos_embed",
                "embed", "embedding", "embeddings", "downsample", "reduction", "pos_drop", "token_embed", "stem",
                "pool", "pos_embed_fourier"}
_EMBED_PREFIXES = ("patch_embed", "pos_embed", "cls_token", "dist_token")  # numbered copies: CoaT, CrossViT
_HEAD_PARTS = {"head", "head_dist", "classifier", "fc_out", "decoder"}
_MLP_PARTS = {"mlp", "ffn", "linear1", "linear2", "feed_forward", "fc1", "fc2"}


def _group_of(name: str) -> str:
    """The group of a parameter outside the attention modules (and of an attention module's leftovers)."""
    parts = name.split(".")
    if parts[0] in _HEAD_PARTS:
        return "head"
    if any(m in _LAYER_SCALES for m in parts):
        return "norm"
    if any(m in _EMBED_PARTS for m in parts) or parts[0].startswith(_EMBED_PREFIXES):
        return "embed"
    if any(m in _MLP_PARTS for m in parts[:-1]):
        return "mlp"
    if any("norm" in m or m == "ln" for m in parts):
        return "norm"
    if parts[0] == "fc" and len(parts) == 2:  # a top-level classifier named fc
        return "head"
    return "other"


def _attention_group(rel: str, m: nn.Module, entry) -> str | None:
    """The group of parameter `rel` (relative to attention module `m`), or None: decided by name."""
    first = rel.split(".")[0]
    if entry == "split":  # a SplitMultiheadAttention
        return {"q": "qk", "k": "qk", "bias_k": "qk", "v": "v", "bias_v": "v", "out_proj": "attn_out"}.get(first)
    parts = rel.split(".")
    if entry.proj is not None and first == entry.proj and len(parts) > 2 and parts[1] in _PARTS:
        return {"q": "qk", "k": "qk", "v": "v", "mlp": "mlp"}[parts[1]]
    if first in entry.mlp:
        return "mlp"
    if first in entry.other:
        return "other"
    for role, child in entry.separate.items():
        if first == child:
            return "v" if role == "v" else "qk"
    if first in entry.qk or first in ("q_norm", "k_norm"):
        return "qk"
    if first in entry.v or first == "v_norm":
        return "v"
    if first in entry.out or first in _ATTN_OUT_PARTS:
        return "attn_out"
    if "norm" in first:
        return "norm"
    return None


def param_groups(model: nn.Module) -> dict[str, list[str]]:
    """Every parameter name in exactly one of GROUPS.

    Inside each attention module, by its layout (fedfrozen.nets.layouts): qk holds W_Q, W_K, their biases
    and norms and whatever else shapes the attention weights (position biases on the logits,
    temperatures, talking-heads mixing, gated positional attention, latent queries, bias_k); v holds
    W_V, its bias and norm (bias_v); attn_out the output projection and output gates. Elsewhere by
    name: mlp; norm (incl. layer scales); embed (patch/position embeddings, class/register tokens,
    stems, patch merging and pooling); head; other: what no rule recognises (listed by
    `group_sizes`). Raises for a model whose attention is not split yet or not in the table.
    """
    attn = attention_modules(model)
    unsplit = [n for n, m, e in attn if e == "mha" or isinstance(e, Layout) and e.proj is not None
               and isinstance(getattr(m, e.proj, None), (nn.Linear, nn.Conv2d))]
    if unsplit:
        raise ValueError(f"fused QKV projections in {unsplit[:3]}: call fedfrozen.nets.qkv.split_qkv(model) first")
    owner = {name: (m, entry) for name, m, entry in attn}
    groups = {g: [] for g in GROUPS}
    for pname, _ in model.named_parameters():
        group = None
        # the innermost attention module holding the parameter decides, if its layout says
        prefix = pname
        while "." in prefix:
            prefix = prefix.rsplit(".", 1)[0]
            if prefix in owner:
                group = _attention_group(pname[len(prefix) + 1:], *owner[prefix])
                break
        groups[group or _group_of(pname)].append(pname)
    return groups


def param_names(model: nn.Module, groups) -> set[str]:
    """The names of the parameters of `groups` (param_groups' names of each group, together)."""
    by_group = param_groups(model)
    return {n for g in groups for n in by_group[g]}


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
    """Per split layer, the per-head kernels K_h = W_Q,h^T W_K,h as a (heads, dim, dim) tensor.

    Logits of head h are x W_Q,h^T W_K,h x'^T, so K_h fixes the head's attention kernel
    (the paper's K = W_Q W_K^T in column-vector convention). Biases, q/k norms and position biases
    are not included; this is the quantity whose change the loop reports. Layers whose logits are
    not q . k over tokens (channel attention) or whose projection holds no Q (K/V-only) are skipped.
    """
    kernels = []
    for m in model.modules():
        if isinstance(m, SplitQKV) and not m.token_kernel:
            continue
        if isinstance(m, (SplitQKV, SplitMultiheadAttention)):
            heads = m.num_heads or 1
            wq, wk = m.q.weight.detach(), m.k.weight.detach()
            if wq.shape[1] != wk.shape[1]:
                continue  # queries and keys read different inputs (kdim != embed_dim)
            wq = wq.reshape(heads, wq.shape[0] // heads, -1)
            wk = wk.reshape(heads, wk.shape[0] // heads, -1)
            kernels.append(wq.transpose(1, 2) @ wk)
    return kernels
