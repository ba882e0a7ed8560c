"""FedSLM: clients of heterogeneous memory hold SVD-truncated models of different ranks (docs/methods.md).

**[recon]**: the paper's text was not available; this follows the rule reconstructed from its abstract.
Clients fall into G groups (seeded, round-robin over a permutation) with ranks r_1 < ... < r_G
(setting `ranks`; by default 1/6, 1/3 and 2/3 of the smallest body layer: 8, 16, 32 on vit_digits). Every linear
layer of the transformer body (q, k, v, the attention projection, the MLP;
not the classifier head, whose 10 outputs would cap every rank) is W = U S V' on the server, computed once
per round; a client of group g starts the round from the rank-r_g truncation W_g of every such layer (the
groups' subspaces are nested: all truncate the same SVD) and the other parameters as they are.
- Without adapters (setting `adapter_rank` = 0) the client trains its low-rank layers and keeps them low
  rank: after local training each layer is truncated back to rank r_g (the projection onto the rank-r_g
  matrices, once per round, standing in for training the factors A_g B_g).
- With adapters of rank a (> 0) the truncated base stays fixed and the client's change of each layer is
  kept as a rank-a adapter: W_i = W_g + [W_i - W_g]_a (the best rank-a approximation of what it learned).
Aggregation is FedAvg's data-weighted mean of the client models, which is within-group averaging of the
adapters followed by the data-weighted fusion of the groups' reconstructions W_g + ΔW_g.
Bytes: a client receives and holds the factors of its rank (r_g (m + n) floats per m x n layer, or the
m n of the dense layer where that is fewer) and every other parameter; it sends its factors (no adapters) or its
adapters (a (m + n) per layer) and the other
trained parameters. Each row records the parameter bytes a client of each group holds (`client_bytes_by_group`).
With every rank = full and no adapters it is FedAvg up to float rounding (a test). The optional
weak-to-strong distillation on a public split is not implemented. Sequential engine only (each client
starts from its own truncated model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from ..base.rng import seed_for
from .base import Method
from .settings import Settings, setting

__all__ = ["FedSLM", "body_linears", "default_ranks"]


def body_linears(model: nn.Module, flat) -> list[tuple[str, int, int, int]]:
    """(name, flat offset, rows, cols) of the weight of every nn.Linear of the body (all but the head)."""
    out = []
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and not (name == "head" or name.endswith(".head")):
            key = f"{name}.weight"
            a, b = flat.param_range[key]
            out.append((key, a, *m.weight.shape))
    return out


def default_ranks(width: int) -> tuple:
    """1/6, 1/3 and 2/3 of the smallest layer's size (8, 16, 32 for vit_digits' 48), increasing, at least 1."""
    ranks = []
    for f in (1 / 6, 1 / 3, 2 / 3):
        r = max(1, round(f * width))
        if not ranks or r > ranks[-1]:
            ranks.append(r)
    return tuple(ranks)


def truncate(w: torch.Tensor, rank: int) -> torch.Tensor:
    """The best rank-`rank` approximation of w (SVD)."""
    U, S, Vh = torch.linalg.svd(w, full_matrices=False)
    return (U[:, :rank] * S[:rank]) @ Vh[:rank]


@dataclass(frozen=True)
class FedSLMSettings(Settings):
    prefix: ClassVar[str] = "fedslm"
    ranks: tuple[int, ...] = setting((), "ranks r_1 < ... < r_G of the groups' truncated linear layers (empty: 1/6, "
                                         "1/3, 2/3 of the smallest layer)", lo=1)
    adapter_rank: int = setting(0, "rank of each client's adapter on its truncated base (0: no adapters)", lo=0)

    def check(self, cfg) -> None:
        if any(b <= a for a, b in zip(self.ranks, self.ranks[1:])):
            raise ValueError(f"method_args['ranks'] of {cfg.method!r} must be increasing (r_1 < ... < r_G); "
                             f"got {self.ranks!r}")


class FedSLM(Method):
    """FedAvg over clients that hold rank-r_g truncations of the body's linear layers (and optional adapters)."""

    Settings = FedSLMSettings
    batched = False  # each client starts from its own group's truncated weights

    def setup(self, setup) -> None:
        super().setup(setup)
        cfg = self.cfg
        self.adapter = self.settings.adapter_rank
        self.layers = body_linears(setup.model, setup.flat)
        if not self.layers:
            raise ValueError(f"method 'fedslm' needs linear layers in the model's body; {cfg.model!r} has none")
        smallest = min(min(m, n) for _, _, m, n in self.layers)
        self.ranks = tuple(int(r) for r in self.settings.ranks) or default_ranks(smallest)
        if self.ranks[-1] > smallest:
            raise ValueError(f"method_args['ranks'] {self.ranks}: a rank exceeds the smallest linear layer of the body "
                             f"(min(rows, cols) = {smallest})")
        if self.adapter > smallest:
            raise ValueError(f"method_args['adapter_rank'] ({self.adapter}) exceeds the smallest linear layer of "
                             f"the body ({smallest})")
        perm = np.random.default_rng(seed_for("fedslm_groups", cfg.seed)).permutation(cfg.n_clients)
        self.group = np.empty(cfg.n_clients, dtype=np.int64)
        self.group[perm] = np.arange(cfg.n_clients) % len(self.ranks)
        self.flat = setup.flat
        self.base: dict[int, list[torch.Tensor]] = {}
        self._svd_round = None
        es = setup.flat.element_size
        linear = sum(m * n for _, _, m, n in self.layers)
        self.other_bytes = (setup.flat.numel - linear) * es
        # a layer is held as its factors, or dense where that is smaller (rank >= mn / (m + n))
        self.factor_bytes = [sum(min(r * (m + n), m * n) for _, _, m, n in self.layers) * es for r in self.ranks]
        self.adapter_bytes = sum(min(self.adapter * (m + n), m * n) for _, _, m, n in self.layers) * es

    def group_of(self, cid: int) -> int:
        return int(self.group[cid])

    def _view(self, vec: torch.Tensor, layer) -> torch.Tensor:
        _, a, m, n = layer
        return vec[a:a + m * n].view(m, n)

    def from_server(self, r: int, cid: int, tensors: dict) -> None:
        """Nothing crosses but the update: a client's group comes from the seed, its base from the round's global
        weights (the model holds them here), decomposed once a round by the clients' half."""
        super().from_server(r, cid, tensors)
        if self._svd_round != r:
            self.base = {}  # group -> its truncated layers, from this round's SVD of the global model
            self._svd = [torch.linalg.svd(self._view(self.flat.data, layer), full_matrices=False)
                         for layer in self.layers]
            self._svd_round = r

    def _group_base(self, g: int) -> list[torch.Tensor]:
        if g not in self.base:
            r = self.ranks[g]
            self.base[g] = [(U[:, :r] * S[:r]) @ Vh[:r] for U, S, Vh in self._svd]
        return self.base[g]

    def init_client(self, r: int, cid: int, opt, mask: torch.Tensor) -> None:
        super().init_client(r, cid, opt, mask)
        for layer, w in zip(self.layers, self._group_base(self.group_of(cid))):
            self._view(self.flat.data, layer).copy_(w)  # the model holds the client's truncated weights

    def upload(self, r: int, cid: int, delta: torch.Tensor) -> None:
        """What a client of group g sends: its body layers truncated to rank r_g (or its rank-a adapters)."""
        g = self.group_of(cid)
        x = self.flat.data  # the client's trained weights
        for layer, w in zip(self.layers, self._group_base(g)):
            trained = self._view(x, layer)
            kept = truncate(trained, self.ranks[g]) if not self.adapter else w + truncate(trained - w, self.adapter)
            global_w = trained - self._view(delta, layer)  # delta = client - global
            self._view(delta, layer).copy_(kept - global_w)

    def client_bytes(self, r: int, cid: int, payload: int, trainable: int) -> tuple[int, int]:
        g = self.group_of(cid)
        down = self.factor_bytes[g] + self.other_bytes
        up = (self.adapter_bytes if self.adapter else self.factor_bytes[g]) + self.other_bytes
        return down, up

    def held_bytes(self, g: int) -> int:
        """Parameter bytes a client of group g holds: its factors, its adapters and every other parameter."""
        return self.factor_bytes[g] + (self.adapter_bytes if self.adapter else 0) + self.other_bytes

    def on_round_end(self, r: int, row: dict, history) -> bool | None:
        row["client_bytes_by_group"] = [self.held_bytes(g) for g in range(len(self.ranks))]
        return super().on_round_end(r, row, history)
