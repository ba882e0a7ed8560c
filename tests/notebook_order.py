"""Every cell of a notebook runs in one kernel, after the cells before it: a check on each nbval item.

nbval runs a notebook's cells as separate test items that share one kernel per worker. If a scheduler ever splits a
notebook's cells across pytest-xdist workers again (as `--dist loadgroup` did under pytest 9), a cell meets a
kernel that never ran the cells before it and fails with a `NameError` that says nothing of the cause. `check`
fails such a cell first, naming the cell that should have run before it in the same worker.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def is_cell(item) -> bool:
    return Path(item.path).suffix == ".ipynb"


class NotebookOrder:
    """The cells of the session (in collection order) and the ones this worker has run."""

    def __init__(self):
        self.previous: dict[str, str] = {}  # a cell's node id -> the node id of the cell before it, same notebook
        self.ran: set[str] = set()

    def collected(self, items) -> None:
        self.previous.clear()
        self.ran.clear()
        last: dict[Path, str] = {}
        for item in items:
            if is_cell(item):
                path = Path(item.path)
                if path in last:
                    self.previous[item.nodeid] = last[path]
                last[path] = item.nodeid

    def check(self, item) -> None:
        """Fail `item` when it is a notebook cell whose predecessor has not run in this process."""
        if not is_cell(item):
            return
        before = self.previous.get(item.nodeid)
        self.ran.add(item.nodeid)
        if before is not None and before not in self.ran:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "this process")
            pytest.fail(f"{item.nodeid} runs in {worker} without {before}: the cells of one notebook were split "
                        "across workers (run the tests with `--dist loadfile`, see tests/conftest.py)", pytrace=False)


ORDER = NotebookOrder()
collected = ORDER.collected
check = ORDER.check
