"""Attention-head pruning with head-confidence-weighted aggregation and importance-driven client selection
(after Venkatesha, Kundu, Panda, arXiv 2506.00743).

Before training, each sampled client measures, at the round's global weights, the confidence of
every attention head on (up to 128 of) its own samples: c_{i,h} = mean over tokens of the head's
largest attention weight (the attention probabilities come from timm's non-fused attention path,
switched on only for this pass). The client trains only its top (1 − s) heads by confidence (the
rows of W_Q, W_K, W_V and the columns of the output projection belonging to the head; every
non-head parameter trains) and uploads those, plus its confidences. The server aggregates each
head over the clients that trained it, weighted by p_i·c_{i,h}; everything else as FedAvg. With
partial participation, clients are chosen by importance, the loss of the global model minus the
loss of the client's trained model on its probe samples (larger: more to contribute), greedily,
with a seeded ε = 0.2 share of random picks and never-seen clients first.
[recon] (docs/methods.md): the confidence definition, the p_i·c weighting, the probe size, ε.
Settings (method_args): `sparsity` s in [0, 1), `weighting` ("confidence" or "uniform").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from ..base.rng import seed_for
from ..nets.qkv import SplitQKV
from .base import PROBE, Method, probe_loss
from .settings import Settings, setting

__all__ = ["HeadPruning", "head_index", "EXPLORE"]

EXPLORE = 0.2  # share of the round's clients picked at random


def head_index(model, flat) -> tuple[torch.Tensor, list]:
    """(head id of every flat entry, -1 outside heads; the attention modules). Head h of block b has id
    b * H + h over the q, k, v rows and the output-projection columns of that head."""
    ids = torch.full((flat.numel,), -1, dtype=torch.long, device=flat.data.device)
    params = {id(p): n for n, p in model.named_parameters()}
    attns = [m for m in model.modules() if isinstance(getattr(m, "qkv", None), SplitQKV) and hasattr(m, "proj")
             and getattr(m, "num_heads", None)]
    if not attns:
        raise ValueError(f"head pruning needs attention heads (timm Attention with a split qkv); "
                         f"{type(model).__name__} has none")
    base = 0
    for m in attns:
        H = m.num_heads
        for lin in (m.qkv.q, m.qkv.k, m.qkv.v):
            hd = lin.out_features // H
            for p in (lin.weight, lin.bias):
                if p is None:
                    continue
                a, b = flat.param_range[params[id(p)]]
                view = ids[a:b].view(p.shape[0], -1)
                for h in range(H):
                    view[h * hd:(h + 1) * hd] = base + h
        a, b = flat.param_range[params[id(m.proj.weight)]]
        view = ids[a:b].view(m.proj.weight.shape)
        hd = m.proj.weight.shape[1] // H
        for h in range(H):
            view[:, h * hd:(h + 1) * hd] = base + h
        base += H
    return ids, attns


@dataclass(frozen=True)
class HeadPruningSettings(Settings):
    prefix: ClassVar[str] = "head"
    sparsity: float = setting(0.5, "share s of attention heads each client leaves untrained, in [0, 1)", lo=0, hi=1,
                              hi_open=True)
    weighting: str = setting("confidence", "per-head aggregation weights p_i*c_ih (confidence) or p_i (uniform)",
                             choices=("confidence", "uniform"))


class HeadPruning(Method):
    """FedAvg where each client trains its most confident heads and the server averages heads by confidence."""

    Settings = HeadPruningSettings
    # each client's half measures and masks its heads; to_server carries its confidences and importance

    def setup(self, setup) -> None:
        super().setup(setup)
        self.head, self.attns = head_index(setup.model, setup.flat)
        self.n_heads = int(self.head.max()) + 1
        self.is_head = self.head >= 0
        self.head_pos = self.head[self.is_head]
        self.keep = max(1, math.ceil((1 - self.settings.sparsity) * self.n_heads))
        self.importance = torch.full((self.cfg.n_clients,), math.nan)
        dev = setup.flat.data.device
        self.num = torch.zeros(int(self.is_head.sum()), device=dev)
        self.den = torch.zeros(self.n_heads, device=dev)
        self.conf, self.masks, self.loss_before = {}, {}, {}

    # --- participation ---------------------------------------------------------------------
    def sample_clients(self, r: int) -> list[int]:
        cfg = self.cfg
        m = cfg.clients_per_round or cfg.n_clients
        if m >= cfg.n_clients or cfg.participation != "uniform":  # nothing to choose, or who joins is not ours
            return super().sample_clients(r)
        rng = np.random.default_rng(seed_for("head_pruning", cfg.seed, r))
        score = torch.nan_to_num(self.importance, nan=math.inf).tolist()  # never seen: first
        order = sorted(range(cfg.n_clients), key=lambda i: (-score[i], i))
        n_random = int(rng.binomial(m, EXPLORE))
        chosen = order[:m - n_random]
        rest = [i for i in range(cfg.n_clients) if i not in chosen]
        chosen += [int(i) for i in rng.choice(rest, size=n_random, replace=False)]
        return sorted(chosen)

    # --- what each client trains -----------------------------------------------------------
    @torch.no_grad()
    def _probe(self, cid: int):
        """(per-head confidence, loss) of the resident model on the client's probe samples."""
        s = self.s
        idx = s.client_train[cid][:PROBE]
        seen, hooks = [], []
        fused = [getattr(m, "fused_attn", False) for m in self.attns]
        for m in self.attns:
            m.fused_attn = False
            hooks.append(m.attn_drop.register_forward_hook(lambda mod, inp, out: seen.append(inp[0])))
        training = s.model.training
        s.model.eval()
        try:
            loss = F.cross_entropy(s.model(s.x[idx]), s.y[idx]).item()
        finally:
            for h in hooks:
                h.remove()
            for m, f in zip(self.attns, fused):
                m.fused_attn = f
            s.model.train(training)
        conf = torch.cat([p.amax(-1).mean(dim=(0, 2)) for p in seen])  # (blocks * heads,)
        return conf, loss

    def begin_round(self, r: int, sampled: list[int]) -> None:
        super().begin_round(r, sampled)
        self.sampled = list(sampled)
        self.num.zero_()
        self.den.zero_()
        self.conf = {}
        self.masks = {}
        self.loss_before = {}

    def _measure(self, cid: int) -> None:
        """The client's head confidences on its probe samples (the resident model holds the round's global
        weights; probing does not change them), its top heads and its mask."""
        conf, loss = self._probe(cid)
        if self.settings.weighting == "uniform":
            conf = torch.ones_like(conf)
        top = torch.topk(conf, self.keep).indices if self.keep < self.n_heads else torch.arange(self.n_heads)
        trained = torch.zeros(self.n_heads, dtype=torch.bool, device=conf.device)
        trained[top] = True
        self._set(cid, conf * trained)
        self.loss_before[cid] = loss

    def _set(self, cid: int, conf: torch.Tensor) -> None:
        """Client cid's confidences of the heads it trains (0 for the others) and its mask."""
        self.conf[cid] = conf
        trained = conf > 0  # a confidence is a mean of softmax maxima (> 0); uniform weighting gives ones
        self.masks[cid] = (~self.is_head | trained[self.head.clamp(min=0)]).to(self.s.flat.data.dtype)

    def from_server(self, r: int, cid: int, tensors: dict) -> None:
        super().from_server(r, cid, tensors)
        for kept in (self.conf, self.masks, self.loss_before):  # a client's half measures again every round
            kept.pop(cid, None)

    def client_mask(self, r: int, cid: int) -> torch.Tensor:
        if cid not in self.masks:  # the clients' half: measured on the client's data before it trains; the
            self._measure(cid)     # server's half knows it from the client's confidences (from_client)
        return self.masks[cid]

    def after_client(self, r, cid, delta, steps, lr, mask) -> None:
        super().after_client(r, cid, delta, steps, lr, mask)
        self.importance[cid] = self.loss_before[cid] - probe_loss(self.s, cid)

    # between the halves each client measures its heads; its confidences and importance come up (counted in bytes)
    def to_client(self, r: int, cid: int) -> dict:
        return self.local.to_client(cid)  # no mask: the client chooses its heads

    def to_server(self, r: int, cid: int) -> dict:
        return {**super().to_server(r, cid), "conf": self.conf[cid], "importance": self.importance[cid:cid + 1]}

    def from_client(self, r: int, cid: int, tensors: dict, weight: float) -> None:
        super().from_client(r, cid, tensors, weight)
        self._set(cid, tensors["conf"].to(self.s.flat.data.device))
        self.importance[cid] = tensors["importance"][0]

    def client_bytes(self, r, cid, payload, trainable) -> tuple[int, int]:
        f = self.local.exchange_factor
        return f * trainable, f * payload + 4 * self.n_heads  # the confidences go up too

    # --- aggregation ------------------------------------------------------------------------
    def aggregate(self, acc, cid, delta, weight) -> None:
        super().aggregate(acc, cid, delta, weight)  # non-head entries: the p_i-weighted sum
        w = weight * self.conf[cid]                  # (heads,), 0 for heads the client did not train
        self.num.add_(delta[self.is_head] * w[self.head_pos])
        self.den.add_(w)

    def server_update(self, r, x, acc, mask, sampled) -> None:
        den = self.den[self.head_pos]
        acc[self.is_head] = torch.where(den > 0, self.num / den.clamp(min=1e-30), torch.zeros_like(den))
        super().server_update(r, x, acc, mask, sampled)

    def on_round_end(self, r: int, row: dict, history) -> bool | None:
        row["heads_trained"] = {str(c): int((self.conf[c] > 0).sum()) for c in self.sampled if c in self.conf}
        return super().on_round_end(r, row, history)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "importance": self.importance.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.importance = state["importance"].cpu().clone()
