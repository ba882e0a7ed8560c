"""A round you can follow: which fedfrozen modules one FedFrozen round of the sequential engine runs, and which of
them direct it (docs/engines.md, "One round, as messages", names them all)."""

import sys
from pathlib import Path

import pytest
from conftest import tiny_config

import fedfrozen as ff

# the modules that direct a round: every call from one fedfrozen module into another starts in one of these
DIRECTORS = ("fedfrozen.engine.loop", "fedfrozen.engine.round", "fedfrozen.engine.server", "fedfrozen.engine.clients",
             "fedfrozen.engine.metrics", "fedfrozen.engine.local", "fedfrozen.methods.base")
ENGINES_DOC = Path(__file__).resolve().parents[1] / "docs" / "engines.md"


def _module(frame) -> str:
    return frame.f_globals.get("__name__", "")


def trace_round(cfg, r: int) -> tuple[set, set]:
    """(the fedfrozen modules that run code, the (caller, callee) module pairs) between the end of round r-1 and the
    end of round r of `fedfrozen.run(cfg)`: one whole round of the loop, its callbacks included. A caller is the
    nearest fedfrozen frame below the call (through torch's: the model's forward is called from local.train)."""
    ran, calls = set(), set()

    def profile(frame, event, arg):
        if event != "call" or not _module(frame).startswith("fedfrozen"):
            return
        ran.add(_module(frame))
        below = frame.f_back
        while below is not None and not _module(below).startswith("fedfrozen"):
            below = below.f_back
        if below is not None and _module(below) != _module(frame):
            calls.add((_module(below), _module(frame)))

    def trace(rr, row, hist):
        sys.setprofile(profile if rr == r - 1 else None)

    try:
        ff.run(cfg, progress=False, callbacks=[trace])
    finally:
        sys.setprofile(None)
    return ran, calls


@pytest.mark.parametrize("r", [1, 2], ids=["the switch round", "a stage-2 round"])
def test_one_fedfrozen_round_is_directed_by_the_round_s_modules(r):
    cfg = tiny_config(method="fedfrozen", rounds=4, warmup_rounds=1, clients_per_round=2)
    ran, calls = trace_round(cfg, r)
    directors = {caller for caller, _ in calls}
    assert directors <= set(DIRECTORS), sorted(directors)
    # the round's path: loop -> round.play -> server (open, instructions, receive, finish) and clients -> local steps
    assert {("fedfrozen.engine.loop", "fedfrozen.engine.round"), ("fedfrozen.engine.round", "fedfrozen.engine.server"),
            ("fedfrozen.engine.clients", "fedfrozen.engine.local"),
            ("fedfrozen.engine.server", "fedfrozen.methods.base")} <= calls
    assert "fedfrozen.methods.freezing" in ran  # FedFrozen's own schedule answered (the trace is of a real round)
    # every module the round runs is named in docs/engines.md, the directors and the rest
    doc = ENGINES_DOC.read_text()
    assert [m for m in sorted(ran) if f"`{m}`" not in doc] == []
