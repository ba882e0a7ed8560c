"""`History`: one row per round, with the run's config and environment."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .io import atomic_write

__all__ = ["History", "WALL_CLOCK_COLUMNS"]

WALL_CLOCK_COLUMNS = ("seconds",)


def _clean(v):
    """JSON-safe scalar: NaN becomes None, tensors and numpy scalars become floats."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else v
    return v


LATE_EVALUATIONS = 3  # evaluations averaged by History.late / late_accuracy


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

    def late(self, key: str, k: int = LATE_EVALUATIONS, default=None):
        """The mean of the last `k` non-missing values of column `key` (fewer if the run has fewer): a run's
        level at its end, less sensitive than one evaluation to which clients the last rounds sampled."""
        values = [row[key] for row in self.rows if row.get(key) is not None][-k:]
        return sum(values) / len(values) if values else default

    @property
    def final_accuracy(self) -> float | None:
        return self.last("test_acc")

    @property
    def late_accuracy(self) -> float | None:
        """Test accuracy averaged over the last LATE_EVALUATIONS evaluations (`late("test_acc")`)."""
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
