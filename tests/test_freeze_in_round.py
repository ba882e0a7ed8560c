"""The stage's freeze is the round's: whatever a method's server step does, the entries the stage freezes come out of
the round as they went in (fedfrozen.engine.server.Round.close), and no method multiplies by the stage mask itself."""

from __future__ import annotations

import re
from pathlib import Path

import torch

import fedfrozen as ff
from fedfrozen import loop, methods
from fedfrozen.engine.clients import LocalTraining
from fedfrozen.engine.round import play
from fedfrozen.methods import fedopt

ROOT = Path(__file__).resolve().parents[1]


def _rounds(cfg, n):
    method, client = methods.build(cfg), methods.build(cfg)  # the server's half, the clients'
    s, rnd, hist, _ = loop.start_up(cfg, method, client=client)
    clients = LocalTraining(s, client, False)
    seen = [rnd.x.clone()]
    for r in range(n):
        play(rnd, r, hist, lambda plan, instructions: (clients.replies(instructions), {}))
        seen.append(rnd.x.clone())
    return s, seen


def test_a_server_step_that_moves_everything_leaves_the_frozen_block(monkeypatch):
    # a server step that moves every entry, frozen or not (FedAvg's, plus a constant)
    monkeypatch.setitem(fedopt.SERVER_STEPS, "avg", lambda buf, delta, mask, cfg, lr, n, N: delta * lr + 1e-2)
    cfg = ff.Config(dataset="digits", model="vit_digits", model_kwargs=dict(embed_dim=16, depth=2, num_heads=2),
                    n_clients=4, clients_per_round=2, rounds=4, local_steps=2, method="fedfrozen", warmup_rounds=2,
                    seed=0, device="cpu")
    s, seen = _rounds(cfg, 4)
    qk, v = s.flat.group_slice("qk"), s.flat.group_slice("v")
    assert not torch.equal(seen[1][qk], seen[0][qk])  # stage 1: Q/K trains
    assert torch.equal(seen[3][qk], seen[2][qk]) and torch.equal(seen[4][qk], seen[2][qk])  # stage 2: bit for bit
    assert (seen[4][v] - seen[3][v]).abs().min() > 0  # the rest moves, the constant included


def test_no_method_multiplies_by_the_stage_mask():
    """The server-side hooks (server_update, end_round, the server step functions) take the stage mask but do not
    multiply by it; a client's own mask (after_client, before_client: SCAFFOLD's and FedDyn's client state) stays."""
    text = "\n".join(p.read_text() for p in sorted((ROOT / "fedfrozen" / "methods").glob("*.py")))
    server_side = re.findall(r"def (?:server_update|end_round|\w+_step)\(.*?(?=\n    def |\ndef |\nclass |\Z)", text,
                             flags=re.S)
    assert server_side
    for body in server_side:
        assert not re.search(r"\*\s*mask\b|mul\w*\(\s*\w+,\s*mask|\.mul_\(mask\)", body), body[:200]
