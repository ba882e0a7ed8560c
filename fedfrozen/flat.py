"""One flat buffer for all parameters and one for their gradients.

Every parameter becomes a view into `FlatParams.data` (and its `.grad` a view into
`FlatParams.grad`), laid out group by group (qk, v, attn_out, ...), so each parameter group is
one contiguous slice. The federated round then loads global weights with one `copy_`, forms a
client update with one subtraction, adds per-step corrections (proximal, SCAFFOLD, value L2)
with one or two vector ops, and reports per-group norms by slicing. The local optimiser
(`FlatOptimizer`, an `UpdateRule`: AdamW or SGD) steps the buffer itself, slice by slice, and
the model sees the result through its parameters, which are views into the buffer.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from .qkv import GROUPS, param_groups

__all__ = ["FlatParams", "UpdateRule", "FlatOptimizer", "merged_slices", "mask_slices", "adamw_step", "sgd_step",
           "adam_moments", "adam_denominator"]


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

    def train_only(self, model: nn.Module, mask: torch.Tensor) -> None:
        """requires_grad from the stage's trainable `mask` (a 0/1 vector over the buffer): a parameter trains
        where the mask keeps any of its entries. The mask decides what moves; this, the optimiser's slices
        (`mask_slices`) and the batched engine's entries follow from it."""
        for name, p in model.named_parameters():
            a, b = self.param_range[name]
            p.requires_grad_(bool(mask[a:b].any()))


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


def mask_slices(mask: torch.Tensor) -> list[slice]:
    """The entries a 0/1 mask over the flat buffer keeps (nonzero), as contiguous slices in order; for a mask of
    whole groups the same slices as `merged_slices` of those groups."""
    keep = (mask != 0).to(torch.int8).cpu()
    edge = torch.zeros(1, dtype=torch.int8)
    ends = torch.diff(keep, prepend=edge, append=edge).nonzero().flatten().tolist()
    return [slice(a, b) for a, b in zip(ends[0::2], ends[1::2])]


@dataclass(frozen=True)
class UpdateRule:
    """The local update rule both engines step with: AdamW (torch.optim.AdamW's rule) or SGD with momentum
    (torch.optim.SGD's, no dampening or Nesterov), and its hyperparameters. The learning rate is not part of it:
    the caller passes the step's lr (the round's, from the schedule) to `apply`."""

    kind: str = "adamw"
    weight_decay: float = 0.0
    momentum: float = 0.0
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self):
        if self.kind not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be 'adamw' or 'sgd'; got {self.kind!r}")

    def decay(self, mask, lr: float):
        """Masked weight decay (`mask`: None or 0/1 weights of the trained entries, any shape): None when it is
        plain, else AdamW's per-entry factor 1 - lr*wd where the mask is 1 and 1 elsewhere (the same float32 factor
        as the unmasked step: bit-equal there), or SGD's mask on its L2 term."""
        if mask is None or not self.weight_decay:
            return None
        if self.kind == "sgd":
            return mask
        return torch.where(mask > 0, torch.tensor(1 - lr * self.weight_decay, dtype=mask.dtype), 1.0)

    def apply(self, p, g, m, v, t: int, lr: float, decay=None) -> None:
        """One step at step count `t` and rate `lr`, in place on weights `p` with gradient `g` and state (m, v) of
        any shape: one client's slice, or the batched engine's stacked (clients, entries) rows."""
        if self.kind == "adamw":
            adamw_step(p, g, m, v, t, lr, self.weight_decay, self.betas, self.eps, decay)
        else:
            sgd_step(p, g, m, t, lr, self.weight_decay, self.momentum, decay)


class FlatOptimizer:
    """An `UpdateRule` stepping slices of the flat buffer with a handful of vector ops: `step(lr)`.

    Same update rules as torch.optim.AdamW / torch.optim.SGD, but the cost of a step no longer grows with the
    number of parameter tensors: on vit_digits (76 tensors) a step takes a fraction of torch's foreach
    implementation. `reset()` gives a fresh state (a client's first step) without allocating. `mask` (None, or a
    0/1 vector over the whole flat buffer) restricts weight decay to the masked-in entries; the caller zeroes the
    gradient outside it, so masked-out entries do not move at all.
    """

    def __init__(self, flat: FlatParams, slices, kind: str = "adamw", weight_decay: float = 0.0,
                 momentum: float = 0.0, betas=(0.9, 0.999), eps: float = 1e-8):
        self.rule = UpdateRule(kind, weight_decay, momentum, tuple(betas), eps)
        self.flat, self.slices = flat, list(slices)
        n = sum(s.stop - s.start for s in self.slices)
        self.m = flat.data.new_zeros(n)
        self.v = flat.data.new_zeros(n) if kind == "adamw" else None
        self.t = 0
        self.mask: torch.Tensor | None = None
        self.lr_scale = 1.0  # a method's factor on the step's lr for the client about to train (FedAdamW: 1 - gamma)
        self.after_step = None  # a method's per-step term applied to the weights after each step (FedAdamW)
        self.step_rule = None  # a method's own update rule, rule(opt, lr) after the counter moved (FedLADA, FedACT)
        self._decay = (None, None, None, None)  # (lr, rule, mask, factor) of the masked path, kept per client

    def _decay_factor(self, lr: float):
        cached_lr, cached_rule, cached_mask, factor = self._decay
        if cached_lr != lr or cached_rule is not self.rule or cached_mask is not self.mask:
            factor = self.rule.decay(self.mask, lr)
            self._decay = (lr, self.rule, self.mask, factor)
        return factor

    # --- the entry points of methods that shape a client's local optimiser (FedAdamW, FedLADA, FedACT) ----------
    CLIENT_SETTINGS = ("lr_scale", "weight_decay", "step_rule", "after_step")

    def configure_client(self, **settings) -> None:
        """Set, for the client about to train, any of CLIENT_SETTINGS: `lr_scale` (a factor on each step's lr),
        its weight decay (a new rule), `step_rule` (rule(opt, lr) replacing the AdamW/SGD step, after the counter
        moved) and `after_step` (a term applied to the weights after each step); None clears a rule.
        `clear_client_rules` drops both rules afterwards."""
        bad = sorted(set(settings) - set(self.CLIENT_SETTINGS))
        if bad:
            raise ValueError(f"configure_client: unknown setting(s) {bad}; the optimiser takes {self.CLIENT_SETTINGS}")
        if "weight_decay" in settings:
            self.rule = dataclasses.replace(self.rule, weight_decay=settings.pop("weight_decay"))
        for k, v in settings.items():
            setattr(self, k, v)

    def clear_client_rules(self) -> None:
        """Drop a method's step_rule and after_step (the next client trains with the plain AdamW / SGD step)."""
        self.step_rule = self.after_step = None

    def start_from(self, second_moments: torch.Tensor, t: int) -> None:
        """Start the client's AdamW state from `second_moments` (a vector over the whole flat buffer; the
        optimiser keeps its slices) at step count `t` (FedAdamW's server-shared moments)."""
        if self.v is None:
            raise ValueError("start_from: the optimiser is SGD; it has no second moments")
        self.v.copy_(torch.cat([second_moments[s] for s in self.slices]))
        self.t = int(t)

    def second_moments(self) -> torch.Tensor:
        """The AdamW second moments as a vector over the whole flat buffer (0 outside the optimiser's slices)."""
        if self.v is None:
            raise ValueError("second_moments: the optimiser is SGD; it has no second moments")
        full = torch.zeros_like(self.flat.data)
        offset = 0
        for s in self.slices:
            n = s.stop - s.start
            full[s] = self.v[offset:offset + n]
            offset += n
        return full

    def reset(self) -> None:
        self.m.zero_()
        if self.v is not None:
            self.v.zero_()
        self.t = 0

    def views(self):
        """(weights, gradient, m, v) of each slice: views into the flat buffers and the optimiser state."""
        offset = 0
        for s in self.slices:
            n = s.stop - s.start
            yield (self.flat.data[s], self.flat.grad[s], self.m[offset:offset + n],
                   self.v[offset:offset + n] if self.v is not None else None)
            offset += n

    @torch.no_grad()
    def step(self, lr: float) -> None:
        """One step at rate `lr` (times the client's lr_scale)."""
        self.t += 1
        lr = lr * self.lr_scale
        if self.step_rule is not None:
            self.step_rule(self, lr)
        else:
            decay = self._decay_factor(lr)
            for s, (p, g, m, v) in zip(self.slices, self.views()):
                self.rule.apply(p, g, m, v, self.t, lr, None if decay is None else decay[s])
        if self.after_step is not None:
            self.after_step()


def adamw_step(p, g, m, v, t: int, lr: float, wd: float, betas, eps: float, decay=None) -> None:
    """One AdamW step in place (torch.optim.AdamW's rule) on tensors of any shape, e.g. one client's
    slice or the stacked (clients, entries) weights of the batched engine. `decay`: None, or a
    per-entry factor replacing 1 - lr*wd (FlatOptimizer's masked weight decay)."""
    if wd:
        p.mul_(1 - lr * wd if decay is None else decay)
    adam_moments(m, v, g, betas)
    p.addcdiv_(m, adam_denominator(v, t, betas, eps), value=-lr / (1 - betas[0] ** t))


def adam_moments(m, v, g, betas) -> None:
    """Adam's moment estimates, in place: m <- b1 m + (1 - b1) g, v <- b2 v + (1 - b2) g^2. The one Adam core:
    AdamW (adamw_step), FedLADA's coupled Adam and FedACT's trust-scaled step (fedfrozen.methods.fedlada) use it."""
    b1, b2 = betas
    m.lerp_(g, 1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)


def adam_denominator(v, t: int, betas, eps: float):
    """Adam's bias-corrected denominator at step t, a new tensor: sqrt(v) / sqrt(1 - b2^t) + eps."""
    return (v.sqrt() / math.sqrt(1 - betas[1] ** t)).add_(eps)


def sgd_step(p, g, m, t: int, lr: float, wd: float, momentum: float, mask=None) -> None:
    """One SGD step with momentum in place (torch.optim.SGD's rule, no dampening or Nesterov);
    `mask`: None, or a 0/1 tensor restricting the L2 weight decay term."""
    if wd:
        d = g.add(p, alpha=wd) if mask is None else g.addcmul(p, mask, value=wd)
    else:
        d = g
    if momentum:
        if t == 1:
            m.copy_(d)
        else:
            m.mul_(momentum).add_(d)
        d = m
    p.add_(d, alpha=-lr)
