"""Checkpoints of a run: everything the loop needs to continue at a round, written atomically, and read back with
clear errors (another config, a damaged or cut-short file)."""

from __future__ import annotations

import torch

from ..base.io import atomic_write
from .config import identity, stored_form

__all__ = ["save_checkpoint", "load_checkpoint", "CheckpointError"]


def save_checkpoint(path, cfg, next_round, x_global, method, hist, received_frozen, client=None) -> None:
    """Everything the loop needs to continue at `next_round` (atomic write): the method's server half and, in the
    loop, its clients' half (`client`: every client's state; on Flower each node keeps its own).

    No RNG state is stored: every random choice after setup is drawn from a generator seeded
    by (seed, round, client), so the rounds after a resume draw what they would have drawn.
    """
    state = {"round": next_round, "x": x_global.cpu(), "method": method.state_dict(), "rows": hist.rows,
             "diverged": hist.diverged, "received_frozen": sorted(received_frozen), "config": cfg.to_dict()}
    if client is not None:
        state["client_method"] = client.state_dict()
    atomic_write(path, lambda tmp: torch.save(state, tmp))


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from (truncated, empty, missing keys, another config, cut short)."""


def load_checkpoint(path, cfg, x_global, method, hist, received_frozen, client=None) -> int:
    """Load a checkpoint of `cfg` written by save_checkpoint into the global weights, the method's halves (`client`:
    the clients' half, given its own state, or the one method state of a checkpoint written before the halves), the
    History and the set of clients holding the frozen block; the round to continue at. CheckpointError if it
    cannot be used."""
    try:
        state = torch.load(path, map_location=x_global.device, weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds for a damaged file
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(e).__name__}: {str(e)[:200]}); delete its "
                              f"folder to start over") from None
    keys = ("round", "x", "method", "rows", "diverged", "received_frozen", "config")
    if not isinstance(state, dict) or any(k not in state for k in keys):
        raise CheckpointError(f"checkpoint {path} is not a fedfrozen checkpoint (missing "
                              f"{[k for k in keys if not isinstance(state, dict) or k not in state]})")
    cfg_d = identity(cfg.to_dict())
    stored = identity(stored_form(state["config"]))
    if stored != cfg_d:
        diff = sorted(k for k in cfg_d if stored.get(k) != cfg_d[k])
        raise CheckpointError(f"checkpoint {path} was written by a different config (fields {diff})")
    start, rows = state["round"], state["rows"]
    if not isinstance(start, int) or [r.get("round") for r in rows] != list(range(start)) \
            or tuple(state["x"].shape) != tuple(x_global.shape):
        raise CheckpointError(f"checkpoint {path} is inconsistent: next round {start!r}, {len(rows)} rows, "
                              f"weights of shape {tuple(state['x'].shape)} for a model of {x_global.numel()}")
    try:
        method.load_state_dict(state["method"])
        if client is not None:
            client.load_state_dict(state.get("client_method", state["method"]))
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint {path}: the method state does not load ({type(e).__name__}: {e})") from None
    x_global.copy_(state["x"])
    hist.rows = list(rows)
    hist.diverged = state["diverged"]
    received_frozen.update(state["received_frozen"])
    return start
