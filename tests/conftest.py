import os

import flower_lock
import notebook_order
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

    from fedfrozen.base.io import THREADS_ENV

    monkeypatch.setenv(THREADS_ENV, "")  # teardown restores the variable as it was before the test
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


# Settings of a test session, shared by tests/ and notebooks/ (nbval).
#
# The README's test command runs on two pytest-xdist workers (`-n 2 --dist loadfile`). Each worker then runs torch
# on one thread (two workers of one thread each on a 2-core machine, not two of two threads fighting for the cores:
# oversubscribed, torch's threads spin against each other), and so do the notebook kernels nbval starts.
#
# `--dist loadfile` sends every item of one file to one worker, in order: a notebook's cells run in one kernel,
# each after the ones before it. (Until pytest 8 this file marked a notebook's cells with one `xdist_group` for
# `--dist loadgroup`; under pytest 9 those marks no longer reach xdist's scheduler and the cells were split across
# the workers. The file is xdist's own unit of scheduling and needs no mark.) `notebook_order` checks it on every
# cell: a cell whose predecessors did not run in its worker fails with a message naming the cause.
# Everything that starts Flower or Ray (tests/test_flower.py and notebook 08) must not run at once: a lock file of
# this test session serialises those files across the workers (`flower_lock`).
# (`pytest notebooks -n 2` without tests/ does not load this file, and a second conftest.py under notebooks/ would
# shadow this one's `from conftest import ...`: run notebooks alone on one worker.)


class SessionChecks:
    """Hooks for every item of the session: a conftest's own run-time hooks see only the items below its folder,
    and the notebooks are not below tests/ (registered as a plugin, they see all)."""

    def pytest_collection_finish(self, session):
        notebook_order.collected(session.items)

    def pytest_runtest_setup(self, item):
        notebook_order.check(item)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        with flower_lock.held_for(item, nextitem):
            yield


def pytest_configure(config):
    config.pluginmanager.register(SessionChecks(), "fedfrozen-session-checks")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("FEDFROZEN_THREADS", "1")
        import torch

        torch.set_num_threads(1)
