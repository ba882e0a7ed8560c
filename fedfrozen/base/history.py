"""`History`: one row per round, with the run's config and environment."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .io import atomic_write

__all__ = ["History", "WALL_CLOCK_COLUMNS", "LATE_EVALUATIONS", "oscillation"]

WALL_CLOCK_COLUMNS = ("seconds", "client_seconds")  # (client_seconds: a Flower round's ClientApps, summed)


def _clean(v):
    """JSON-safe scalar: NaN becomes None, tensors and numpy scalars become floats."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else v
    return v


LATE_EVALUATIONS = 3  # evaluations averaged by History.late / late_accuracy when a run has no late window


def oscillation(values) -> float:
    """How much a curve swings from round to round, not how much it trends (docs/claims.md, C1 stability).

    A least-squares line is removed from the values (consecutive rounds) and the measure is half the mean absolute
    change of what remains from one round to the next: 0 for a straight or smoothly bending curve, A for a curve
    that alternates A above and below its trend every round. NaN with fewer than 3 values."""
    y = [float(v) for v in values]
    k = len(y)
    if k < 3:
        return math.nan
    t_mean, y_mean = (k - 1) / 2, sum(y) / k
    slope = sum((t - t_mean) * (v - y_mean) for t, v in enumerate(y)) / sum((t - t_mean) ** 2 for t in range(k))
    resid = [v - slope * t for t, v in enumerate(y)]  # the intercept cancels in the differences
    return sum(abs(b - a) for a, b in zip(resid, resid[1:])) / (2 * (k - 1))


class History:
    """Per-round metrics of a run (`rows`), its config, environment and divergence flag."""

    def __init__(self, rows=None, config=None, env=None, diverged=None):
        self.rows: list[dict] = list(rows or [])
        self.config: dict = dict(config or {})
        self.env: dict = dict(env or {})
        self.diverged: dict | None = diverged  # {"round": r, "client": i} when a loss went non-finite
        self.cached = False  # set by experiments.run_or_load on a cache hit
        self.resumed_from = None  # set by experiments.run_or_load when it continued an interrupted run

    def append(self, row: dict) -> None:
        self.rows.append({k: _clean(v) for k, v in row.items()})

    def __len__(self) -> int:
        return len(self.rows)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows)

    def last(self, key: str, default=None):
        """The last non-missing value of column `key`."""
        for row in reversed(self.rows):
            if row.get(key) is not None:
                return row[key]
        return default

    def window(self, key: str) -> list:
        """The non-missing values of column `key` in the run's late window: every round of the last
        `eval_window` rounds when its config has one (evaluated every round there), else the last
        LATE_EVALUATIONS values."""
        window = int(self.config.get("eval_window") or 0)
        if window:
            rounds = int(self.config.get("rounds") or len(self.rows))
            return [row[key] for row in self.rows if row.get(key) is not None and row["round"] >= rounds - window]
        return [row[key] for row in self.rows if row.get(key) is not None][-LATE_EVALUATIONS:]

    def late(self, key: str, k: int | None = None, default=None):
        """The mean of column `key` over the late window (`window`), or over its last `k` non-missing values
        when k is given (fewer if the run has fewer): a run's level at its end, less sensitive than one
        evaluation to which clients the last rounds sampled."""
        values = self.window(key) if k is None else [row[key] for row in self.rows if row.get(key) is not None][-k:]
        return sum(values) / len(values) if values else default

    def oscillation(self, key: str = "test_acc") -> float:
        """`oscillation` of column `key` over the late window; NaN unless the window holds consecutive rounds
        (a config with eval_window >= 3, or eval_every 1)."""
        consecutive = int(self.config.get("eval_window") or 0) >= 3 or int(self.config.get("eval_every") or 1) == 1
        return oscillation(self.window(key)) if consecutive else math.nan

    @property
    def final_accuracy(self) -> float | None:
        return self.last("test_acc")

    @property
    def late_accuracy(self) -> float | None:
        """Test accuracy averaged over the late window (`late("test_acc")`)."""
        return self.late("test_acc")

    def without_wall_clock(self) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in WALL_CLOCK_COLUMNS} for r in self.rows]

    def same_as(self, other: "History") -> bool:
        """Equal metrics, ignoring wall-clock columns."""
        return (self.without_wall_clock() == other.without_wall_clock()
                and self.diverged == other.diverged)

    def to_dict(self) -> dict:
        return {"rows": self.rows, "config": self.config, "env": self.env, "diverged": self.diverged}

    @classmethod
    def from_dict(cls, d: dict) -> "History":
        return cls(d["rows"], d.get("config"), d.get("env"), d.get("diverged"))

    def save(self, path) -> None:
        text = json.dumps(self.to_dict(), indent=1)
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))

    @classmethod
    def load(cls, path) -> "History":
        """Read a History saved by `save`; a ValueError naming the file if it is not one (truncated, corrupt)."""
        try:
            with open(path) as f:
                return cls.from_dict(json.load(f))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path} is not a readable History ({type(e).__name__}: {e})") from None

    def __repr__(self) -> str:
        acc = self.final_accuracy
        acc_s = f"{acc:.4f}" if acc is not None else "n/a"
        return (f"History({len(self.rows)} rounds, method={self.config.get('method')!r}, "
                f"final test_acc={acc_s}{', DIVERGED' if self.diverged else ''})")
