"""Server optimisers: how the server turns the aggregated client update Delta into a step.

Each is a small function `step(buf, delta, mask, cfg, lr, n_sampled, n_clients) -> update`
(buf(name) returns a named state vector, zero at first use), in the spirit of Optax's
transforms; `ServerOptimizer` holds the state and applies `x += update`. What the stage freezes is not theirs: the
round puts the frozen entries back after every server step (fedfrozen.engine.server.Round.close). FedOpt (Reddi et
al., ICLR 2021, Algorithm 2): m and v start at 0, no bias
correction. See docs/methods.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .feddyn import feddyn_step
from .settings import Settings, component, setting

__all__ = ["ServerOptimizer", "ServerSettings", "SERVER_STEPS", "DEFAULT_SERVER_LR"]


@component
@dataclass(frozen=True)
class ServerSettings(Settings):
    """The server step's hyperparameters (Config(server_lr=...), --server-lr, ...)."""

    prefix: ClassVar[str] = "server"
    lr: float | None = setting(None, "eta_g (None: 1 for avg/momentum, 1e-2 adam/yogi, 1e-1 adagrad)", lo=0,
                               lo_open=True)
    momentum: float = setting(0.9, "FedAvgM beta", lo=0, hi=1)
    beta1: float = setting(0.9, "FedOpt beta1", lo=0, hi=1)
    beta2: float = setting(0.99, "FedOpt beta2", lo=0, hi=1)
    tau: float = setting(1e-3, "FedOpt adaptivity tau", lo=0, lo_open=True)


def avg_step(buf, delta, mask, cfg, lr, n_sampled, n_clients):
    """FedAvg: x += eta_g Delta."""
    return delta * lr


def momentum_step(buf, delta, mask, cfg, lr, n_sampled, n_clients):
    """FedAvgM: m = beta m + Delta; x += eta_g m."""
    m = buf("m")
    m.mul_(cfg.server_momentum).add_(delta)
    return m * lr


def _adaptive(kind):
    def step(buf, delta, mask, cfg, lr, n_sampled, n_clients):
        m, v = buf("m"), buf("v")
        m.mul_(cfg.server_beta1).add_(delta, alpha=1 - cfg.server_beta1)
        d2 = delta * delta
        if kind == "adam":
            v.mul_(cfg.server_beta2).add_(d2, alpha=1 - cfg.server_beta2)
        elif kind == "yogi":
            v.sub_((1 - cfg.server_beta2) * d2 * torch.sign(v - d2))
        else:  # adagrad
            v.add_(d2)
        return lr * m / (v.sqrt() + cfg.server_tau)

    step.__name__ = f"{kind}_step"
    step.__doc__ = f"Fed{kind.capitalize()}: x += eta_g m / (sqrt(v) + tau)."
    return step


SERVER_STEPS = {"avg": avg_step, "momentum": momentum_step, "adam": _adaptive("adam"),
                "yogi": _adaptive("yogi"), "adagrad": _adaptive("adagrad"), "feddyn": feddyn_step}
DEFAULT_SERVER_LR = {"avg": 1.0, "momentum": 1.0, "adam": 1e-2, "yogi": 1e-2, "adagrad": 1e-1, "feddyn": 1.0}


class ServerOptimizer:
    """A server step function with its state and learning rate (cfg.server_lr, else the kind's default)."""

    def __init__(self, kind: str, cfg):
        if kind not in SERVER_STEPS:
            raise ValueError(f"server_opt must be one of {', '.join(SERVER_STEPS)}; got {kind!r}")
        self.kind, self.cfg = kind, cfg
        self.fn = SERVER_STEPS[kind]
        self.lr = cfg.server_lr if cfg.server_lr is not None else DEFAULT_SERVER_LR[kind]
        self.state: dict[str, torch.Tensor] = {}

    def setup(self, numel: int, device) -> None:
        self.numel, self.device = numel, device

    def _buf(self, name: str) -> torch.Tensor:
        if name not in self.state:
            self.state[name] = torch.zeros(self.numel, device=self.device)
        return self.state[name]

    def step(self, x: torch.Tensor, delta: torch.Tensor, mask: torch.Tensor, n_sampled: int, n_clients: int) -> None:
        """x <- x + update(delta) (the round keeps the stage's frozen entries where they were)."""
        x.add_(self.fn(self._buf, delta, mask, self.cfg, self.lr, n_sampled, n_clients))

    def reset(self) -> None:
        self.state = {}

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = {k: v.to(self.device) for k, v in state.items()}
