"""The session checks that keep the README's test command honest under pytest-xdist (tests/conftest.py)."""

import fcntl
from pathlib import Path
from types import SimpleNamespace

import flower_lock
import pytest
from notebook_order import NotebookOrder


def cell(notebook: str, k: int):
    return SimpleNamespace(path=Path(f"notebooks/{notebook}.ipynb"), nodeid=f"notebooks/{notebook}.ipynb::Cell {k}")


def test_cells_run_in_order_pass_and_notebooks_may_interleave():
    a, b = [cell("02_a", k) for k in range(3)], [cell("03_b", k) for k in range(2)]
    order = NotebookOrder()
    order.collected([a[0], a[1], b[0], a[2], b[1], SimpleNamespace(path=Path("tests/test_x.py"), nodeid="t")])
    for item in (a[0], b[0], a[1], b[1], a[2]):
        order.check(item)


def test_a_cell_whose_predecessor_ran_elsewhere_fails_naming_it(monkeypatch):
    """What pytest 9 with `--dist loadgroup` did: cells 0 and 1 on one worker, cell 2 on this one."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    cells = [cell("02_a", k) for k in range(3)]
    order = NotebookOrder()
    order.collected(cells)
    with pytest.raises(pytest.fail.Exception, match=r"Cell 2 runs in gw1 without .*Cell 1: the cells of one "
                                                    r"notebook were split across workers"):
        order.check(cells[2])


def test_a_selected_cell_alone_is_not_a_split():
    """`pytest 'notebooks/02_a.ipynb::Cell 2'` collects only that cell: nothing should have run before it."""
    order = NotebookOrder()
    order.collected([cell("02_a", 2)])
    order.check(cell("02_a", 2))


def test_a_flower_file_holds_the_sessions_lock_from_its_first_item_to_its_last(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", f"test-{tmp_path.name}")
    first, last = (SimpleNamespace(path=Path("tests/test_flower.py")) for _ in range(2))
    other = SimpleNamespace(path=Path("tests/test_loop.py"))

    def locked() -> bool:
        with open(flower_lock.lock_path(), "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
            return False

    with flower_lock.held_for(first, nextitem=last):
        assert locked()
    assert locked()  # still held between the items of one file
    with flower_lock.held_for(last, nextitem=other):
        assert locked()
    assert not locked()
    with flower_lock.held_for(other, nextitem=None):
        assert not locked()  # other files never take it
    flower_lock.lock_path().unlink()


def test_notebook_08_and_the_flower_tests_share_the_lock():
    assert flower_lock.starts_flower("notebooks/08_flower_deployment.ipynb")
    assert flower_lock.starts_flower("tests/test_flower.py")
    assert not flower_lock.starts_flower("notebooks/03_main_results.ipynb")
