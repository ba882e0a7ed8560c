"""FedLADA and FedACT: two local optimisers of the federated-AdamW line (docs/methods.md).

Both reuse FedAdamW's machinery (fedfrozen.methods.fedadamw: the server's second moments and step
counter sent to the clients, the previous round's mean update Δ̄^{r-1} as a global direction, what is
exchanged counted in bytes) and change the local step:

- **FedLADA** (as re-implemented in the FedAdamW authors' code): Adam with *coupled* weight decay
  (g <- g + 1e-3 x) and learning rate η(1 - γ), then x <- x + (γ/K)·Δ̄^{r-1} after every step; the
  server averages the clients' *full per-coordinate* v (not one scalar per tensor) and sends it back,
  so v costs one float per trainable weight each way.
- **FedACT** [recon: the paper's text was not available]: direction d = m̂/(√v̂ + ε) + α Δ^G with the
  global direction Δ^G = -Δ̄^{r-1}/(K η) (pointing like a gradient); a coordinate-wise trust
  τ_j = clip(½(1 + sign(m̂_j) sign(Δ^G_j) min(1, |Δ^G_j| / (|m̂_j| + ε))), τ_min, 1), renormalised so
  that its mean over the trained weights is 1; step x <- x - η(τ ⊙ d + λ x) (λ the weight decay). Larger
  steps where the local and global directions agree, small non-zero ones elsewhere. Client moments as
  FedAdamW's (per-tensor v̄ and the counter from the server). With τ_min = 1 (trust ≡ 1) it is
  FedAdamW's corrected AdamW at learning rate η (a test).
Both are transforms of the one local update rule (fedfrozen.nets.update): FedLADA adds `coupled_decay` before the Adam
core (decoupled decay off), FedACT replaces AdamW's update by its `direction` over the core's moments. Sequential
engine only (they transform the local optimiser's rule and state).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..nets.update import adam_denominator
from .base import Method
from .fedadamw import FedAdamW, FedAdamWSettings
from .settings import setting

__all__ = ["FedLADA", "FedACT", "LADA_COUPLED_WD"]

LADA_COUPLED_WD = 1e-3  # FedLADA's coupled weight decay, as in the FedAdamW authors' re-implementation


class FedLADA(FedAdamW):
    """FedAdamW's pull, Adam with coupled weight decay, and the full per-coordinate v averaged on the server."""

    def setup(self, setup) -> None:
        super().setup(setup)
        flat = setup.flat
        # every coordinate is its own "tensor": v̄ is per coordinate
        self.tensor_of = torch.arange(flat.numel, device=flat.data.device)
        self.n_tensors = flat.numel
        self.tensor_size = torch.ones(flat.numel, dtype=flat.data.dtype, device=flat.data.device)
        self.v_bar = torch.zeros(flat.numel, device=flat.data.device)

    def init_client(self, r, cid, opt, mask) -> None:
        super().init_client(r, cid, opt, mask)
        # FedAdamW's rule with Adam's coupled weight decay in place of AdamW's decoupled one (torch.optim.Adam's)
        opt.rule = dataclasses.replace(opt.rule, weight_decay=0.0, coupled_decay=LADA_COUPLED_WD)

    def client_bytes(self, r: int, cid: int, payload: int, trainable: int) -> tuple[int, int]:
        down, up = Method.client_bytes(self, r, cid, payload, trainable)  # FedAvg's: the payload each way
        moments = payload if self.shared else 0  # the per-coordinate v of what the client trains, each way
        return down + (payload if self.gamma else 0) + moments, up + moments


@dataclass(frozen=True)
class FedACTSettings(FedAdamWSettings):
    prefix: ClassVar[str] = "fedact"
    alpha: float = setting(0.9, "[recon] weight alpha of the global direction in the local step", lo=0)
    tau_min: float = setting(0.1, "[recon] lower clip of the coordinate trust (1: trust == 1)", lo=0, hi=1,
                             lo_open=True)


class FedACT(FedAdamW):
    """FedAdamW's moments with FedACT's trust-scaled direction [recon]."""

    Settings = FedACTSettings

    def init_client(self, r, cid, opt, mask) -> None:
        super().init_client(r, cid, opt, mask)
        K, cfg, opts = self._steps(cid), self.cfg, self.settings
        # η itself (FedAdamW scales it by 1 - γ); the global direction is inside the trust-scaled direction
        opt.rule = dataclasses.replace(
            opt.rule, lr_scale=1.0, weight_decay=cfg.weight_decay, after_step=None,
            direction=lambda o, lr: _act_direction(o, lr, self.delta_bar, K, opts.alpha, opts.tau_min))


@torch.no_grad()
def _act_direction(opt, lr: float, delta_bar: torch.Tensor, K: int, alpha: float, tau_min: float) -> None:
    """FedACT's step over the Adam core's moments (the rule's core updated them already at step opt.t)."""
    betas, bc1 = opt.rule.betas, 1 - opt.rule.betas[0] ** opt.t
    parts = []
    for (p, _, m, v), s in zip(opt.views(), opt.slices):
        m_hat = m / bc1
        dG = delta_bar[s] * (-1.0 / (K * lr)) if lr > 0 else torch.zeros_like(m)
        d = m_hat / adam_denominator(v, opt.t, betas, opt.rule.eps) + alpha * dG
        ratio = dG.abs() / (m_hat.abs() + opt.rule.eps)
        agree = torch.sign(m_hat) * torch.sign(dG) * torch.minimum(torch.ones_like(dG), ratio)
        tau = (0.5 * (1 + agree)).clamp_(tau_min, 1.0)
        trained = None if opt.mask is None else opt.mask[s]
        parts.append((p, d, tau, trained))
    total = sum(float(t.sum() if w is None else (t * w).sum()) for _, _, t, w in parts)
    count = sum(t.numel() if w is None else float(w.sum()) for _, _, t, w in parts)
    scale = count / total if total > 0 else 1.0  # mean(τ) = 1 over the trained weights
    for p, d, tau, trained in parts:
        step = tau.mul_(scale).mul_(d).add_(p, alpha=opt.rule.weight_decay)
        if trained is not None:
            step.mul_(trained)
        p.sub_(step, alpha=lr)
