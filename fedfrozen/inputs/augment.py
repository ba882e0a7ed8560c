"""Data augmentation for federated training from scratch on small images, applied per batch on the device.

A ViT trained from scratch on CIFAR overfits without augmentation; the usual recipe is a random
crop after 4-pixel padding and a random horizontal flip (no flip for digits-like data such as SVHN,
whose classes are not mirror-symmetric). Padding reflects the border, so an all-constant image
stays constant. The random offsets and flips of all of a client's batches are drawn at once from
the client's seeded generator (after its batch order), so runs stay reproducible and the draws
cost one host-to-device copy per client and round, not one per step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["AUGMENTED", "enabled", "draw", "apply"]

# dataset -> horizontal flip; datasets not listed are not augmented by default
AUGMENTED = {"cifar10": True, "cifar100": True, "svhn": False}
PAD = 4


def enabled(cfg) -> bool:
    """Whether `cfg` trains with augmentation: cfg.augment, or by default for the datasets in AUGMENTED."""
    return cfg.dataset in AUGMENTED if cfg.augment is None else bool(cfg.augment)


def draw(n: int, gen: torch.Generator, device, flip: bool, pad: int = PAD) -> torch.Tensor:
    """(n, 3) int64 on `device`: per-sample crop offsets (dy, dx) in [0, 2*pad] and a flip flag (0 or 1)."""
    params = torch.randint(0, 2 * pad + 1, (n, 3), generator=gen)
    if flip:
        params[:, 2] = torch.randint(0, 2, (n,), generator=gen)
    else:
        params[:, 2] = 0
    return params.to(device)


def apply(x: torch.Tensor, params: torch.Tensor, pad: int = PAD) -> torch.Tensor:
    """Random-crop (after reflect padding) and flip a batch x (B, C, H, W) by `params` (B, 3) from `draw`."""
    B, C, H, W = x.shape
    padded = F.pad(x, (pad, pad, pad, pad), mode="reflect")
    rows = params[:, 0:1] + torch.arange(H, device=x.device)            # (B, H)
    cols = params[:, 1:2] + torch.arange(W, device=x.device)            # (B, W)
    flip = params[:, 2:3].bool()
    cols = torch.where(flip, cols.flip(1), cols)                         # a flip reverses the columns
    b = torch.arange(B, device=x.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()
