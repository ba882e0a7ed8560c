"""Freezing schedules: which parameter groups every client leaves untouched, from which round.

A schedule composes with any base method (FedFrozen = FedAvg + `warmup`; FedFrozen+FedProx =
FedProx + `warmup`). `frozen_at(r)` gives the groups frozen in round r; `on_round_end` sees
each round's History row, so a schedule may decide from what the federation measured.
- none:   never freeze.
- warmup: freeze the groups from round T0 = cfg.warmup_rounds on (FedFrozen's stage 2;
          T0 >= rounds never freezes).
- start:  freeze them from round 0 (e.g. a random kernel kept fixed).
- kernel_plateau: freeze once the relative kernel change has stayed below `freeze_tau` for
          `freeze_patience` consecutive rounds (from the next round on).
- drift_ratio: freeze once the query/key block's client drift has exceeded `freeze_rho` times the
          value block's for `freeze_patience` consecutive rounds.
- progressive: freeze the query/key weights layer by layer from the input up: the lowest layer still
          training freezes once its own relative kernel change has stayed below `freeze_tau` for
          `freeze_patience` rounds; while some layers train, the frozen layers' Q/K entries are masked
          for every client (client_mask); when the last layer freezes, the whole group freezes (a
          stage switch, as at FedFrozen's T0). Rows record `layers_frozen_from` (the round from which
          each frozen layer stopped training).
The adaptive schedules decide from each round's History row (on_round_end), record the decided
first frozen round as `frozen_from` in every later row, and keep their counters in state_dict so
that a resumed run decides as the uninterrupted one did. Their default thresholds are provisional:
they are to be chosen once on the linear-attention simulator (the where-freezing-pays issue).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from .settings import Settings, component, setting

__all__ = ["freeze_round", "FreezeSchedule", "FreezeSettings", "AtWarmup", "FromStart", "KernelPlateau", "DriftRatio",
           "Progressive", "FREEZE_SCHEDULES"]


@component
@dataclass(frozen=True)
class FreezeSettings(Settings):
    """The adaptive freeze schedules' thresholds (Config(freeze_tau=...), --freeze-tau, ...)."""

    prefix: ClassVar[str] = "freeze"
    tau: float = setting(0.01, "kernel_plateau: relative kernel change below which a round counts as a plateau (inf: "
                         "every round)", lo=0, inf=True)
    rho: float = setting(4.0, "drift_ratio: freeze when qk drift exceeds rho times v drift (chosen on the simulator; "
                         "inf: never)", lo=0, inf=True)
    patience: int = setting(3, "adaptive schedules: consecutive rounds the condition must hold", lo=1)


class FreezeSchedule:
    """Never freeze (the base: every other schedule overrides `freeze_at` or `frozen_at`)."""

    name = "none"

    def __init__(self, cfg, groups: tuple):
        self.cfg = cfg
        self.groups = tuple(groups)
        self.freeze_at: int | None = None  # first frozen round, None while nothing is frozen

    def frozen_at(self, r: int) -> tuple:
        """The groups frozen (for every client) in round r."""
        if self.freeze_at is None or r < self.freeze_at:
            return ()
        return self.groups

    def setup(self, setup) -> None:
        """Once before round 0, with the loop's Setup (model, flat buffers)."""

    def client_mask(self, r: int):
        """A 0/1 mask over the flat parameters every client trains in round r (None: no finer mask)."""
        return None

    def on_round_end(self, r: int, row: dict, history) -> None:
        """Called after every round with its History row."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict returned."""


def freeze_round(cfg) -> int | None:
    """T0, the round FedFrozen's stage 2 starts at: cfg.warmup_rounds, or None when it is not a round of the run
    (T0 >= rounds: never frozen). The one place that says what T0 means."""
    return cfg.warmup_rounds if cfg.warmup_rounds < cfg.rounds else None


class AtWarmup(FreezeSchedule):
    name = "warmup"

    def __init__(self, cfg, groups: tuple):
        super().__init__(cfg, groups)
        self.freeze_at = freeze_round(cfg)


class FromStart(FreezeSchedule):
    name = "start"

    def __init__(self, cfg, groups: tuple):
        super().__init__(cfg, groups)
        self.freeze_at = 0


class _Adaptive(FreezeSchedule):
    """Freeze after `freeze_patience` consecutive rounds on which the subclass's `fires(row)` holds."""

    def __init__(self, cfg, groups: tuple):
        super().__init__(cfg, groups)
        self.streak = 0

    def on_round_end(self, r: int, row: dict, history) -> None:
        if self.freeze_at is None:
            self.streak = self.streak + 1 if self.fires(row) else 0
            if self.streak >= self.cfg.freeze_patience and r + 1 < self.cfg.rounds:
                self.freeze_at = r + 1
        row["frozen_from"] = self.freeze_at

    def state_dict(self) -> dict:
        return {"streak": self.streak, "freeze_at": -1 if self.freeze_at is None else self.freeze_at}

    def load_state_dict(self, state: dict) -> None:
        self.streak = int(state["streak"])
        self.freeze_at = None if int(state["freeze_at"]) < 0 else int(state["freeze_at"])


class KernelPlateau(_Adaptive):
    name = "kernel_plateau"

    def fires(self, row: dict) -> bool:
        change = row.get("kernel_change")
        return change is not None and change < self.cfg.freeze_tau


class DriftRatio(_Adaptive):
    name = "drift_ratio"

    def fires(self, row: dict) -> bool:
        qk, v = row.get("drift_qk"), row.get("drift_v")
        if qk is None or v is None or math.isinf(self.cfg.freeze_rho):
            return False
        return qk > self.cfg.freeze_rho * v


class Progressive(FreezeSchedule):
    name = "progressive"

    def __init__(self, cfg, groups: tuple):
        super().__init__(cfg, groups)
        if tuple(groups) != ("qk",):
            raise ValueError(f"freeze_schedule 'progressive' freezes the query/key block layer by layer; "
                             f"freeze must be ('qk',), got {tuple(groups)!r}")
        self.layer_from: list[int] = []  # round from which layer l (0 = nearest the input) is frozen
        self.streak = 0
        self._mask = (None, None)  # (frozen layer count, mask)

    def setup(self, setup) -> None:
        from ..nets.qkv import SplitMultiheadAttention, SplitQKV

        self.flat = setup.flat
        names = {id(p): n for n, p in setup.model.named_parameters()}
        self.layer_ranges = []  # per layer, the flat ranges of its q and k weights and biases
        for m in setup.model.modules():
            if isinstance(m, (SplitQKV, SplitMultiheadAttention)):
                params = [*m.q.parameters(), *m.k.parameters()]
                self.layer_ranges.append([setup.flat.param_range[names[id(p)]] for p in params])

    def frozen_layers(self, r: int) -> int:
        return sum(1 for f in self.layer_from if f <= r)

    def client_mask(self, r: int):
        k = self.frozen_layers(r)
        if k == 0 or self.freeze_at is not None and r >= self.freeze_at:
            return None
        if self._mask[0] != k:
            mask = torch.ones_like(self.flat.data)
            for ranges in self.layer_ranges[:k]:
                for a, b in ranges:
                    mask[a:b] = 0.0
            self._mask = (k, mask)
        return self._mask[1]

    def on_round_end(self, r: int, row: dict, history) -> None:
        changes = row.get("kernel_change_layers") or []
        layer = len(self.layer_from)
        if layer < len(changes) and r + 1 < self.cfg.rounds:
            change = changes[layer]
            self.streak = self.streak + 1 if change is not None and change < self.cfg.freeze_tau else 0
            if self.streak >= self.cfg.freeze_patience:
                self.layer_from.append(r + 1)
                self.streak = 0
                if len(self.layer_from) == len(changes):
                    self.freeze_at = r + 1
        row["layers_frozen_from"] = list(self.layer_from)
        row["frozen_from"] = self.freeze_at

    def state_dict(self) -> dict:
        return {"streak": self.streak, "layer_from": list(self.layer_from),
                "freeze_at": -1 if self.freeze_at is None else self.freeze_at}

    def load_state_dict(self, state: dict) -> None:
        self.streak = int(state["streak"])
        self.layer_from = [int(v) for v in state["layer_from"]]
        self.freeze_at = None if int(state["freeze_at"]) < 0 else int(state["freeze_at"])


FREEZE_SCHEDULES = {"none": FreezeSchedule, "warmup": AtWarmup, "start": FromStart,
                    "kernel_plateau": KernelPlateau, "drift_ratio": DriftRatio, "progressive": Progressive}
