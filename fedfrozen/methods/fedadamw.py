"""FedAdamW (Liu et al., arXiv 2510.27486; update rule confirmed from the authors' code, docs/methods.md).

Local AdamW that carries state across rounds through the server and is pulled along the last round's
mean update:
- each round a client starts with m = 0 and v = the server's v̄, one scalar per parameter tensor (the
  mean of v over the tensor), and the Adam step counter where the server's left it (it runs on
  across rounds: + the round's mean number of local steps K each round);
- every local step is AdamW with learning rate η(1 − γ) and weight decay wd/(1 − γ), followed by
  x ← x + (γ/K)·Δ̄^{r−1}, the previous round's mean client update (zero in round 0 and after a
  stage switch);
- clients upload Δ_i and the per-tensor mean of v; the server sets x ← x + Δ̄ (FedAvg), averages the
  v means with the aggregation weights, and sends x, Δ̄ and v̄ (all counted in bytes).
the setting `gamma` γ (default 0.9, the authors' language-model scripts; 0.5 in their vision script) and
`server_moments` (v̄ and the counter shared; False: fresh moments each round). γ = 0 without
server moments is Local AdamW (FedAvg with local AdamW) exactly (a test). It sets the local optimiser's
state and adds a per-step term, so it runs on the sequential engine only.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Method
from .settings import Settings, setting

__all__ = ["FedAdamW"]


@dataclass(frozen=True)
class FedAdamWSettings(Settings):
    prefix: ClassVar[str] = "fedadamw"
    gamma: float = setting(0.9, "weight gamma of the pull along the last mean update (lr and wd scaled by 1 - gamma)",
                           lo=0, hi=1, hi_open=True)
    server_moments: bool = setting(True, "clients start from the server's per-tensor v and step counter")


class FedAdamW(Method):
    """FedAvg with FedAdamW's local optimiser state from the server and its pull along Δ̄^{r-1}."""

    Settings = FedAdamWSettings
    batched = False  # sets the local optimiser's state (init_client) and adds a per-step term

    def setup(self, setup) -> None:
        super().setup(setup)
        cfg = self.cfg
        if cfg.optimizer != "adamw":
            raise ValueError(f"method {cfg.method!r} is local AdamW; optimizer must be 'adamw', got {cfg.optimizer!r}")
        flat = setup.flat
        self.flat = flat
        self.gamma = self.settings.gamma
        self.shared = self.settings.server_moments
        names = sorted(flat.param_range, key=lambda n: flat.param_range[n][0])
        self.tensor_of = torch.empty(flat.numel, dtype=torch.long, device=flat.data.device)
        for i, name in enumerate(names):
            a, b = flat.param_range[name]
            self.tensor_of[a:b] = i
        self.n_tensors = len(names)
        self.tensor_size = torch.bincount(self.tensor_of, minlength=self.n_tensors).to(flat.data.dtype)
        self.v_bar = torch.zeros(self.n_tensors, device=flat.data.device)
        self.t = 0
        self.delta_bar = torch.zeros_like(flat.data)

    # --- per round / client -----------------------------------------------------------------
    def begin_round(self, r: int, sampled: list[int]) -> None:
        super().begin_round(r, sampled)
        self.v_sum = torch.zeros_like(self.v_bar)
        self.steps_sum = 0.0

    def _steps(self, cid: int) -> int:
        cfg = self.cfg
        n = len(self.s.client_train[cid])
        return cfg.local_steps or cfg.local_epochs * math.ceil(n / min(cfg.batch_size, n))

    def init_client(self, r: int, cid: int, opt, mask: torch.Tensor) -> None:
        super().init_client(r, cid, opt, mask)
        pull = self.gamma / self._steps(cid)
        # the local update rule, transformed (fedfrozen.nets.update): lr and weight decay scaled, the pull after each
        # step
        opt.rule = dataclasses.replace(opt.rule, lr_scale=1 - self.gamma,
                                       weight_decay=self.cfg.weight_decay / (1 - self.gamma),
                                       after_step=self._pull(pull) if self.gamma else None)
        if self.shared:
            opt.start_from(self.v_bar[self.tensor_of], self.t)
        self.opt = opt

    def _pull(self, pull: float):
        """The per-step term along the last mean update: x += pull * delta_bar (pull = gamma / K)."""
        return lambda: self.flat.data.add_(self.delta_bar, alpha=pull)

    def after_client(self, r, cid, delta, steps, lr, mask) -> None:
        super().after_client(r, cid, delta, steps, lr, mask)
        opt = self.opt
        full = opt.second_moments()
        self.reported = {"v_means": torch.zeros_like(self.v_bar).index_add_(0, self.tensor_of, full) / self.tensor_size,
                         "steps": torch.tensor([steps])}  # what the client uploads besides Δ_i

    def _fold(self, p: float, reported: dict) -> None:
        """The server's side: a client's v means and steps into the round's sums, weighted by its p_i."""
        self.v_sum.add_(reported["v_means"], alpha=p)
        self.steps_sum += p * int(reported["steps"][0])

    # between the halves: Δ̄ and v̄ (with the counter) go down, the v means and K up (as counted in client_bytes)
    def to_client(self, r: int, cid: int) -> dict:
        out = super().to_client(r, cid)
        if self.gamma:
            out["delta_bar"] = self.delta_bar
        if self.shared:
            out |= {"v_bar": self.v_bar, "t": torch.tensor([self.t])}
        return out

    def from_server(self, r: int, cid: int, tensors: dict) -> None:
        super().from_server(r, cid, tensors)
        if self.gamma:
            self.delta_bar.copy_(tensors["delta_bar"])
        if self.shared:
            self.v_bar.copy_(tensors["v_bar"])
            self.t = int(tensors["t"][0])

    def to_server(self, r: int, cid: int) -> dict:
        return {**super().to_server(r, cid), **self.reported}

    def from_client(self, r: int, cid: int, tensors: dict, weight: float) -> None:
        super().from_client(r, cid, tensors, weight)
        self._fold(weight, tensors)

    def server_update(self, r, x, acc, mask, sampled) -> None:
        super().server_update(r, x, acc, mask, sampled)
        self.delta_bar.copy_(acc)  # Δ̄^r, for next round's pull (0 on what the stage freezes: no client moved it)
        if self.shared:
            trained = torch.zeros_like(self.v_bar).index_add_(0, self.tensor_of, mask) > 0
            self.v_bar[trained] = self.v_sum[trained]  # tensors no client trained keep their v̄
            self.t += int(round(self.steps_sum))

    def on_stage_switch(self, frozen: tuple) -> None:
        super().on_stage_switch(frozen)
        self.delta_bar.zero_()  # the last stage's Δ̄ covers groups that are frozen now

    def client_bytes(self, r: int, cid: int, payload: int, trainable: int) -> tuple[int, int]:
        down, up = super().client_bytes(r, cid, payload, trainable)
        moments = 4 * self.n_tensors if self.shared else 0  # v̄ down, the per-tensor v means up (float32)
        return down + (payload if self.gamma else 0) + moments, up + moments

    # --- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {**super().state_dict(), "v_bar": self.v_bar, "t": self.t, "delta_bar": self.delta_bar}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.v_bar.copy_(state["v_bar"])
        self.t = int(state["t"])
        self.delta_bar.copy_(state["delta_bar"])
