"""AFedLF: adaptive per-client layer freezing for heterogeneous devices (after Zeng et al., IEEE TMC 2025).

The paper's text was not available: everything here is [recon] (docs/methods.md). Each client has
a seeded device profile: compute speed c_i and bandwidth b_i, log-normal around 1 (σ 0.5), in units
of COMPUTE_RATE sample-passes per second and BANDWIDTH bytes per second. Each round client i
freezes the embedding and its first f_i blocks (f_i = 0: nothing), with
f_i = argmax_f gain(f) / time_i(f):
    time_i(f) = n_i · (B + 1 − f) / (B + 1) / (c_i · COMPUTE_RATE) + (model bytes + upload(f)) / (b_i · BANDWIDTH)
and gain(f) the running mean (EMA 0.5) of the loss decrease that clients with depth f achieved
(global minus trained model on a probe of the client's samples), starting from a prior that is
proportional to the trained share of the layers. While a client's prefix is unchanged on the
server since it was cached, its local steps start from the cached prefix outputs of its samples
and really skip the prefix's forward pass (not with augmentation, which changes the inputs).
The simulated round time is the slowest sampled client's time; the History gets `sim_seconds`,
`sim_clock`, `depths` and `cache_hits`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ..base.rng import seed_for
from ..inputs import augment
from .base import Method, probe_loss
from .fedtlu import layer_of_parameters
from .settings import Settings, setting

__all__ = ["AFedLF", "COMPUTE_RATE", "BANDWIDTH", "device_profiles", "client_seconds"]

COMPUTE_RATE = 1000.0  # sample-passes per second of a median device
BANDWIDTH = 1e6        # bytes per second of a median link


def device_profiles(cfg) -> tuple[np.ndarray, np.ndarray]:
    """(compute speed, bandwidth) of every client, log-normal around 1 (sigma 0.5), seeded by the config."""
    rng = np.random.default_rng(seed_for("afedlf_devices", cfg.seed))
    return rng.lognormal(0.0, 0.5, cfg.n_clients), rng.lognormal(0.0, 0.5, cfg.n_clients)


def client_seconds(n_samples: int, compute: float, bandwidth: float, trained_share: float, down_bytes: int,
                   up_bytes: int) -> float:
    """Simulated seconds of one client's round: its local passes plus its download and upload."""
    passes = n_samples * trained_share / (compute * COMPUTE_RATE)
    return float(passes + (down_bytes + up_bytes) / (bandwidth * BANDWIDTH))


@dataclass(frozen=True)
class AFedLFSettings(Settings):
    prefix: ClassVar[str] = "afedlf"
    max_depth: int | None = setting(None, "deepest frozen prefix in blocks (None: all but the last block)", lo=0)


class AFedLF(Method):
    """FedAvg with a per-client frozen prefix chosen for gain per simulated second, and a prefix cache."""

    Settings = AFedLFSettings

    batched = False  # its client_forward starts from a cached prefix, per client (fedfrozen.engine.batched)
    results_revision = 1  # 1: the device profiles draw from their own seed (they shared skewed participation's)

    def setup(self, setup) -> None:
        super().setup(setup)
        model = setup.model
        if not all(hasattr(model, a) for a in ("blocks", "patch_embed", "_pos_embed", "norm", "forward_head")):
            raise ValueError(f"AFedLF needs a timm VisionTransformer-like model (patch_embed, blocks, norm, "
                             f"forward_head); {type(model).__name__} is not one")
        self.layer, n_layers = layer_of_parameters(model, setup.flat)
        self.B = n_layers - 2
        depth = self.settings.max_depth
        if depth is not None and depth > self.B - 1:  # refused like FedTLU's k, never clamped
            raise ValueError(f"method_args['max_depth'] of 'afedlf' must be at most {self.B - 1} (the model's "
                             f"{self.B} blocks less the last, which always trains); got {depth}")
        self.max_depth = self.B - 1 if depth is None else depth
        self.compute, self.bandwidth = device_profiles(self.cfg)
        el = setup.flat.element_size
        self.layer_bytes = [int((self.layer == i).sum()) * el for i in range(n_layers)]
        self.model_bytes = sum(self.layer_bytes)
        self.gain = [(self.B + 1 - f) / (self.B + 1) for f in range(self.max_depth + 1)]
        self.version = torch.zeros(n_layers, dtype=torch.long)
        self.ranges = [torch.nonzero(self.layer == i).flatten() for i in range(n_layers)]
        self.keys: dict[int, tuple] = {}     # client -> (depth, prefix versions) of its cached outputs
        self.store: dict[int, torch.Tensor] = {}
        self.sim_clock = 0.0
        self.use_cache = not augment.enabled(self.cfg)

    # --- the depth choice ---------------------------------------------------------------------
    def time_of(self, cid: int, f: int) -> float:
        upload = self.model_bytes - sum(self.layer_bytes[:f + 1]) if f > 0 else self.model_bytes
        return client_seconds(len(self.s.client_train[cid]), self.compute[cid], self.bandwidth[cid],
                              (self.B + 1 - f) / (self.B + 1), self.model_bytes, upload)

    def depth_of(self, cid: int) -> int:
        scores = [self.gain[f] / self.time_of(cid, f) for f in range(self.max_depth + 1)]
        return max(range(len(scores)), key=lambda f: (scores[f], -f))

    def _choose(self, cids) -> None:
        """Each client's depth (from the gains as they stand) and mask: the server's half for the round's clients,
        a client's half for itself, from the same gains."""
        self.depths = {cid: self.depth_of(cid) for cid in cids}
        dtype = self.s.flat.data.dtype
        self.masks = {cid: None if f == 0 else (self.layer > f).to(dtype) for cid, f in self.depths.items()}

    def begin_round(self, r: int, sampled: list[int]) -> None:
        super().begin_round(r, sampled)
        self._choose(sampled)
        self.round_seconds = max(self.time_of(cid, f) for cid, f in self.depths.items())
        self.hits = 0

    def client_mask(self, r: int, cid: int):
        return self.masks[cid]

    def init_client(self, r: int, cid: int, opt, mask) -> None:
        super().init_client(r, cid, opt, mask)
        self.loss_before = probe_loss(self.s, cid)  # at the global weights, on the client's own data

    # --- the prefix cache ---------------------------------------------------------------------
    def _prefix(self, x: torch.Tensor, f: int) -> torch.Tensor:
        m = self.s.model
        x = m.norm_pre(m.patch_drop(m._pos_embed(m.patch_embed(x))))
        for blk in m.blocks[:f]:
            x = blk(x)
        return x

    def _suffix(self, h: torch.Tensor, f: int) -> torch.Tensor:
        m = self.s.model
        for blk in m.blocks[f:]:
            h = blk(h)
        return m.forward_head(m.norm(h))

    def client_forward(self, r: int, cid: int):
        f = self.depths[cid]
        if f == 0 or not self.use_cache:
            return None
        key = (f, tuple(int(v) for v in self.version[:f + 1]))
        idx = self.s.client_train[cid]
        if self.keys.get(cid) == key and cid in self.store:
            self.hit = 1
        else:
            if self.keys.get(cid) == key:
                self.hit = 1  # valid but not in memory (after a resume): rebuilt once, counted as the hit it is
            with torch.no_grad():
                self.store[cid] = torch.cat([self._prefix(self.s.x[b], f) for b in idx.split(512)])
            self.keys[cid] = key
        pos = torch.full((len(self.s.x),), -1, dtype=torch.long, device=idx.device)
        pos[idx] = torch.arange(len(idx), device=idx.device)
        cache = self.store[cid]
        return lambda b, xb: self._suffix(cache[pos[b]], f)

    # --- gains, versions, clock ---------------------------------------------------------------
    def after_client(self, r, cid, delta, steps, lr, mask) -> None:
        super().after_client(r, cid, delta, steps, lr, mask)
        observed = self.loss_before - probe_loss(self.s, cid)
        self.reported = {"observed": torch.tensor([observed], dtype=torch.float64), "hit": torch.tensor([self.hit])}

    def _learn(self, f: int, observed: float) -> None:
        """The gain of depth f from a client's observed loss drop (an exponential average, in the sampled order)."""
        if math.isfinite(observed):
            self.gain[f] = 0.5 * self.gain[f] + 0.5 * max(observed, 1e-6)

    # between the halves: the gains and layer versions go down (each client then finds its depth and its cache key
    # as the server does), the cache stays with the client, the observed loss drop and the cache hit come up
    def to_client(self, r: int, cid: int) -> dict:
        return {**self.local.to_client(cid), "gain": torch.tensor(self.gain, dtype=torch.float64),
                "version": self.version}

    def from_server(self, r: int, cid: int, tensors: dict) -> None:
        super().from_server(r, cid, tensors)
        self.gain = [float(g) for g in tensors["gain"]]
        self.version = tensors["version"].cpu().clone()
        self._choose([cid])
        self.hit = 0

    def client_state(self, cid: int) -> dict:
        if cid not in self.store:
            return super().client_state(cid)
        f, versions = self.keys[cid]
        return {**super().client_state(cid), "cache": self.store[cid], "cache_key": torch.tensor([f, *versions])}

    def load_client_state(self, cid: int, state: dict) -> None:
        super().load_client_state(cid, state)
        self.store.pop(cid, None)
        self.keys.pop(cid, None)
        if "cache" in state:
            k = [int(v) for v in state["cache_key"]]
            self.store[cid], self.keys[cid] = state["cache"].to(self.s.flat.data.device), (k[0], tuple(k[1:]))

    def to_server(self, r: int, cid: int) -> dict:
        return {**super().to_server(r, cid), **self.reported}

    def from_client(self, r: int, cid: int, tensors: dict, weight: float) -> None:
        super().from_client(r, cid, tensors, weight)
        self._learn(self.depths[cid], float(tensors["observed"][0]))
        self.hits += int(tensors["hit"][0])

    def server_update(self, r, x, acc, mask, sampled) -> None:
        super().server_update(r, x, acc, mask, sampled)
        for i, idx in enumerate(self.ranges):
            if (acc[idx] != 0).any():
                self.version[i] = r + 1
        self.sim_clock += self.round_seconds

    def on_round_end(self, r: int, row: dict, history) -> bool | None:
        row.update(sim_seconds=self.round_seconds, sim_clock=self.sim_clock, cache_hits=self.hits,
                   depths={str(c): f for c, f in self.depths.items()})
        return super().on_round_end(r, row, history)

    def state_dict(self) -> dict:
        keys = {str(c): torch.tensor([k[0], *k[1]]) for c, k in self.keys.items()}
        return {**super().state_dict(), "gain": torch.tensor(self.gain, dtype=torch.float64),
                "version": self.version.clone(), "sim_clock": torch.tensor(self.sim_clock, dtype=torch.float64),
                "keys": keys}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.gain = [float(g) for g in state["gain"]]
        self.version = state["version"].cpu().clone()
        self.sim_clock = float(state["sim_clock"])
        self.keys = {int(c): (int(k[0]), tuple(int(v) for v in k[1:])) for c, k in state["keys"].items()}
        self.store = {}
