"""What each attention class does with its projections: the table the QK/V splitter reads.

A fused projection's output rows are Q, K and V only in the order the module's own forward reshapes
them; nothing in the weights says which. So `fedfrozen.nets.qkv` never guesses: every attention module it
meets must be in `LAYOUTS` (keyed by the class's module path and name), which gives
- the fused projection (`proj`: "qkv", "kv", ...) and how its rows are laid out (`arrange`):
  "blocks" - part after part, each (heads, width): `reshape(..., 3, heads, head_dim)`;
  "heads"  - head after head, each holding its parts: `view(..., heads, -1).split(widths)`;
- the parts' roles in output order (`roles`): ("q", "k", "v"); ("k", "v") for a K/V-only projection;
  ("v", "q", "k") where the tensor the code calls q carries the values (DaViT's channel attention);
- per-head widths where they differ (`widths`: keys narrower than values in TinyViT, EfficientFormer);
- projections kept apart (`separate`: role -> child name), and which other parameters shape the
  attention weights (`qk`: position biases on the logits, temperatures, latent queries), carry the
  values (`v`) or gate the output (`out`);
- for a parallel block (ViT-22B's, timm's ParallelScalingBlock: attention and MLP side by side on one
  input), the rows of the fused projection that are the MLP's input before Q, K and V (`mlp_rows`), the
  block's other MLP parameters (`mlp`), and what serves both (`other`: a fused output projection whose
  columns take the attention's output and the MLP's together).
A class that cannot be split without changing what it computes is `Refused` with the reason. A new
class is one entry: `register(cls, Layout(...))`. docs/attention_layouts.md lists the families.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Layout", "Refused", "LAYOUTS", "register", "lookup", "class_path", "PROJECTION_NAMES"]

# a module with a child of one of these names is an attention module the table must know
PROJECTION_NAMES = frozenset({"qkv", "qk", "kv", "q", "k", "v", "q_proj", "k_proj", "v_proj", "query", "key", "value",
                              "wq", "wk", "wv", "to_q", "to_k", "to_v", "to_qkv", "to_kv"})


@dataclass(frozen=True)
class Layout:
    proj: str | None = "qkv"
    roles: tuple = ("q", "k", "v")
    arrange: str = "blocks"
    widths: Callable | None = None     # module -> per-head widths of the parts, in `roles` order
    heads: str | Callable = "num_heads"  # attribute (or module -> int); a missing attribute means 1
    separate: dict = field(default_factory=dict)  # role -> child name of a projection kept apart
    qk: tuple = ()    # the module's own parameters/children (name prefixes) that shape the attention weights
    v: tuple = ()     # ... that carry the values
    out: tuple = ()   # ... that scale the attention output (gates)
    post_softmax: tuple = ()  # qk parts applied after the softmax (talking heads): weights need not sum to 1
    token_kernel: bool = True  # logits are q . k over tokens: attention_kernels reports W_Q,h^T W_K,h
    query_in_output: tuple = ()  # qk parts whose query is also added to the output (MViTv2's residual pooling)
    mlp_rows: Callable | None = None  # module -> rows of the fused projection before Q/K/V that feed an MLP
    mlp: tuple = ()    # ... that are an MLP's (a parallel block's MLP bias and output projection)
    other: tuple = ()  # ... that serve the attention and the MLP together (group "other": frozen only if named)
    residual: bool = False  # the module is a whole block: it adds its input to its output

    def num_heads(self, module) -> int:
        return int(self.heads(module) if callable(self.heads) else getattr(module, self.heads, 1) or 1)


@dataclass(frozen=True)
class Refused:
    reason: str


def class_path(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# position biases added to the logits shape the attention weights, as Q and K do
_LOGIT_BIASES = ("relative_position_bias_table", "rel_pos_h", "rel_pos_w", "attention_biases", "cpb_mlp",
                 "logit_scale", "meta_mlp", "temperature")
_STANDARD = Layout(qk=_LOGIT_BIASES)
_BIASED = Layout(qk=("q_bias", "k_bias") + _LOGIT_BIASES, v=("v_bias",))  # BEiT, EVA, Swin-V2: biases outside qkv


def _per_head(module):
    return (module.key_dim, module.key_dim, module.val_dim)


def _fused_or_separate(separate: dict, **kw):
    """A class that holds either a fused `qkv` or the projections `separate` names (by a constructor flag)."""
    fused, apart = Layout(**kw), Layout(proj=None, separate=separate, **kw)
    return lambda module: fused if getattr(module, "qkv", None) is not None else apart


_eva = _fused_or_separate(dict(q="q_proj", k="k_proj", v="v_proj"), qk=_BIASED.qk, v=_BIASED.v)
_timm_attention = _fused_or_separate(dict(q="q_proj", k="k_proj", v="v_proj"), qk=_LOGIT_BIASES, out=("gate",))
_pool2d = _fused_or_separate(dict(q="q", k="k", v="v"), qk=_LOGIT_BIASES)


def _maxxvit(module):  # head_first: view(B, heads, 3 * dim_head, ...).chunk(3); else reshape(B, 3, heads, ...)
    return Layout(arrange="heads" if module.head_first else "blocks", qk=_LOGIT_BIASES)


def _gcvit(module):  # the global-query blocks project only K and V; the query comes from the stage's global block
    if module.use_global:
        return Layout(roles=("k", "v"), qk=_LOGIT_BIASES)
    return Layout(qk=_LOGIT_BIASES)


def _mvitv2(module):  # residual pooling adds the pooled query to the output: Q is frozen with the kernel
    residual = ("qkv.q", "pool_q", "norm_q") if module.residual_pooling else ()
    return Layout(qk=_LOGIT_BIASES + ("pool_q", "pool_k", "norm_q", "norm_k"), v=("pool_v", "norm_v"),
                  query_in_output=residual)


def _parallel_block(**kw):
    """timm's parallel blocks (ViT-22B): in_proj rows [MLP input | Q | K | V] (split sizes `in_split`), the MLP's
    bias and output projection beside the attention's; with a fused output projection (DiffParallelScalingBlock,
    fuse_out_proj=True) its columns take the attention's output and the MLP's together, so it is "other"."""
    return Layout(proj="in_proj", mlp_rows=lambda m: m.in_split[0], mlp=("mlp_bias", "mlp_out_proj"),
                  out=("attn_out_proj",), other=("out_proj",), residual=True, **kw)


# Differential attention: softmax(Q1 K1^T) - lambda softmax(Q2 K2^T), two half-width query/key heads per value
# head; lambda (from these parameters) mixes the two maps after the softmax, so it shapes the attention weights
_DIFF_LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "lambda_a", "lambda_b")
_DIFF = dict(heads=lambda m: 2 * m.num_heads, qk=_DIFF_LAMBDAS, post_softmax=_DIFF_LAMBDAS)

_SEPARATE_QKV = Layout(proj=None, separate=dict(q="q", k="k", v="v"), qk=_LOGIT_BIASES)
_Q_PLUS_KV = Layout(proj="kv", roles=("k", "v"), separate=dict(q="q"), qk=_LOGIT_BIASES)

LAYOUTS: dict[str, Layout | Refused | Callable] = {
    # the project's own
    "fedfrozen.nets.models.LinearAttention": _STANDARD,
    # ViT, DeiT, CrossViT, MobileViT, NaFlexViT, CSATv2 (timm.layers.attention)
    "timm.layers.attention.Attention": _timm_attention,
    "timm.layers.attention.AttentionRope": _timm_attention,
    "timm.layers.diff_attention.DiffAttention": Layout(**_DIFF),
    "timm.models.vision_transformer.ParallelScalingBlock": _parallel_block(),
    "timm.models.vision_transformer.DiffParallelScalingBlock": _parallel_block(**_DIFF),
    "timm.models.beit.Attention": _BIASED,
    # LowFormer, CPUBone: a strided depthwise conv, then a 1x1 conv whose channels are (heads, [q | k | v])
    "timm.models.lowformer.ConvAttention": Layout(proj="pwise", arrange="heads", out=("o_proj", "upsampling")),
    "timm.models.cpubone.ConvAttention": Layout(proj="pwise", arrange="heads", out=("o_proj", "upsampling")),
    "timm.models.eva.EvaAttention": _eva,
    "timm.models.swin_transformer.WindowAttention": _STANDARD,
    "timm.models.swin_transformer_v2.WindowAttention": _BIASED,
    "timm.models.swin_transformer_v2_cr.WindowMultiHeadAttention": _STANDARD,
    "timm.models.vision_transformer_relpos.RelPosAttention": Layout(qk=_LOGIT_BIASES + ("rel_pos",)),
    "timm.models.vision_transformer_sam.Attention": _STANDARD,
    "timm.models.cait.TalkingHeadAttn": Layout(qk=("proj_l", "proj_w"), post_softmax=("proj_w",)),
    "timm.models.cait.ClassAttn": _SEPARATE_QKV,
    "timm.models.convit.GPSA": Layout(proj=None, separate=dict(v="v"), qk=("qk", "pos_proj", "gating_param")),
    "timm.models.convit.MHSA": _STANDARD,
    "timm.models.xcit.XCA": _STANDARD,
    "timm.models.edgenext.CrossCovarianceAttn": _STANDARD,
    "timm.models.mvitv2.MultiScaleAttention": _mvitv2,
    "timm.models.mvitv2.MultiScaleAttentionPoolFirst": Layout(
        proj=None, separate=dict(q="q", k="k", v="v"), qk=_LOGIT_BIASES + ("pool_q", "pool_k", "norm_q", "norm_k"),
        v=("pool_v", "norm_v")),
    "timm.models.maxxvit.Attention2d": _maxxvit,
    "timm.models.maxxvit.AttentionCl": _maxxvit,
    "timm.layers.attention2d.Attention2d": _maxxvit,
    "timm.models.tiny_vit.Attention": Layout(arrange="heads", widths=_per_head, qk=_LOGIT_BIASES),
    "timm.models.efficientformer.Attention": Layout(arrange="heads", widths=_per_head, qk=_LOGIT_BIASES),
    "timm.models.davit.WindowAttention": _STANDARD,
    "timm.models.davit.ChannelAttention": Layout(roles=("v", "q", "k"), token_kernel=False),  # softmax(k^T v) q
    "timm.models.davit.ChannelAttentionV2": Layout(heads="groups", token_kernel=False),   # softmax(q^T k) v
    "timm.models.gcvit.WindowAttentionGlobal": _gcvit,
    "timm.models.pvt_v2.Attention": _Q_PLUS_KV,
    "timm.models.twins.GlobalSubSampleAttn": _Q_PLUS_KV,
    "timm.models.twins.LocallyGroupedAttn": _STANDARD,
    "timm.models.nextvit.EfficientAttention": _SEPARATE_QKV,
    "timm.models.gemma4_vit.Gemma4Attention": Layout(proj=None, separate=dict(q="q_proj", k="k_proj", v="v_proj")),
    "timm.layers.attention2d.MultiQueryAttention2d": Layout(proj=None, separate=dict(q="query", k="key", v="value")),
    "timm.models.crossvit.CrossAttention": Layout(proj=None, separate=dict(q="wq", k="wk", v="wv")),
    "timm.models.volo.Attention": _STANDARD,
    "timm.models.volo.ClassAttention": _Q_PLUS_KV,
    "timm.models.volo.OutlookAttention": Layout(proj=None, separate=dict(v="v"), qk=("attn",), token_kernel=False),
    "timm.models.tnt.Attention": Layout(proj=None, separate=dict(v="v"), qk=("qk",)),
    "timm.models.nest.Attention": _STANDARD,
    "timm.models.hiera.MaskUnitAttention": Layout(heads="heads"),
    "timm.models.hieradet_sam2.MultiScaleAttention": _STANDARD,
    "timm.models.fastvit.Attention": _STANDARD,
    "timm.models.visformer.Attention": _STANDARD,
    "timm.models.metaformer.Attention": _STANDARD,
    "timm.layers.attention_pool.AttentionPoolLatent": Layout(proj="kv", roles=("k", "v"), separate=dict(q="q"),
                                                            qk=("latent", "q_norm", "k_norm")),
    "timm.layers.attention_pool2d.AttentionPool2d": _pool2d,
    "timm.layers.attention_pool2d.RotAttentionPool2d": _pool2d,
    # refused: splitting would not change the function, but "qk" would not be a kernel a freeze can mean
    "timm.models.coat.FactorAttnConvRelPosEnc": Refused(
        "factorised attention: q multiplies softmax(k)^T v linearly, so Q and K do not form an attention kernel"),
    "timm.models.mobilevit.LinearSelfAttention": Refused(
        "separable linear attention: a single query channel scores the tokens; there is no Q/K kernel"),
    "timm.models.efficientvit_mit.LiteMLA": Refused("ReLU linear attention with multi-scale aggregated q/k/v"),
    "timm.models.levit.Attention": Refused("q/k/v come from one projection followed by BatchNorm (LinearNorm)"),
    "timm.models.levit.AttentionDownsample": Refused("k/v come from one projection followed by BatchNorm"),
    "timm.models.efficientformer_v2.Attention2d": Refused("q/k/v are conv+BatchNorm stacks with talking heads and "
                                                          "a local value conv; not yet described"),
    "timm.models.efficientformer_v2.Attention2dDownsample": Refused("local-global pooled queries; not yet described"),
    "timm.layers.halo_attn.HaloAttn": Refused("blocked halo attention over a fused k/v conv with unfolded windows"),
    "timm.layers.bottleneck_attn.BottleneckAttn": Refused("fused conv projection with position logits from q; "
                                                          "not yet described"),
    "timm.models.csatv2.SpatialTransformerBlock": Refused(
        "a 3-channel qkv over token scalars (a gating map), not multi-head attention over features"),
    "timm.models.iformer.SHMA": Refused("single-head modulation attention with conv+BatchNorm projections; "
                                        "not yet described"),
    "timm.models.shvit.SHSA": Refused("single-head attention on a channel split, its qkv a conv+BatchNorm stack"),
    "timm.models.efficientvit_msra.CascadedGroupAttention": Refused(
        "cascaded group attention: each head's q/k/v come from its own conv+BatchNorm (qkvs), fed the previous "
        "head's output, its query through a depthwise conv; not yet described"),
    "timm.models.swiftformer.EfficientAdditiveAttention": Refused(
        "additive attention: a learnt vector pools the queries into one global query that multiplies the keys "
        "element-wise; there is no Q K^T kernel"),
    "timm.layers.lambda_layer.LambdaLayer": Refused("lambda layers: keys are normalised over positions and "
                                                    "no attention weights are formed"),
}


def register(cls, layout: Layout | Refused | Callable) -> None:
    """Describe one more attention class (a Layout, a Refused, or a function module -> either)."""
    if not (isinstance(layout, (Layout, Refused)) or callable(layout)):
        raise TypeError(f"layout must be a Layout, a Refused or a function of the module; got {type(layout).__name__}")
    LAYOUTS[class_path(cls)] = layout


def lookup(module) -> Layout | Refused | None:
    """The entry for `module`'s exact class (a subclass may compute something else: it needs its own), or None."""
    entry = LAYOUTS.get(class_path(type(module)))
    if entry is not None and not isinstance(entry, (Layout, Refused)):
        entry = entry(module)
    return entry
