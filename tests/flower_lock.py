"""Test files that start Flower or Ray run one at a time across the pytest-xdist workers of one session.

Under `--dist loadfile` tests/test_flower.py, tests/test_cluster.py and notebook 08 may land on different workers;
each starts Ray (the first and last under a Flower federation), and two of those at once on a 2-core machine run
each other into their timeouts. A worker takes an exclusive lock (a file of this test session, in the temp folder)
before the first item of such a file and lets go after its last one; the kernel releases it if the worker dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path

_held = None  # the open lock file while this worker holds the lock


def starts_flower(path) -> bool:
    path = Path(path)
    return path.name in ("test_flower.py", "test_cluster.py") or (path.suffix == ".ipynb" and "flower" in path.stem)


def lock_path() -> Path:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getpid()))
    return Path(tempfile.gettempdir()) / f"fedfrozen-pytest-flower-{run}.lock"


@contextlib.contextmanager
def held_for(item, nextitem):
    """Hold the lock around `item` when its file starts Flower (on an xdist worker); release after the file's last
    item."""
    global _held
    if not os.environ.get("PYTEST_XDIST_WORKER") or not starts_flower(item.path):
        yield
        return
    if _held is None:
        _held = open(lock_path(), "a")  # kept open across the file's items
        fcntl.flock(_held, fcntl.LOCK_EX)
    try:
        yield
    finally:
        if nextitem is None or Path(nextitem.path) != Path(item.path):
            fcntl.flock(_held, fcntl.LOCK_UN)
            _held.close()
            _held = None
