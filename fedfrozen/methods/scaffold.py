"""SCAFFOLD (Karimireddy et al., ICML 2020): control variates against client drift.

Server variate c and client variates c_i start at zero; every local step adds c - c_i to the
gradient. After the round a client's new variate c_i+ is, by the paper's two options:
- option I ("gradient"): the client's full-batch gradient at the round's global weights x^r.
  It does not depend on how the client stepped, so it is valid for any local optimiser.
- option II ("update"): c_i - c + (x^r - x_i)/(K eta), which assumes K plain SGD steps of size
  eta. With AdamW the quotient is of order one per coordinate and swamps the gradient.
`scaffold_variant="auto"` takes option II for SGD and option I otherwise. The server sets
c += (|S|/N) mean_{i in S}(c_i+ - c_i). Variates live on the trainable entries only (the mask);
uploads and downloads are twice FedAvg's (weights and variates). Between the halves (in process as on Flower) c goes
down, c_i stays with the client and c_i+ - c_i comes up. See docs/methods.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from .objective import ClientVectors, LocalObjective
from .settings import Settings, component, setting

__all__ = ["Scaffold", "ScaffoldSettings", "full_gradient", "scaffold_variant", "SCAFFOLD_VARIANTS"]

SCAFFOLD_VARIANTS = ("auto", "gradient", "update")


@component
@dataclass(frozen=True)
class ScaffoldSettings(Settings):
    """Which of SCAFFOLD's control variates (Config(scaffold_variant=...), --scaffold-variant)."""

    prefix: ClassVar[str] = "scaffold"
    variant: str = setting("auto", "SCAFFOLD control variates: gradient (option I) | update (option II) | auto (II for "
                           "sgd, else I)", choices=SCAFFOLD_VARIANTS)


def scaffold_variant(cfg) -> str:
    """'gradient' (option I) or 'update' (option II) for this config."""
    if cfg.scaffold_variant != "auto":
        return cfg.scaffold_variant
    return "update" if cfg.optimizer == "sgd" else "gradient"


def full_gradient(setup, idx: torch.Tensor, out: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """The gradient of the mean loss over samples `idx` at the resident model's weights, into `out`.

    Evaluated in eval mode (no dropout draws, so the local training's random stream is untouched);
    parameters with requires_grad False get zeros.
    """
    model, flat = setup.model, setup.flat
    training = model.training
    model.eval()
    flat.zero_grad()
    for b in idx.split(chunk):
        loss = F.cross_entropy(model(setup.x[b]), setup.y[b], reduction="sum") / len(idx)
        loss.backward()
    out.copy_(flat.grad)
    flat.zero_grad()
    model.train(training)
    return out


class Scaffold(LocalObjective):
    name = "scaffold"
    exchange_factor = 2

    def __init__(self, cfg):
        super().__init__(cfg)
        self.variant = scaffold_variant(cfg)

    def setup(self, numel: int, device) -> None:
        super().setup(numel, device)
        self.c = torch.zeros(numel, device=device)
        self.client = ClientVectors(numel, device)
        self.dc_sum = torch.zeros(numel, device=device)  # server's half: sum of the round's c_i+ - c_i
        self.dc = None  # clients' half: the last client's c_i+ - c_i, sent up
        self.grads: dict[int, torch.Tensor] = {}  # option I: the full-batch gradient of each client about to train

    def correction(self, cid: int) -> torch.Tensor:
        return self.c - self.client[cid]

    def begin_round(self) -> None:
        self.dc_sum.zero_()

    def before_client(self, r: int, cid: int, setup, mask: torch.Tensor) -> None:
        if self.variant == "gradient":
            self.grads[cid] = full_gradient(setup, setup.client_train[cid], torch.empty_like(self.c))

    def after_client(self, cid: int, delta: torch.Tensor, steps: int, lr: float, mask: torch.Tensor) -> None:
        c_i = self.client[cid]
        if self.variant == "gradient":
            new = self.grads.pop(cid) * mask                         # option I
        else:
            new = (c_i - self.c - delta / (steps * lr)) * mask        # option II
        self.dc = new - c_i
        c_i.copy_(new)

    def end_round(self, n_sampled: int, n_clients: int, mask: torch.Tensor) -> None:
        self.c.add_(self.dc_sum, alpha=1.0 / n_clients)  # (|S|/N) * (sum / |S|): 0 where no client trained

    def reset(self) -> None:
        self.c.zero_()
        self.client.clear()

    # between the halves: c goes down, c_i stays with the client, c_i+ - c_i comes up (exchange_factor 2)
    def to_client(self, cid: int) -> dict:
        return {"c": self.c}

    def from_server(self, cid: int, tensors: dict) -> None:
        self.c.copy_(tensors["c"])

    def client_state(self, cid: int) -> dict:
        return self.client.one(cid, "c_i")

    def load_client_state(self, cid: int, state: dict) -> None:
        self.client.load_one(cid, state, "c_i")

    def to_server(self, cid: int) -> dict:
        return {"dc": self.dc}

    def from_client(self, cid: int, tensors: dict) -> None:
        self.dc_sum.add_(tensors["dc"])

    def state_dict(self) -> dict:
        return {"c": self.c, "client": self.client.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.c.copy_(state["c"])
        self.client.load_state_dict(state["client"])
