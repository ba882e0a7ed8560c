"""Freezing schedules: which parameter groups every client leaves untouched, from which round.

A schedule composes with any base method (FedFrozen = FedAvg + `warmup`; FedFrozen+FedProx =
FedProx + `warmup`). `frozen_at(r)` gives the groups frozen in round r; `on_round_end` sees
each round's History row, so a schedule may decide from what the federation measured.
- none:   never freeze.
- warmup: freeze the groups from round T0 = cfg.warmup_rounds on (FedFrozen's stage 2;
          T0 >= rounds never freezes).
- start:  freeze them from round 0 (e.g. a random kernel kept fixed).
"""

from __future__ import annotations

__all__ = ["FreezeSchedule", "AtWarmup", "FromStart", "FREEZE_SCHEDULES"]


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


FREEZE_SCHEDULES = {"none": FreezeSchedule, "warmup": AtWarmup, "start": FromStart}
