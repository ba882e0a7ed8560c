"""One flat buffer for all parameters and one for their gradients.

Every parameter becomes a view into `FlatParams.data` (and its `.grad` a view into
`FlatParams.grad`), laid out group by group (qk, v, attn_out, ...), so each parameter group is
one contiguous slice. The federated round then loads global weights with one `copy_`, forms a
client update with one subtraction, adds per-step corrections (proximal, SCAFFOLD, value L2)
with one or two vector ops, and reports per-group norms by slicing. The local update rule
(fedfrozen.nets.update) steps the buffer itself, slice by slice, and the model sees the result
through its parameters, which are views into the buffer.
"""

from __future__ import annotations

import torch
from torch import nn

from .qkv import GROUPS, param_groups

__all__ = ["FlatParams", "merged_slices"]


class FlatParams:
    """Re-home a model's parameters into one contiguous buffer (in place)."""

    def __init__(self, model: nn.Module):
        named = dict(model.named_parameters())
        groups = param_groups(model)
        dtypes = {p.dtype for p in named.values()}
        if len(dtypes) != 1:
            raise TypeError(f"FlatParams needs one parameter dtype; the model has {sorted(map(str, dtypes))}")
        first = next(iter(named.values()))
        total = sum(p.numel() for p in named.values())
        self.data = torch.empty(total, dtype=first.dtype, device=first.device)
        self.grad = torch.zeros_like(self.data)
        self.group_range: dict[str, tuple[int, int]] = {}
        self.param_range: dict[str, tuple[int, int]] = {}
        offset = 0
        for g in GROUPS:
            start = offset
            for name in groups[g]:
                p = named[name]
                n = p.numel()
                view = self.data[offset:offset + n]
                view.copy_(p.detach().reshape(-1))
                p.data = view.view_as(p)
                p.grad = self.grad[offset:offset + n].view_as(p)
                self.param_range[name] = (offset, offset + n)
                offset += n
            self.group_range[g] = (start, offset)
        self.numel = total
        self.element_size = first.element_size()

    def group_slice(self, group: str) -> slice:
        a, b = self.group_range[group]
        return slice(a, b)

    def mask(self, groups) -> torch.Tensor:
        """Float mask (1 on the given groups' entries, 0 elsewhere)."""
        m = torch.zeros_like(self.data)
        for g in groups:
            m[self.group_slice(g)] = 1.0
        return m

    def group_numel(self, group: str) -> int:
        a, b = self.group_range[group]
        return b - a

    def group_bytes(self, groups) -> int:
        return sum((self.group_range[g][1] - self.group_range[g][0]) for g in groups) * self.element_size

    def group_sq_norms(self, vec: torch.Tensor) -> dict[str, torch.Tensor]:
        """Squared L2 norm of `vec` restricted to each group (0-dim tensors)."""
        return {g: vec[a:b].pow(2).sum() for g, (a, b) in self.group_range.items()}

    def zero_grad(self) -> None:
        self.grad.zero_()


def merged_slices(flat: FlatParams, groups) -> list[slice]:
    """The entries of `groups` as few contiguous slices (adjacent groups merged)."""
    ranges = sorted(flat.group_range[g] for g in groups if flat.group_range[g][0] < flat.group_range[g][1])
    out: list[list[int]] = []
    for a, b in ranges:
        if out and out[-1][1] == a:
            out[-1][1] = b
        else:
            out.append([a, b])
    return [slice(a, b) for a, b in out]
