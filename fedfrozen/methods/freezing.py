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
The adaptive schedules decide from each round's History row (on_round_end), record the decided
first frozen round as `frozen_from` in every later row, and keep their counters in state_dict so
that a resumed run decides as the uninterrupted one did. Their default thresholds are provisional:
they are to be chosen once on the linear-attention simulator (the where-freezing-pays issue).
"""

from __future__ import annotations

import math

__all__ = ["FreezeSchedule", "AtWarmup", "FromStart", "KernelPlateau", "DriftRatio", "FREEZE_SCHEDULES"]


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

    def on_round_end(self, r: int, row: dict, history) -> None:
        """Called after every round with its History row."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict returned."""


class AtWarmup(FreezeSchedule):
    name = "warmup"

    def __init__(self, cfg, groups: tuple):
        super().__init__(cfg, groups)
        self.freeze_at = cfg.warmup_rounds if cfg.warmup_rounds < cfg.rounds else None


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


FREEZE_SCHEDULES = {"none": FreezeSchedule, "warmup": AtWarmup, "start": FromStart,
                    "kernel_plateau": KernelPlateau, "drift_ratio": DriftRatio}
