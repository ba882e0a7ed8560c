"""Model factory: the project's small ViTs, a linear-attention ViT, and any timm model.

`create("vit_digits", num_classes=10)` builds the embedded-dataset model; `vit_fmnist_w48` the cpu profile's
Fashion-MNIST model (0.886 centralised; `vit_fmnist`, the smaller one it replaced, 0.870); `vit_cifar` the
ViT-Tiny-like model common in FL papers; `linear_vit` the vit_digits shape with linear
attention (no softmax), the bridge to the paper's linear-attention theory; `char_transformer` a causal character
Transformer for next-character prediction (the Shakespeare federation: token windows in, the next character's
logits out), `char_transformer_tiny` its dry-run size. Any other name is passed to `timm.create_model` (pretrained
weights only when asked).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..base.io import dry_run_settings

__all__ = ["create", "LinearAttention", "CharTransformer", "PROJECT_MODELS", "TEXT_MODELS"]

# name -> VisionTransformer keyword arguments (sizes checked in tests/test_qkv.py)
PROJECT_MODELS = {
    "vit_digits": dict(img_size=8, patch_size=2, in_chans=1, embed_dim=48, depth=3, num_heads=4,
                       mlp_ratio=2.0, qkv_bias=True, global_pool="avg"),
    "vit_fmnist": dict(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=2, num_heads=2,
                       mlp_ratio=2.0, qkv_bias=True, global_pool="avg"),
    "vit_fmnist_w48": dict(img_size=28, patch_size=7, in_chans=1, embed_dim=48, depth=3, num_heads=4,
                           mlp_ratio=2.0, qkv_bias=True, global_pool="avg"),
    # 49 tokens (patch 4 on 28x28) where vit_fmnist_w48 sees 16: attention with something to do (notebook 13)
    "vit_fmnist_p4": dict(img_size=28, patch_size=4, in_chans=1, embed_dim=64, depth=3, num_heads=4,
                          mlp_ratio=2.0, qkv_bias=True, global_pool="avg"),
    "vit_cifar": dict(img_size=32, patch_size=4, in_chans=3, embed_dim=192, depth=7, num_heads=3,
                      mlp_ratio=2.0, qkv_bias=True),
    "linear_vit": dict(img_size=8, patch_size=2, in_chans=1, embed_dim=48, depth=3, num_heads=4,
                       mlp_ratio=2.0, qkv_bias=True, global_pool="avg"),
}


# name -> CharTransformer keyword arguments: next-character prediction over windows of `seq_len` characters
TEXT_MODELS = {
    "char_transformer": dict(embed_dim=64, depth=2, num_heads=4, seq_len=80, mlp_ratio=2.0),
    "char_transformer_tiny": dict(embed_dim=16, depth=1, num_heads=2, seq_len=80, mlp_ratio=2.0),
}


class CharTransformer(nn.Module):
    """A causal character Transformer: token embedding, learned positions, pre-norm `nn.TransformerEncoderLayer`s
    under a causal mask (a position sees itself and what came before), a final norm and an untied head that reads
    the last position: (N, L) token ids in, (N, vocab) logits of the character that follows the window out. Its
    `nn.MultiheadAttention`s are what fedfrozen.nets.qkv splits into q, k and v."""

    def __init__(self, vocab: int, embed_dim: int = 64, depth: int = 3, num_heads: int = 4, seq_len: int = 80,
                 mlp_ratio: float = 2.0):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be a multiple of num_heads ({num_heads})")
        self.seq_len = seq_len
        self.token_embed = nn.Embedding(vocab, embed_dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, seq_len, embed_dim))
        layer = nn.TransformerEncoderLayer(embed_dim, num_heads, int(mlp_ratio * embed_dim), dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, vocab)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.token_embed.weight, std=0.02)
        self.register_buffer("mask", torch.triu(torch.full((seq_len, seq_len), float("-inf")), diagonal=1),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, n = x.long(), x.shape[1]  # (token codes may be stored as uint8)
        if n > self.seq_len:
            raise ValueError(f"windows of {n} characters; the model holds positions for {self.seq_len}")
        h = self.token_embed(x) + self.pos_embed[:, :n]
        h = self.encoder(h, mask=self.mask[:n, :n], is_causal=True)
        return self.head(self.norm(h[:, -1]))


class LinearAttention(nn.Module):
    """Multi-head linear attention with timm's attribute names (`qkv`, `proj`, `num_heads`).

    out_h = phi(Q_h) (phi(K_h)^T V_h) / (phi(Q_h) phi(K_h)^T 1) with phi = elu + 1, or, with
    `feature_map="identity"`, out_h = Q_h K_h^T V_h / n (the model of the paper's analysis).
    No softmax: the attention kernel acts linearly, as in Section 4 of the paper.
    """

    def __init__(self, dim: int, num_heads: int = 4, qkv_bias: bool = True,
                 feature_map: str = "elu"):
        super().__init__()
        if feature_map not in ("elu", "identity"):
            raise ValueError(f"feature_map must be 'elu' or 'identity'; got {feature_map!r}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.feature_map = feature_map
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.feature_map == "elu":
            q, k = F.elu(q) + 1, F.elu(k) + 1
            kv = k.transpose(-2, -1) @ v                      # (B, h, d, d)
            norm = q @ k.sum(dim=-2, keepdim=True).transpose(-2, -1)  # (B, h, N, 1)
            out = (q @ kv) / norm.clamp_min(1e-6)
        else:
            out = (q @ (k.transpose(-2, -1) @ v)) / N
        return self.proj(out.transpose(1, 2).reshape(B, N, C))


def _project_vit(name: str, num_classes: int, **kw) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    feature_map = kw.pop("feature_map", "elu")
    args = {**PROJECT_MODELS[name], **kw}
    model = VisionTransformer(num_classes=num_classes, **args)
    if name == "linear_vit":
        for block in model.blocks:
            block.attn = LinearAttention(args["embed_dim"], args["num_heads"],
                                         qkv_bias=args.get("qkv_bias", True), feature_map=feature_map)
        model.apply(_init_linear_attention)
    return model


def _init_linear_attention(m: nn.Module) -> None:
    if isinstance(m, LinearAttention):
        nn.init.trunc_normal_(m.qkv.weight, std=0.02)
        nn.init.trunc_normal_(m.proj.weight, std=0.02)
        for lin in (m.qkv, m.proj):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)


def create(name: str, num_classes: int, pretrained: bool = False, **kw) -> nn.Module:
    """Build model `name` with `num_classes` outputs.

    Project names: `vit_digits`, `vit_cifar`, `linear_vit` (keyword arguments override the
    VisionTransformer settings, e.g. `in_chans=3, img_size=16`). Any other name is created by
    timm (`pretrained=True` downloads weights, which needs a network). Inside `fedfrozen dry-run
    --tiny` project models are built tiny (fedfrozen.base.io.dry_run_settings).
    """
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer; got {num_classes!r}")
    if name in TEXT_MODELS:
        if pretrained:
            raise ValueError(f"{name!r} is a project model with no pretrained weights; use pretrained=False")
        return CharTransformer(num_classes, **{**TEXT_MODELS[name], **kw})
    if name in PROJECT_MODELS:
        if pretrained:
            raise ValueError(f"{name!r} is a project model with no pretrained weights; "
                             f"use pretrained=False")
        dry = dry_run_settings()
        if dry and dry.get("model_kwargs"):
            kw = {**kw, **dry["model_kwargs"]}
        return _project_vit(name, num_classes, **kw)
    import timm

    if not timm.list_models(name) and name not in timm.list_models(pretrained=False):
        hint = timm.list_models(f"*{name.split('_')[0]}*")[:8]
        raise ValueError(f"unknown model {name!r}: not a project model ({', '.join(PROJECT_MODELS)}) "
                         f"nor a timm model name. Similar timm names: {hint}")
    return timm.create_model(name, pretrained=pretrained, num_classes=num_classes, **kw)
