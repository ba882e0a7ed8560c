"""FedTLU: targeted layer updates (Park & Joe-Wong, ICASSP 2025, arXiv 2412.17692).

Every layer l (the embedding, each transformer block, the head with the final norm) gets a score
from the last aggregated update Δ_l: score_l = ‖Δ_l‖ / (√n_l · std(Δ_l)), a signal-to-noise
measure of the change (‖Δ‖/√n is its RMS, so the score is √(1 + mean²/var)). Each round only the
k layers with the highest scores are trained and uploaded by every sampled client; the others
stay as they are that round. Round 0 trains every layer. A layer that did not train keeps its
last score. [recon] where the paper's text did not pin it down (docs/methods.md): k = 25% of
the layers by default (setting `k`), the aggregated update as the source of Δ, highest scores first,
ties to the lower layer. Clients download the whole model and upload only the selected layers.
Each round's layers are recorded in the History (`trained_layers`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..nets.qkv import param_groups
from .base import Method
from .settings import Settings, setting

__all__ = ["FedTLU", "layer_of_parameters"]

_BLOCK = re.compile(r"^(?:blocks|layers|stages\.\d+\.blocks)\.(\d+)\.")


def layer_of_parameters(model, flat) -> tuple[torch.Tensor, int]:
    """(layer index of every flat entry, number of layers): 0 the embedding, 1..B the blocks, B+1 the head
    and everything after the last block. A ValueError if the model has no numbered blocks."""
    groups = {n: g for g, names in param_groups(model).items() for n in names}
    blocks = {n: int(m.group(1)) for n in flat.param_range if (m := _BLOCK.match(n))}
    if not blocks:
        raise ValueError(f"FedTLU needs a model with numbered transformer blocks (blocks.<i>.*); "
                         f"{type(model).__name__} has none")
    n_blocks = max(blocks.values()) + 1
    layer = torch.empty(flat.numel, dtype=torch.long, device=flat.data.device)
    for name, (a, b) in flat.param_range.items():
        layer[a:b] = blocks[name] + 1 if name in blocks else 0 if groups[name] == "embed" else n_blocks + 1
    return layer, n_blocks + 2


@dataclass(frozen=True)
class FedTLUSettings(Settings):
    prefix: ClassVar[str] = "tlu"
    k: int | None = setting(None, "layers trained per round (None: 25% of the layers, at least 1)", lo=1)


class FedTLU(Method):
    """FedAvg where each round trains only the k highest-scoring layers."""

    Settings = FedTLUSettings

    # its mask is the server's (from the aggregated updates' scores): Method.to_client sends it

    def setup(self, setup) -> None:
        super().setup(setup)
        self.layer, self.n_layers = layer_of_parameters(setup.model, setup.flat)
        k = self.settings.k if self.settings.k is not None else max(1, round(0.25 * self.n_layers))
        if not 1 <= k <= self.n_layers:
            raise ValueError(f"method_args['k'] of {self.name!r} must be between 1 and the model's {self.n_layers} "
                             f"layers (embedding, {self.n_layers - 2} blocks, head); got {k}")
        self.k = k
        self.ranges = [torch.nonzero(self.layer == i).flatten() for i in range(self.n_layers)]
        self.scores = torch.full((self.n_layers,), math.nan)
        self.selected: list[int] = list(range(self.n_layers))
        self.mask = None

    def begin_round(self, r: int, sampled: list[int]) -> None:
        super().begin_round(r, sampled)
        if torch.isnan(self.scores).any():  # round 0 (or a layer never scored): every layer
            self.selected, self.mask = list(range(self.n_layers)), None
            return
        order = sorted(range(self.n_layers), key=lambda i: (-float(self.scores[i]), i))
        self.selected = sorted(order[:self.k])
        chosen = torch.tensor(self.selected, device=self.layer.device)
        self.mask = torch.isin(self.layer, chosen).to(self.s.flat.data.dtype)

    def client_mask(self, r: int, cid: int) -> torch.Tensor | None:
        return self.mask

    def client_bytes(self, r: int, cid: int, payload: int, trainable: int) -> tuple[int, int]:
        f = self.local.exchange_factor
        return f * trainable, f * payload  # the whole model down, the selected layers up

    def server_update(self, r, x, acc, mask, sampled) -> None:
        super().server_update(r, x, acc, mask, sampled)
        for i in self.selected:
            d = acc[self.ranges[i]]
            std = d.std(unbiased=False)
            if d.numel() and std > 0:
                self.scores[i] = float(d.norm() / (math.sqrt(d.numel()) * std))

    def on_round_end(self, r: int, row: dict, history) -> bool | None:
        row["trained_layers"] = list(self.selected)
        return super().on_round_end(r, row, history)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "tlu_scores": self.scores.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.scores = state["tlu_scores"].cpu().clone()
