"""Federated methods as three independent choices (../shared/METHODS.md).

A method = a **local objective** (what a client's gradient step adds to the data gradient),
a **server optimiser** (how the server turns the averaged client update into a step) and a
**freezing schedule** (which parameter groups stop training, from which round). One loop
(`fedfrozen.loop.run`) serves them all; everything here works on the flat parameter vector
(`fedfrozen.flat.FlatParams`) restricted to a mask of trainable entries.

Local objectives (per step, g is the flat gradient, x the client weights, x^r the round's
global weights):
- plain:    g
- prox:     g + mu (x - x^r)                                 FedProx
- scaffold: g + c - c_i                                      SCAFFOLD option II
- feddyn:   g - h_i + alpha (x - x^r)                        FedDyn
Server optimisers (Delta = sum_i p_i Delta_i, the weighted mean client update):
- avg:      x += eta_g Delta
- momentum: m = beta m + Delta; x += eta_g m                 FedAvgM
- adam/yogi/adagrad: Reddi et al. 2021 (Adaptive Federated Optimization), Algorithm 2,
            with m, v starting at 0 and no bias correction: x += eta_g m / (sqrt(v) + tau)
- feddyn:   h -= alpha |S|/N Delta; x += Delta - h / alpha   FedDyn server
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .qkv import GROUPS

__all__ = ["Method", "PRESETS", "LOCAL_OBJECTIVES", "SERVER_OPTIMIZERS", "FREEZE_SCHEDULES",
           "resolve", "LocalState", "ServerOptimizer", "DEFAULT_SERVER_LR"]

LOCAL_OBJECTIVES = ("plain", "prox", "scaffold", "feddyn")
SERVER_OPTIMIZERS = ("avg", "momentum", "adam", "yogi", "adagrad", "feddyn")
FREEZE_SCHEDULES = ("none", "warmup", "start")  # never; at round warmup_rounds; from round 0
DEFAULT_SERVER_LR = {"avg": 1.0, "momentum": 1.0, "adam": 1e-2, "yogi": 1e-2, "adagrad": 1e-1,
                     "feddyn": 1.0}

_BODY = tuple(g for g in GROUPS if g != "head")
# preset -> (local objective, server optimiser, freezing schedule, frozen groups or None = cfg.freeze)
PRESETS = {
    "fedavg": ("plain", "avg", "none", ()),
    "fedprox": ("prox", "avg", "none", ()),
    "scaffold": ("scaffold", "avg", "none", ()),
    "fedavgm": ("plain", "momentum", "none", ()),
    "fedadam": ("plain", "adam", "none", ()),
    "fedyogi": ("plain", "yogi", "none", ()),
    "fedadagrad": ("plain", "adagrad", "none", ()),
    "feddyn": ("feddyn", "feddyn", "none", ()),
    "fedfrozen": ("plain", "avg", "warmup", None),
    "fedfrozen_prox": ("prox", "avg", "warmup", None),
    "fedfrozen_scaffold": ("scaffold", "avg", "warmup", None),
    "fedfrozen_adam": ("plain", "adam", "warmup", None),
    # ablations
    "freeze_v": ("plain", "avg", "warmup", ("v",)),
    "freeze_attn": ("plain", "avg", "warmup", ("qk", "v", "attn_out")),
    "freeze_kernel_at_init": ("plain", "avg", "start", ("qk",)),
    "freeze_body": ("plain", "avg", "warmup", _BODY),
}


@dataclass(frozen=True)
class Method:
    """The resolved method: its three components and its frozen groups."""

    local: str
    server: str
    schedule: str
    frozen_groups: tuple
    freeze_at: int | None  # first round of stage 2, None if never

    def frozen_at(self, round_: int) -> tuple:
        """Groups frozen in round `round_`."""
        if self.freeze_at is None or round_ < self.freeze_at:
            return ()
        return self.frozen_groups

    @property
    def control_variates(self) -> bool:
        return self.local == "scaffold"


def resolve(cfg) -> Method:
    """Method of a Config: its preset, with explicit components overriding the preset's."""
    local, server, schedule, groups = PRESETS[cfg.method]
    local = cfg.local_objective or local
    server = cfg.server_opt or server
    schedule = cfg.freeze_schedule or schedule
    if groups is None or (cfg.freeze_schedule and not groups):
        groups = tuple(cfg.freeze)
    if schedule == "none":
        groups, freeze_at = (), None
    elif schedule == "start":
        freeze_at = 0
    else:
        freeze_at = cfg.warmup_rounds if cfg.warmup_rounds < cfg.rounds else None
    if (local == "feddyn") != (server == "feddyn"):
        raise ValueError("local_objective 'feddyn' and server_opt 'feddyn' go together "
                         f"(got local={local!r}, server={server!r})")
    return Method(local, server, schedule, tuple(groups), freeze_at)


class LocalState:
    """Client-side state of a local objective: SCAFFOLD's c and c_i, FedDyn's h_i.

    Vectors are flat (as FlatParams.data) and start at zero; `reset` zeroes them all at the
    stage switch, so after it they cover only the trainable groups.
    """

    def __init__(self, method: Method, cfg, numel: int, device):
        self.method, self.cfg = method, cfg
        self.numel, self.device = numel, device
        self.c = torch.zeros(numel, device=device) if method.local == "scaffold" else None
        self.client = {}  # client id -> c_i (scaffold) or h_i (feddyn)
        self.dc_sum = None

    def reset(self) -> None:
        if self.c is not None:
            self.c.zero_()
        self.client.clear()

    def _client_vec(self, cid: int) -> torch.Tensor:
        if cid not in self.client:
            self.client[cid] = torch.zeros(self.numel, device=self.device)
        return self.client[cid]

    def anchor_coeff(self) -> float:
        """Coefficient of (x - x^r) in the per-step gradient correction."""
        return {"prox": self.cfg.prox_mu, "feddyn": self.cfg.feddyn_alpha}.get(self.method.local, 0.0)

    def correction(self, cid: int) -> torch.Tensor | None:
        """Constant vector added to every local gradient of client `cid` this round."""
        if self.method.local == "scaffold":
            return self.c - self._client_vec(cid)
        if self.method.local == "feddyn":
            return -self._client_vec(cid)
        return None

    def begin_round(self) -> None:
        self.dc_sum = torch.zeros(self.numel, device=self.device) if self.c is not None else None

    def after_client(self, cid: int, delta: torch.Tensor, steps: int, lr: float, mask: torch.Tensor) -> None:
        """Update the client's state from its update Delta_i = x_i - x^r."""
        if self.method.local == "scaffold":
            c_i = self._client_vec(cid)
            new = (c_i - self.c - delta / (steps * lr)) * mask  # option II
            self.dc_sum.add_(new - c_i)
            c_i.copy_(new)
        elif self.method.local == "feddyn":
            self._client_vec(cid).sub_(delta * mask, alpha=self.cfg.feddyn_alpha)

    def end_round(self, n_sampled: int, n_clients: int, mask: torch.Tensor) -> None:
        """SCAFFOLD server control update: c += |S|/N * mean_{i in S}(c_i+ - c_i)."""
        if self.c is not None:
            self.c.add_(self.dc_sum * mask, alpha=1.0 / n_clients)  # (|S|/N) * (sum / |S|)

    def state_dict(self) -> dict:
        return {"c": self.c, "client": {str(k): v for k, v in self.client.items()}}

    def load_state_dict(self, state: dict) -> None:
        if self.c is not None:
            self.c.copy_(state["c"])
        self.client = {int(k): v.to(self.device) for k, v in state["client"].items()}


class ServerOptimizer:
    """Server step from the weighted mean update Delta, restricted to `mask`."""

    def __init__(self, method: Method, cfg, numel: int, device):
        self.kind = method.server
        self.cfg = cfg
        self.lr = cfg.server_lr if cfg.server_lr is not None else DEFAULT_SERVER_LR[self.kind]
        self.n_clients = cfg.n_clients
        self.state = {}
        self.numel, self.device = numel, device

    def reset(self) -> None:
        self.state = {}

    def _buf(self, name: str) -> torch.Tensor:
        if name not in self.state:
            self.state[name] = torch.zeros(self.numel, device=self.device)
        return self.state[name]

    def step(self, x: torch.Tensor, delta: torch.Tensor, mask: torch.Tensor, n_sampled: int) -> None:
        """x <- x + update(delta), touching only entries where mask == 1."""
        cfg, lr = self.cfg, self.lr
        if self.kind == "avg":
            update = delta * lr
        elif self.kind == "momentum":
            m = self._buf("m")
            m.mul_(cfg.server_momentum).add_(delta)
            update = m * lr
        elif self.kind in ("adam", "yogi", "adagrad"):
            m, v = self._buf("m"), self._buf("v")
            m.mul_(cfg.server_beta1).add_(delta, alpha=1 - cfg.server_beta1)
            d2 = delta * delta
            if self.kind == "adam":
                v.mul_(cfg.server_beta2).add_(d2, alpha=1 - cfg.server_beta2)
            elif self.kind == "yogi":
                v.sub_((1 - cfg.server_beta2) * d2 * torch.sign(v - d2))
            else:
                v.add_(d2)
            update = lr * m / (v.sqrt() + cfg.server_tau)
        elif self.kind == "feddyn":
            h = self._buf("h")
            alpha = cfg.feddyn_alpha
            h.sub_(delta * mask, alpha=alpha * n_sampled / self.n_clients)
            update = delta - h / alpha
        else:  # guarded by Config validation
            raise ValueError(f"unknown server optimiser {self.kind!r}")
        x.add_(update * mask)

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = {k: v.to(self.device) for k, v in state.items()}
