"""Methods that reuse the stale updates of inactive clients: MIFA, FedVARP and FedSteer (docs/methods.md).

All three keep a server cache H (one row per client: its latest update u_i = x_i - x^r, zero until it
first joins) and replace FedAvg's mean of the active clients' updates by a direction that also counts
the clients who did not join. With d_i = n_i / n the data share of client i over all N clients, p_i its
probability of joining a round (`participation_probabilities`) and A the round's active clients:

- **MIFA**: H_i <- u_i for i in A, then x <- x + sum_i d_i H_i (every client's latest update, stale or
  not). MIFA's paper averages with 1/N; here the weights are the data shares, as in FedAvg, which is
  1/N for clients of equal size.
- **FedVARP**: x <- x + sum_{i in A} (d_i / p_i)(u_i - H_i) + sum_i d_i H_i, then H_i <- u_i for i in A
  (an unbiased estimate of the full mean, whose variance the cache reduces).
- **FedSteer** (UAI 2026; from the authors' code): FedVARP's step with h_i = Q s_i in place of H_i, where
  Q = [H_j / K]_{j in C} holds the cached updates of a core set C of K clients and s_i are client i's
  coordinates in that subspace: for an active client the ridge solution s_i = (Q'Q + lam I)^-1 Q' u_i, an
  inactive one keeps its last s_i. The core set is chosen at the end of each of the first
  `select_rounds` rounds (K = `core`, default min(10, N); a seeded random start, then up to 5 best swaps minimising
  sum_i (d_i^2 / p_i) ||g_i - Q_g s_i||^2 + lam_i ||s_i||^2 with lam_i = lam p_i / d_i^2, on the
  norm-normalised head vectors g_i of the cache) and fixed afterwards.

With every client active every round (participation "full") all three equal FedAvg: MIFA exactly, the
other two up to float rounding (their corrections cancel). A round nobody joins changes nothing (the loop
skips the server step). The server memory of the caches is recorded in every History row
(`server_cache_bytes`), with the number of clients the cache holds (`cached_clients`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ..base.rng import seed_for
from .base import Method, participation_probabilities
from .settings import Settings, setting

__all__ = ["MIFA", "FedVARP", "FedSteer"]


class MIFA(Method):
    """MIFA: the data-weighted mean of every client's latest update. Holds the server cache (the latest update
    of every client) and the round's fresh updates, which FedVARP and FedSteer reuse with their own `direction`.

    The round's accumulator keeps the plain mean of the sampled updates, which the History's drift and
    update-norm columns measure (as for every other method); the direction the server applies is a buffer of
    its own."""

    results_revision = 1  # 1: drift_* / update_norm_* measure the plain mean (they measured the applied direction)

    def setup(self, setup) -> None:
        super().setup(setup)
        n, numel = self.cfg.n_clients, setup.flat.numel
        self.H = torch.zeros(n, numel, device=setup.device)  # H_i: client i's latest update (0 until it joins)
        self.seen = torch.zeros(n, dtype=torch.bool)
        sizes = np.asarray(setup.client_sizes, dtype=np.float64)
        self.d = torch.as_tensor(sizes / sizes.sum(), dtype=setup.flat.data.dtype, device=setup.device)
        self.p = torch.as_tensor(participation_probabilities(self.cfg), dtype=self.d.dtype, device=setup.device)
        self.fresh: dict[int, torch.Tensor] = {}
        self.applied = torch.zeros(numel, device=setup.device)  # the direction the server steps along

    def begin_round(self, r: int, sampled: list[int]) -> None:
        super().begin_round(r, sampled)
        self.fresh = {}

    def aggregate(self, acc: torch.Tensor, cid: int, delta: torch.Tensor, weight: float) -> None:
        super().aggregate(acc, cid, delta, weight)  # the plain mean stays in acc (drift metrics use it)
        self.fresh[cid] = delta.clone()

    def on_stage_switch(self, frozen: tuple) -> None:
        super().on_stage_switch(frozen)
        for g in frozen:  # the cached entries of the groups frozen now are the last stage's: dropped
            self.H[:, self.s.flat.group_slice(g)] = 0.0

    def direction(self, r: int) -> torch.Tensor:
        """The update the server applies this round (then the cache holds the fresh updates)."""
        self._store_fresh()
        return self.d @ self.H

    def server_update(self, r, x, acc, mask, sampled) -> None:
        self.applied.copy_(self.direction(r))
        super().server_update(r, x, self.applied, mask, sampled)

    def _store_fresh(self) -> None:
        for cid, u in self.fresh.items():
            self.H[cid].copy_(u)
            self.seen[cid] = True

    def cache_bytes(self) -> int:
        return self.H.numel() * self.H.element_size()

    def on_round_end(self, r: int, row: dict, history) -> bool | None:
        row["server_cache_bytes"] = self.cache_bytes()
        row["cached_clients"] = int(self.seen.sum())
        return super().on_round_end(r, row, history)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "H": self.H, "seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.H.copy_(state["H"])
        self.seen.copy_(state["seen"])  # (an earlier version's "masked" flag was True in every checkpoint: ignored)


class FedVARP(MIFA):
    """FedVARP: fresh updates corrected by their cached ones, plus the mean of the cache."""

    def direction(self, r: int) -> torch.Tensor:
        out = self.d @ self.H
        for cid, u in self.fresh.items():
            out.add_(u - self.H[cid], alpha=float(self.d[cid] / self.p[cid]))
        self._store_fresh()
        return out


@dataclass(frozen=True)
class FedSteerSettings(Settings):
    prefix: ClassVar[str] = "fedsteer"
    core: int | None = setting(None, "K, the clients of the core set whose cached updates span the subspace "
                                     "(None: min(10, N))", lo=1)
    lambda_: float = setting(0.5, "ridge lambda of the subspace coordinates", lo=0, lo_open=True)
    select_rounds: int = setting(5, "the core set is re-chosen at the end of the first rounds, then fixed", lo=0)

    def check(self, cfg) -> None:
        if self.core is not None and self.core > cfg.n_clients:
            raise ValueError(f"method_args['core'] ({self.core}) must not exceed n_clients ({cfg.n_clients}): "
                             "the core set is drawn from the clients")


class FedSteer(MIFA):
    """FedSteer: FedVARP's step, the cache seen through the subspace of a core set of clients."""

    Settings = FedSteerSettings

    def setup(self, setup) -> None:
        super().setup(setup)
        cfg = self.cfg
        self.K = self.settings.core or min(10, cfg.n_clients)  # Config refuses a core larger than n_clients
        self.lam = self.settings.lambda_
        rng = np.random.default_rng(seed_for("fedsteer_subspace", cfg.seed))
        self.core = sorted(int(i) for i in rng.choice(cfg.n_clients, size=self.K, replace=False))
        self.S = torch.zeros(cfg.n_clients, self.K, device=setup.device)  # s_i: coordinates of client i
        self.head = setup.flat.group_slice("head")

    def _Q(self) -> torch.Tensor:
        return self.H[self.core].T / self.K  # (numel, K)

    def direction(self, r: int) -> torch.Tensor:
        Q = self._Q()
        ids = list(self.fresh)
        if ids:
            U = torch.stack([self.fresh[i] for i in ids], dim=1)  # (numel, |A|)
            G = Q.T @ Q + self.lam * torch.eye(self.K, device=Q.device, dtype=Q.dtype)
            self.S[ids] = torch.linalg.solve(G, Q.T @ U).T
        out = Q @ (self.d @ self.S)  # sum_i d_i h_i with h_i = Q s_i
        if ids:  # + sum_{i in A} (d_i / p_i)(u_i - h_i)
            out.add_((U - Q @ self.S[ids].T) @ (self.d[ids] / self.p[ids]))
        self._store_fresh()
        if r < self.settings.select_rounds:
            self.core = self.select_core(r)
        return out

    # --- core set ---------------------------------------------------------------------------
    def _core_inputs(self):
        """What every candidate core set is scored on: the norm-normalised head vectors of the cache (all clients,
        to build Q_g from; and those seen so far, the scored ones), w_i = d_i^2 / p_i and lam_i = lam p_i / d_i^2."""
        g_all = self.H[:, self.head]
        g_all = g_all / g_all.norm(dim=1, keepdim=True).clamp_min(1e-12)
        seen = self.seen.to(g_all.device)
        w, lam_i = self.d ** 2 / self.p, self.lam * self.p / self.d ** 2
        return g_all, g_all[seen], w[seen], lam_i[seen]

    def core_objective(self, core, inputs=None) -> float:
        """sum_i (d_i^2/p_i) ||g_i - Q_g s_i||^2 + lam_i ||s_i||^2 (lam_i = lam p_i / d_i^2), s_i its minimiser, on the
        norm-normalised head vectors g_i of the cache; clients never seen are left out. `inputs`: _core_inputs(),
        computed once for all the candidates of a selection."""
        g_all, g, w, lam_i = inputs or self._core_inputs()
        Qg = g_all[list(core)].T  # (h, K)
        eye = torch.eye(len(core), device=g.device, dtype=g.dtype)
        # s_i minimises w_i ||g_i - Qg s||^2 + lam_i ||s||^2: a ridge solve with coefficient lam_i / w_i
        s = torch.linalg.solve((Qg.T @ Qg)[None] + (lam_i / w)[:, None, None] * eye, (g @ Qg)[..., None])[..., 0]
        return float((w * ((g - s @ Qg.T) ** 2).sum(1) + lam_i * (s ** 2).sum(1)).sum())

    def select_core(self, r: int, swaps: int = 5) -> list[int]:
        """A seeded random core set, improved by up to `swaps` best single swaps (member out, non-member in)."""
        n = self.cfg.n_clients
        rng = np.random.default_rng(seed_for("fedsteer_core", self.cfg.seed, r))
        core = sorted(int(i) for i in rng.choice(n, size=self.K, replace=False))
        inputs = self._core_inputs()
        best = self.core_objective(core, inputs)
        for _ in range(swaps):
            move = None
            for out_pos in range(self.K):
                for cand in range(n):
                    if cand in core:
                        continue
                    trial = sorted(core[:out_pos] + [cand] + core[out_pos + 1:])
                    value = self.core_objective(trial, inputs)
                    if value < best - 1e-12:
                        best, move = value, trial
            if move is None:
                break
            core = move
        return core

    def cache_bytes(self) -> int:
        return super().cache_bytes() + self.S.numel() * self.S.element_size()

    def on_round_end(self, r: int, row: dict, history) -> bool | None:
        row["core_set"] = list(self.core)
        return super().on_round_end(r, row, history)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "S": self.S, "core": torch.tensor(self.core)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.S.copy_(state["S"])
        self.core = [int(i) for i in state["core"]]
