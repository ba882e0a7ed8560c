"""Feature shift: clients in groups that see the same kind of image differently (Config.shift, Config.shift_groups).

Label skew (Dirichlet) moves a model's head first; when clients' inputs differ, the representation itself has to
serve them all, and the attention kernel is where it should drift most. With `shift` set, client i belongs to
group i mod k (k = `shift_groups`) and every image it holds, training and held-out, is shown transformed:

- `rotation`: group g's images turned by 360°·g/k (a quarter turn is exact; other angles are bilinear, the border
  filled with the image's background, its smallest value);
- `patch_permutation`: group g's images with their patches (on the model's patch grid) in group g's fixed order, a
  seeded permutation (aimed straight at the positional part of the kernel).

Group 0 sees the images as they are. The validation split is dealt to the groups in turn (its j-th image to group
j mod k) and the test set is evaluated once per group, under that group's transformation: each group's accuracy is a
History column (`test_acc_g0`, ...), `test_acc` their mean (so `late_acc` is the late mean over the groups) and
`test_acc_worst` the lowest. The transformation is applied once, when a run's Setup is built, on a copy of the
training tensors: both engines, every method and the Flower nodes see the same shifted data.
"""

from __future__ import annotations

import numpy as np
import torch

from ..base.rng import seed_for

__all__ = ["SHIFTS", "group_of", "transform", "patch_order", "patch_size_of", "apply"]

SHIFTS = ("none", "rotation", "patch_permutation")


def group_of(cid: int, groups: int) -> int:
    """The group of client `cid`: cid mod groups."""
    return cid % groups


def patch_order(g: int, n_patches: int, seed: int = 0) -> torch.Tensor:
    """Group g's fixed order of `n_patches` patches: the identity for group 0, else a seeded permutation (the same
    for every run of the same seed)."""
    if g == 0:
        return torch.arange(n_patches)
    rng = np.random.default_rng(seed_for("shift_patches", seed, g))
    return torch.as_tensor(rng.permutation(n_patches))


def _rotate(x: torch.Tensor, degrees: float) -> torch.Tensor:
    quarter = degrees / 90.0
    if quarter == int(quarter):
        return torch.rot90(x, int(quarter) % 4, dims=(2, 3))
    import torchvision.transforms.functional as TF

    fill = float(x.min())  # the background (the smallest value) fills what the turn uncovers
    return TF.rotate(x, degrees, interpolation=TF.InterpolationMode.BILINEAR, fill=fill)


def _permute_patches(x: torch.Tensor, order: torch.Tensor, patch: int) -> torch.Tensor:
    n, c, h, w = x.shape
    gh, gw = h // patch, w // patch
    tiles = x.reshape(n, c, gh, patch, gw, patch).permute(0, 2, 4, 1, 3, 5).reshape(n, gh * gw, c, patch, patch)
    tiles = tiles[:, order.to(x.device)]
    return tiles.reshape(n, gh, gw, c, patch, patch).permute(0, 3, 1, 4, 2, 5).reshape(n, c, h, w)


def transform(x: torch.Tensor, kind: str, g: int, groups: int, patch: int | None = None, seed: int = 0) -> torch.Tensor:
    """Images `x` (N, C, H, W) as group g of `groups` sees them under shift `kind` (a new tensor; x unchanged)."""
    if kind not in SHIFTS:
        raise ValueError(f"shift must be one of {', '.join(SHIFTS)}; got {kind!r}")
    if kind == "none" or g == 0:
        return x.clone()
    if kind == "rotation":
        return _rotate(x, 360.0 * g / groups)
    if patch is None or x.shape[2] % patch or x.shape[3] % patch:
        raise ValueError(f"shift 'patch_permutation' needs a patch size that divides the {tuple(x.shape[2:])} images; "
                         f"got {patch!r}")
    return _permute_patches(x, patch_order(g, (x.shape[2] // patch) * (x.shape[3] // patch), seed), patch)


def patch_size_of(model) -> int:
    """The model's patch size (a timm-style `patch_embed.patch_size`); a clear error for a model without one."""
    size = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if size is None:
        raise ValueError(f"shift 'patch_permutation' permutes the model's patches: {type(model).__name__} has no "
                         f"patch_embed.patch_size")
    size = tuple(size) if isinstance(size, (tuple, list)) else (int(size), int(size))
    if size[0] != size[1]:
        raise ValueError(f"shift 'patch_permutation' needs square patches; the model's are {size}")
    return int(size[0])


def apply(s) -> None:
    """Shift a Setup's data in place of its tensors (Config.shift, shift_groups): the training tensor copied, each
    client's images (training and held-out) transformed by its group, the validation images dealt to the groups in
    turn, and one test set per group (`s.test_groups`; empty without a shift)."""
    cfg = s.cfg
    s.test_groups = []
    if cfg.shift == "none":
        return
    k = cfg.shift_groups
    if s.x.dim() != 4:
        raise ValueError(f"shift {cfg.shift!r} transforms images (N, C, H, W); the training data has shape "
                         f"{tuple(s.x.shape)}")
    patch = patch_size_of(s.model) if cfg.shift == "patch_permutation" else None
    x = s.x.clone()  # the loaded dataset's tensor stays as it is (another run of this process reads it)
    owned = [[] for _ in range(k)]
    for cid, (tr, ev) in enumerate(zip(s.client_train, s.client_eval)):
        owned[group_of(cid, k)] += [tr, ev]
    for j in range(k):
        owned[j].append(s.val_idx[j::k])
    for g, parts in enumerate(owned):
        idx = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long, device=x.device)
        if g and len(idx):
            x[idx] = transform(x[idx], cfg.shift, g, k, patch, cfg.seed)
    s.x = x
    s.test_groups = [transform(s.test_x, cfg.shift, g, k, patch, cfg.seed) for g in range(k)]
