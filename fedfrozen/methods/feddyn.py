"""FedDyn (Acar et al., ICLR 2021): dynamic regularisation; a local objective and a server step that go together.

Client i keeps h_i (the running sum of its past updates, times -alpha): its local gradient is
g - h_i + alpha (x - x^r), and after the round h_i -= alpha Delta_i. The server keeps
h -= alpha |S|/N Delta (Delta the weighted mean update) and sets x^{r+1} = x^r + Delta - h/alpha.
See docs/methods.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .objective import ClientVectors, LocalObjective
from .settings import Settings, component, setting

__all__ = ["FedDyn", "FedDynSettings", "feddyn_step"]


@component
@dataclass(frozen=True)
class FedDynSettings(Settings):
    """FedDyn's regulariser, local and on the server (Config(feddyn_alpha=...), --feddyn-alpha)."""

    prefix: ClassVar[str] = "feddyn"
    alpha: float = setting(0.01, "FedDyn alpha", lo=0, lo_open=True)


class FedDyn(LocalObjective):
    name = "feddyn"

    def setup(self, numel: int, device) -> None:
        super().setup(numel, device)
        self.client = ClientVectors(numel, device)

    def anchor_coeff(self) -> float:
        return self.cfg.feddyn_alpha

    def correction(self, cid: int) -> torch.Tensor:
        return -self.client[cid]

    def after_client(self, cid: int, delta: torch.Tensor, steps: int, lr: float, mask: torch.Tensor) -> None:
        self.client[cid].sub_(delta * mask, alpha=self.cfg.feddyn_alpha)

    def reset(self) -> None:
        self.client.clear()

    # on a federation h_i stays on the client (Flower's Context.state); nothing else crosses
    def client_state(self, cid: int) -> dict:
        return self.client.one(cid, "h_i")

    def load_client_state(self, cid: int, state: dict) -> None:
        self.client.load_one(cid, state, "h_i")

    def state_dict(self) -> dict:
        return {"client": self.client.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.client.load_state_dict(state["client"])


def feddyn_step(buf, delta, mask, cfg, lr, n_sampled, n_clients):
    """FedDyn's server update: h -= alpha |S|/N Delta; returns Delta - h/alpha."""
    h = buf("h")
    alpha = cfg.feddyn_alpha
    h.sub_(delta, alpha=alpha * n_sampled / n_clients)  # (0 on what the stage freezes: no client moved it)
    return delta - h / alpha
