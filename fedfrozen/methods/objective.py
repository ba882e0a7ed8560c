"""Local objectives: what a client's step adds to its data gradient, and the client state it keeps.

The base class is plain local training (FedAvg: no terms, no state); every other objective
overrides only what it changes. Per step the loop adds `anchor_coeff() * (x - x^r)` and the
constant `correction(cid)` to the flat gradient; both are vector ops and only run when the
objective asks for them. Update rules: docs/methods.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .settings import Settings, component, setting

__all__ = ["LocalObjective", "Prox", "ProxSettings", "ClientVectors"]


@component
@dataclass(frozen=True)
class ProxSettings(Settings):
    """FedProx's proximal term (Config(prox_mu=...), --prox-mu)."""

    prefix: ClassVar[str] = "prox"
    mu: float = setting(0.01, "FedProx mu", lo=0)


class ClientVectors:
    """One flat vector per client, created at zero on first use (SCAFFOLD's c_i, FedDyn's h_i)."""

    def __init__(self, numel: int, device):
        self.numel, self.device = numel, device
        self.vec: dict[int, torch.Tensor] = {}

    def __getitem__(self, cid: int) -> torch.Tensor:
        if cid not in self.vec:
            self.vec[cid] = torch.zeros(self.numel, device=self.device)
        return self.vec[cid]

    def clear(self) -> None:
        self.vec.clear()

    def state_dict(self) -> dict:
        return {str(k): v for k, v in self.vec.items()}

    def load_state_dict(self, state: dict) -> None:
        self.vec = {int(k): v.to(self.device) for k, v in state.items()}

    def one(self, cid: int, key: str) -> dict:
        """{key: client cid's vector}, or {} when it has none yet (what a client keeps on a federation)."""
        return {key: self.vec[cid]} if cid in self.vec else {}

    def load_one(self, cid: int, state: dict, key: str) -> None:
        """Client cid's vector from one(...)'s dict (none: it starts at zero again)."""
        self.vec.pop(cid, None)
        if key in state:
            self.vec[cid] = state[key].to(self.device, torch.float32).clone()


class LocalObjective:
    """Plain local training: the data gradient alone, no client state (FedAvg)."""

    name = "plain"
    exchange_factor = 1  # payloads exchanged per client and round, each way, in units of the trainable weights
    # Like its Method, an objective runs as two halves (fedfrozen.methods.base): the server's (begin_round,
    # anchor_coeff, end_round, to_client, from_client) and the clients' (before_client, correction, after_client,
    # from_server, to_server; client_state on Flower); they share nothing but the records below.

    def __init__(self, cfg):
        self.cfg = cfg

    def setup(self, numel: int, device) -> None:
        """Allocate state for a flat parameter vector of `numel` entries."""
        self.numel, self.device = numel, device

    def anchor_coeff(self) -> float:
        """Coefficient of (x - x^r) in every local gradient step (0: none)."""
        return 0.0

    def correction(self, cid: int) -> torch.Tensor | None:
        """A constant vector added to every local gradient of client `cid` this round (None: none)."""
        return None

    def begin_round(self) -> None:
        """Server's half, before the round's first client."""

    def before_client(self, r: int, cid: int, setup, mask: torch.Tensor) -> None:
        """Before client `cid` trains; the resident model holds the round's global weights."""

    def after_client(self, cid: int, delta: torch.Tensor, steps: int, lr: float, mask: torch.Tensor) -> None:
        """After client `cid` trained `steps` steps at rate `lr`; delta = x_i - x^r."""

    def end_round(self, n_sampled: int, n_clients: int, mask: torch.Tensor) -> None:
        """After the server step."""

    def reset(self) -> None:
        """At a stage switch: drop all state (it must not cover newly frozen groups)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict returned."""

    # --- the records: server -> client -> server ------------------------------------------------
    def to_client(self, cid: int) -> dict:
        """Server's half: the tensors of server state client `cid`'s hooks read this round (none)."""
        return {}

    def from_server(self, cid: int, tensors: dict) -> None:
        """Clients' half: load what to_client sent."""

    def client_state(self, cid: int) -> dict:
        """Clients' half on Flower, after the round: what client `cid` keeps for its next round (none)."""
        return {}

    def load_client_state(self, cid: int, state: dict) -> None:
        """Clients' half on Flower, before the round: what client_state returned last time ({} the first time)."""

    def to_server(self, cid: int) -> dict:
        """Clients' half, after after_client: what the server's state needs from this client (none)."""
        return {}

    def from_client(self, cid: int, tensors: dict) -> None:
        """Server's half: fold what to_server sent into the server's state."""


class Prox(LocalObjective):
    """FedProx: local loss + (mu/2)||x - x^r||^2, i.e. mu (x - x^r) added to every gradient."""

    name = "prox"

    def anchor_coeff(self) -> float:
        return self.cfg.prox_mu
