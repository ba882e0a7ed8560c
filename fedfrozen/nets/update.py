"""The local update rule: one composed rule, and the only place on the clients' side where "frozen" and a client's
mask are applied (on the server's side the round applies the stage's freeze after the server step:
fedfrozen.engine.server.Round.close; no method multiplies by the stage mask).

A client's step runs these transforms, in this order (optax's `chain`, over the flat buffer of fedfrozen.nets.flat):

    1. mask      g <- g * mask: the client's own 0/1 mask (FedTLU, head pruning, the progressive schedule)
    2. clip      g <- g * min(1, clip / (||g|| + 1e-6)): the global norm over the whole buffer
    3. coupled   g <- g + coupled_decay * x on the client's entries (FedLADA: Adam's coupled L2)
    4. core      AdamW (decoupled weight decay) or SGD with momentum (L2 weight decay) at rate lr * lr_scale; or a
                 method's `direction` in place of AdamW's update, over the same Adam moments (FedACT)
    5. after     after_step(): a term on the weights after the step (FedAdamW's pull along the last mean update)

and it moves only the stage's trainable entries: `FlatOptimizer` is built on the stage's trainable mask (what the
method's frozen_groups leave), holds state and steps for those entries only, and turns off requires_grad outside
them, so the backward pass skips the frozen weights (their loss gradient is exactly zero). Nothing else decides
what moves: the batched engine stacks the optimiser's slices (fedfrozen.engine.batched.EntryMap).

`UpdateRule` is the rule (a frozen dataclass: `UpdateRule.from_config(cfg)` is the run's, a method transforms it
for a client with `dataclasses.replace`, e.g. FedAdamW's lr_scale, weight decay and pull); `FlatOptimizer` is its
state over the buffer (moments, step count, the client's mask). There is one Adam core (`adam_moments`,
`adam_denominator`): AdamW, FedLADA's coupled Adam and FedACT's trust-scaled direction all step with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .flat import FlatParams

__all__ = ["UpdateRule", "FlatOptimizer", "mask_slices", "train_only", "apply_mask", "clip_by_norm", "adamw_step",
           "sgd_step", "adam_moments", "adam_denominator"]


def mask_slices(mask: torch.Tensor) -> list[slice]:
    """The entries a 0/1 mask over the flat buffer keeps (nonzero), as contiguous slices in order; for a mask of
    whole groups the same slices as `fedfrozen.nets.flat.merged_slices` of those groups."""
    keep = (mask != 0).to(torch.int8).cpu()
    edge = torch.zeros(1, dtype=torch.int8)
    ends = torch.diff(keep, prepend=edge, append=edge).nonzero().flatten().tolist()
    return [slice(a, b) for a, b in zip(ends[0::2], ends[1::2])]


def train_only(flat: FlatParams, model, mask: torch.Tensor) -> None:
    """requires_grad from the stage's trainable `mask`: a parameter trains where the mask keeps any of its entries,
    so the backward pass skips the frozen ones (their loss gradient stays exactly zero)."""
    for name, p in model.named_parameters():
        a, b = flat.param_range[name]
        p.requires_grad_(bool(mask[a:b].any()))


def apply_mask(g, mask):
    """Transform 1: zero the gradient outside the client's 0/1 `mask` (None: keep it all), in place."""
    if mask is not None:
        g.mul_(mask)
    return g


def clip_by_norm(g, clip, extra_sq=None):
    """Transform 2: scale `g` in place to norm at most `clip` (None or 0: unclipped). On one client's vector or on
    stacked rows (clients, entries), one norm per row; `extra_sq` adds a constant squared norm per row (the frozen
    entries' objective terms, which the batched engine keeps apart: the norm is the whole buffer's)."""
    if not clip:
        return g
    if extra_sq is None:
        norm = g.norm() if g.dim() == 1 else g.norm(dim=-1, keepdim=True)
    else:
        norm = (g.pow(2).sum(dim=-1, keepdim=True) + extra_sq).sqrt()
    return g.mul_((clip / (norm + 1e-6)).clamp(max=1.0))


@dataclass(frozen=True)
class UpdateRule:
    """The local update rule both engines step with (the transforms of the module's docstring) and its
    hyperparameters. The core: AdamW (torch.optim.AdamW's rule) or SGD with momentum (torch.optim.SGD's, no
    dampening or Nesterov). The learning rate is not part of it: the caller passes the step's lr (the round's, from
    the schedule) and the rule scales it by `lr_scale`."""

    kind: str = "adamw"
    weight_decay: float = 0.0
    momentum: float = 0.0
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    clip: float | None = None        # transform 2 (Config.grad_clip)
    lr_scale: float = 1.0            # a factor on the step's lr (FedAdamW: 1 - gamma)
    coupled_decay: float = 0.0       # transform 3 (FedLADA)
    direction: object = None         # direction(opt, lr) in place of AdamW's update, after the moments (FedACT)
    after_step: object = None        # after_step(), transform 5 (FedAdamW's pull)

    def __post_init__(self):
        if self.kind not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be 'adamw' or 'sgd'; got {self.kind!r}")
        if self.kind == "sgd" and (self.coupled_decay or self.direction is not None):
            raise ValueError("coupled_decay and direction transform the Adam core; the optimizer is 'sgd'")

    @classmethod
    def from_config(cls, cfg) -> "UpdateRule":
        """The run's rule: Config.optimizer, weight_decay, momentum and grad_clip (the one place they are read)."""
        return cls(cfg.optimizer, weight_decay=cfg.weight_decay, momentum=cfg.momentum, clip=cfg.grad_clip)

    @property
    def plain(self) -> bool:
        """Whether no method transformed the rule (what the batched engine steps: one rule for every client)."""
        return self.lr_scale == 1.0 and not self.coupled_decay and self.direction is None and self.after_step is None

    def gradient(self, g, mask=None, extra_sq=None):
        """Transforms 1 and 2 on the gradient `g` (in place): the client's mask, then the clip."""
        return clip_by_norm(apply_mask(g, mask), self.clip, extra_sq)

    def coupled(self, g, p, mask=None):
        """Transform 3: g + coupled_decay * p where `mask` (None: everywhere), a new tensor; `g` when it is 0."""
        if not self.coupled_decay:
            return g
        return g.add(p, alpha=self.coupled_decay) if mask is None else g.addcmul(p, mask, value=self.coupled_decay)

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
        """The core: one step at step count `t` and rate `lr`, in place on weights `p` with gradient `g` and state
        (m, v) of any shape: one client's slice, or the batched engine's stacked (clients, entries) rows."""
        if self.kind == "adamw":
            adamw_step(p, g, m, v, t, lr, self.weight_decay, self.betas, self.eps, decay)
        else:
            sgd_step(p, g, m, t, lr, self.weight_decay, self.momentum, decay)


class FlatOptimizer:
    """An `UpdateRule`'s state over the stage's trainable entries of the flat buffer, stepped with a handful of
    vector ops: `step(lr)`.

    `trainable`: the stage's 0/1 mask over the buffer (None: every entry); the optimiser keeps state for its
    entries only (`slices`) and, given the `model`, turns off requires_grad outside them. `base` is the run's rule,
    `rule` the client's (a method replaces it in init_client; `reset` restores the base), `mask` the client's own
    mask (None: every trainable entry; set by the round). Same update rules as torch.optim.AdamW / torch.optim.SGD,
    but the cost of a step does not grow with the number of parameter tensors.
    """

    def __init__(self, flat: FlatParams, rule: UpdateRule | None = None, trainable: torch.Tensor | None = None,
                 model=None):
        if rule is not None and not isinstance(rule, UpdateRule):
            raise TypeError(f"rule must be an UpdateRule (e.g. UpdateRule.from_config(cfg)); got {type(rule).__name__}")
        if trainable is not None and (not torch.is_tensor(trainable) or trainable.shape != flat.data.shape):
            raise ValueError(f"trainable must be a 0/1 mask over the flat buffer ({flat.numel} entries) or None; got "
                             f"{tuple(trainable.shape) if torch.is_tensor(trainable) else type(trainable).__name__}")
        self.flat, self.base = flat, rule or UpdateRule()
        self.rule = self.base
        self.slices = [slice(0, flat.numel)] if trainable is None else mask_slices(trainable)
        if model is not None:
            train_only(flat, model, torch.ones_like(flat.data) if trainable is None else trainable)
        n = sum(s.stop - s.start for s in self.slices)
        self.m = flat.data.new_zeros(n)
        self.v = flat.data.new_zeros(n) if self.base.kind == "adamw" else None
        self.t = 0
        self.mask: torch.Tensor | None = None
        self._decay = (None, None, None, None)  # (lr, rule, mask, factor) of the masked path, kept per client

    def _decay_factor(self, lr: float):
        cached_lr, cached_rule, cached_mask, factor = self._decay
        if cached_lr != lr or cached_rule is not self.rule or cached_mask is not self.mask:
            factor = self.rule.decay(self.mask, lr)
            self._decay = (lr, self.rule, self.mask, factor)
        return factor

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
        """A fresh state for the next client (a client's first step), without allocating: zero moments and step
        count, the run's rule, no client mask."""
        self.m.zero_()
        if self.v is not None:
            self.v.zero_()
        self.t = 0
        self.rule, self.mask = self.base, None

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
        """One step of the rule at rate `lr` (times its lr_scale) from the gradient in the flat buffer."""
        rule = self.rule
        self.t += 1
        lr = lr * rule.lr_scale
        rule.gradient(self.flat.grad, self.mask)
        coupled = self.mask if rule.coupled_decay else None  # (sliced per step only where transform 3 is on)
        if rule.direction is not None:
            for s, (p, g, m, v) in zip(self.slices, self.views()):
                adam_moments(m, v, rule.coupled(g, p, None if coupled is None else coupled[s]), rule.betas)
            rule.direction(self, lr)
        else:
            decay = self._decay_factor(lr)
            for s, (p, g, m, v) in zip(self.slices, self.views()):
                g = rule.coupled(g, p, None if coupled is None else coupled[s])
                rule.apply(p, g, m, v, self.t, lr, None if decay is None else decay[s])
        if rule.after_step is not None:
            rule.after_step()


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
    AdamW (adamw_step), FedLADA's coupled Adam and FedACT's trust-scaled direction (fedfrozen.methods.fedlada)."""
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
