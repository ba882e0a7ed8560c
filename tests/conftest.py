import os
from pathlib import Path

import pytest

import fedfrozen as ff

TINY = dict(embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0)


@pytest.fixture(scope="session")
def digits():
    return ff.data.load("digits")


def tiny_config(**kw):
    """A seconds-long run on digits: a 2-block 16-wide ViT, 4 clients, 2 local steps."""
    base = dict(dataset="digits", model="vit_digits", model_kwargs=TINY, n_clients=4, rounds=3,
                local_steps=2, batch_size=16, partition="dirichlet", alpha=0.5, warmup_rounds=1,
                eval_every=1, seed=0, device="cpu")
    base.update(kw)
    return ff.Config(**base)


@pytest.fixture
def setups(monkeypatch):
    """Every Setup (resident model, flat parameters, client data) built by runs in this test."""
    from fedfrozen import loop

    built = []
    original = loop.prepare

    def spy(cfg, train=None, test=None):
        built.append(original(cfg, train, test))
        return built[-1]

    monkeypatch.setattr(loop, "prepare", spy)
    return built


def resumed(cfg, tmp_path, stop_after: int = 1):
    """The History of `cfg` stopped by a callback after round `stop_after` (checkpointed), then resumed."""
    ckpt = tmp_path / "resume.pt"
    ff.run(cfg, callbacks=[lambda r, row, h: r == stop_after], checkpoint=ckpt, progress=False)
    return ff.run(cfg, resume_from=ckpt, progress=False)


@pytest.fixture(autouse=True)
def _threads_as_they_were(monkeypatch):
    """`fedfrozen.cli.main` sets FEDFROZEN_THREADS (and runs then set torch's threads): undone after each test."""
    import torch

    from fedfrozen.io import THREADS_ENV

    monkeypatch.setenv(THREADS_ENV, "")  # teardown restores the variable as it was before the test
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


# Settings of a test session, shared by tests/ and notebooks/ (nbval).
#
# The README's test command runs on two pytest-xdist workers (`-n 2 --dist loadgroup`). Each worker then runs torch
# on one thread (two workers of one thread each on a 2-core machine, not two of two threads fighting for the cores:
# oversubscribed, torch's threads spin against each other), and so do the notebook kernels nbval starts. Tests that
# must not run at once share a group: every cell of one notebook (they run in order in one kernel), and everything
# that starts Flower or Ray (tests/test_flower.py and notebook 08) in one group.
# (Collection hooks of this file see every item of the session, the notebooks' cells included. `pytest notebooks
# -n 2` without tests/ does not load this file, and a second conftest.py under notebooks/ would shadow this one's
# `from conftest import ...`: run notebooks alone on one worker.)


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("FEDFROZEN_THREADS", "1")
        import torch

        torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        if path.suffix == ".ipynb":
            group = "flower" if "flower" in path.stem else path.stem
        elif path.name == "test_flower.py":
            group = "flower"
        else:
            continue
        item.add_marker(pytest.mark.xdist_group(group))
