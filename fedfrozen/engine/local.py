"""Local training of one client on the resident model: the sequential engine, and what both engines share.

Both engines (this one, and the batched one of fedfrozen.engine.batched) draw a client's batches and
augmentation with `draw_batches`, add the local objective's gradient terms with `grad_terms`, and step
with the local update rule of fedfrozen.nets.update (which alone applies the client's mask, the clip and
what the stage freezes), so they differ only in how many clients one forward and backward pass serves.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..inputs import augment
from ..nets.flat import FlatParams
from ..nets.update import FlatOptimizer, UpdateRule

__all__ = ["make_optimizer", "batches", "draw_batches", "autocast", "grad_terms", "train"]


def make_optimizer(cfg, flat: FlatParams, mask=None, model=None) -> FlatOptimizer:
    """The run's local update rule (`UpdateRule.from_config`) over the entries the stage's trainable `mask` keeps
    (None: every entry); given the `model`, its parameters outside the mask stop requiring grad."""
    return FlatOptimizer(flat, UpdateRule.from_config(cfg), trainable=mask, model=model)


def batches(n: int, cfg, gen: torch.Generator, epochs: int | None, steps: int | None) -> list[torch.Tensor]:
    """Index batches into a client's n samples: `epochs` passes, or exactly `steps` batches."""
    B = min(cfg.batch_size, n)
    if epochs is not None:
        perms = [torch.randperm(n, generator=gen) for _ in range(epochs)]
        return [p[i:i + B] for p in perms for i in range(0, n, B)]
    seq = torch.cat([torch.randperm(n, generator=gen) for _ in range(math.ceil(steps * B / n))])
    return [seq[i * B:(i + 1) * B] for i in range(steps)]


def draw_batches(setup, idx: torch.Tensor, gen: torch.Generator, epochs=None, steps=None):
    """A client's local work: (sample order on the device, batch sizes, augmentation parameters or None).

    The batch order is drawn from `gen` first, then (with augmentation on) every sample's crop and
    flip, so both engines see the same batches and the same augmented images.
    """
    cfg = setup.cfg
    bs = batches(len(idx), cfg, gen, epochs, steps)
    order = idx[torch.cat(bs).to(idx.device)]  # one host-to-device copy per client and round
    sizes = [len(b) for b in bs]
    aug = (augment.draw(len(order), gen, setup.device, flip=augment.AUGMENTED.get(cfg.dataset, True))
           if augment.enabled(cfg) else None)
    return order, sizes, aug


def autocast(amp: bool, device):
    """The one mixed-precision context of training and evaluation: bfloat16 autocast on `device` when `amp`
    (Config.amp), else autocast off."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bool(amp))


def grad_terms(g, x, *, anchor=None, anchor_coeff=0.0, correction=None, value_l2=0.0, value_mode="ridge",
               vs=None):
    """Add the local objective's terms to the gradient `g` of the loss at weights `x`, in place.

    anchor_coeff * (x - anchor) (FedProx mu / FedDyn alpha), a constant `correction` (SCAFFOLD
    c - c_i, FedDyn -h_i), the value penalty on the slice `vs` (ridge: lambda x, prox:
    lambda (x - anchor)), each added as one term so that it is exactly zero where it vanishes. Works
    on one client's vector or on stacked rows (clients, entries). The client's mask and the clip are
    the update rule's (fedfrozen.nets.update.UpdateRule.gradient), applied when it steps.
    """
    # every pull term is one rounding of coeff * (x - anchor): x - anchor is exactly 0 at the anchor, so the
    # term vanishes there bit for bit (adding coeff*x and then subtracting coeff*anchor leaves a residue of
    # ~1e-8 that AdamW normalises into steps of +-lr on coordinates whose true gradient is 0)
    pull = value_l2 and vs is not None and value_mode == "prox"
    diff = x - anchor if anchor_coeff or pull else None
    if anchor_coeff:
        g.add_(diff, alpha=anchor_coeff)
    if correction is not None:
        g.add_(correction)
    if value_l2 and vs is not None:
        g[..., vs].add_(diff[..., vs] if pull else x[..., vs], alpha=value_l2)
    return g


def train(setup, opt, lr: float, idx: torch.Tensor, gen: torch.Generator, *, epochs=None, steps=None, anchor=None,
          anchor_coeff=0.0, correction=None, value_l2=0.0, value_mode="ridge", forward=None):
    """Train the resident model on samples `idx` at local rate `lr`; returns (summed loss tensor, number of steps).

    Per step the flat gradient gets the local objective's terms (`grad_terms`; paper, Eq. of
    stage 2) and `opt` steps at `lr` by its rule (the client's mask, the clip, the core). With
    augmentation on (fedfrozen.inputs.augment) each batch is cropped and flipped on the device.
    `forward(batch indices, inputs)`, when a method gives one (AFedLF's cached prefix), replaces
    the model's forward pass.
    """
    cfg, flat, model = setup.cfg, setup.flat, setup.model
    model.train()
    loss_sum = torch.zeros((), device=setup.device)
    vs = flat.group_slice("v")
    order, sizes, aug = draw_batches(setup, idx, gen, epochs, steps)
    aug = aug.split(sizes) if aug is not None else [None] * len(sizes)
    for b, a in zip(torch.split(order, sizes), aug):
        flat.zero_grad()
        xb = setup.x[b] if a is None else augment.apply(setup.x[b], a)
        with autocast(cfg.amp, setup.device):
            loss = F.cross_entropy(model(xb) if forward is None else forward(b, xb), setup.y[b])
        loss.backward()
        grad_terms(flat.grad, flat.data, anchor=anchor, anchor_coeff=anchor_coeff, correction=correction,
                   value_l2=value_l2, value_mode=value_mode, vs=vs)
        opt.step(lr)
        loss_sum += loss.detach()
    return loss_sum, len(sizes)
