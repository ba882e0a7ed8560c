"""The federated round loop: one resident model, flat buffers, and the method's hooks.

One resident model: its parameters live in one flat buffer (fedfrozen.nets.flat). For each sampled
client the global weights are copied in (`copy_`), the client trains its local steps on
batches from its own seeded generator, and its weighted update is folded in place into the
round's accumulator. The server step then moves the trainable entries only. Everything that
differs between methods (participation, what trains, gradient terms, bytes, aggregation, the
server step, per-round decisions, state) is a hook of `fedfrozen.methods.Method`; when the
frozen groups change (FedFrozen's stage switch at T0) the local optimiser is rebuilt over the
trainable parameters and the method drops the old stage's state (docs/methods.md).

The round itself is `fedfrozen.engine.round`: `play`, its order written once (also what the Flower ServerApp runs),
over `Round` (the server's side, holding the method's server half) and `LocalTraining` (the clients' side, holding
the clients' half, either engine: an Instruction in, a Reply out; also what the Flower ClientApp runs); `run` below
is the loop over rounds, with its callbacks. What a run starts from (data, clients, the resident model) is
`fedfrozen.engine.setup`; its checkpoints are `fedfrozen.engine.checkpoint` (both re-exported here).
"""

from __future__ import annotations

import os
import time
import warnings

import torch

from .. import methods
from ..base.history import History
from ..base.io import environment, follow_threads
from ..base.progress import progress_bar
from . import batched
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .clients import LocalTraining
from .config import Config
from .metrics import evaluate, evaluate_round, round_metrics
from .round import play
from .server import Round, lr_at
from .setup import Setup, prepare, pretrain_on_public, split_training_data

__all__ = ["run", "start_up", "CheckpointError", "Config", "evaluate", "evaluate_round", "lr_at", "round_metrics",
           "prepare", "Setup", "split_training_data", "save_checkpoint"]

# --- the loop -----------------------------------------------------------------------------

def run(cfg: Config, *, callbacks=(), progress: bool = True, resume_from=None, checkpoint=None,
        checkpoint_every: int = 1, checkpoint_seconds: float = 0.0, train=None, test=None) -> History:
    """Train `cfg` federatedly and return its History.

    callbacks: functions `cb(round, row, history)` called after every round; one returning
    True stops the run (after a checkpoint, when one is being written).
    checkpoint: a file to keep a checkpoint in, written atomically at the end of every
    `checkpoint_every`-th round once `checkpoint_seconds` have passed since the last one (and when
    a callback stops the run). resume_from: a checkpoint of an earlier run of the same config;
    the resumed run's History equals the uninterrupted one's.
    train/test: Splits to use instead of loading `cfg.dataset` (user data; fedfrozen.inputs.data.from_tensors).
    """
    if not isinstance(cfg, Config):
        raise TypeError(f"run expects a fedfrozen.Config; got {type(cfg).__name__}")
    if (train is None) != (test is None):
        raise ValueError("pass both train and test Splits, or neither (then cfg.dataset is loaded)")
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be an integer >= 1; got {checkpoint_every!r}")
    if not checkpoint_seconds >= 0:
        raise ValueError(f"checkpoint_seconds must be >= 0; got {checkpoint_seconds!r}")
    if resume_from is not None and not os.path.exists(resume_from):
        raise FileNotFoundError(f"resume_from: no checkpoint at {resume_from}")
    cfg.validate()
    follow_threads()
    for said in cfg.warnings():
        warnings.warn(said, UserWarning, stacklevel=2)
    method, client = methods.build(cfg), methods.build(cfg)  # the server's half and the clients' half
    if cfg.engine == "batched" and method.cannot_run("batched"):
        raise ValueError(batched.unsupported(method, torch.nn.Module()) + "; use engine='sequential' or 'auto'")
    s, rnd, hist, start = start_up(cfg, method, train, test, resume_from, client=client)
    clients = LocalTraining(s, client, _resolve_engine(cfg, method, s.model))  # the clients' side, in this process
    last_save = time.perf_counter()

    bar = _progress(range(start, cfg.rounds), progress)
    for r in bar:
        # 1. the round (fedfrozen.engine.round.play): opened, each sampled client's instruction trained here into its
        # reply,
        # received in the sampled order, closed into the History row; the method may stop
        stop = play(rnd, r, hist, lambda plan, instructions: (clients.replies(instructions), {}))
        if hist.diverged:
            break
        _show(bar, hist.rows[-1])

        # 2. what the callbacks decide from it; the checkpoint
        stop = any([cb(r, hist.rows[-1], hist) is True for cb in callbacks]) or stop  # call every callback
        due = (r + 1) % checkpoint_every == 0 and time.perf_counter() - last_save >= checkpoint_seconds
        if checkpoint is not None and r + 1 < cfg.rounds and (stop or due):
            save_checkpoint(checkpoint, cfg, r + 1, rnd.x, method, hist, rnd.received_frozen, client=client)
            last_save = time.perf_counter()
        if stop:
            break
    return hist


def start_up(cfg: Config, method, train=None, test=None, resume_from=None, client=None):
    """What a run starts from, in the loop and in the Flower ServerApp alike: the Setup (data, model, flat buffer;
    the server's warm start on its public split when init="public"), the method's server half (`method`) set up on
    it, and its clients' half (`client`, in the loop; on Flower each node has its own), the round's server side, the
    History and the first round (> 0 when `resume_from` names a checkpoint, whose state is loaded into both halves).
    Returns (setup, round, history, first_round)."""
    s = prepare(cfg, train, test)
    if cfg.init == "public":
        pretrain_on_public(s)
    method.setup(s)
    if client is not None:
        client.setup(s)
    rnd = Round(s, method)
    hist = History(config=cfg.to_dict(), env=environment(str(s.device)))
    first = 0
    if resume_from is not None:
        first = load_checkpoint(resume_from, cfg, rnd.x, method, hist, rnd.received_frozen, client=client)
    rnd.start(first)
    return s, rnd, hist, first


def _resolve_engine(cfg: Config, method, model) -> bool:
    """Whether local training runs on the batched engine (fedfrozen.engine.batched): 'batched' where it can
    (else a clear error), 'auto' where it can (else sequential), 'sequential' never."""
    if cfg.engine == "sequential":
        return False
    reason = batched.unsupported(method, model)
    if reason and cfg.engine == "batched":
        raise ValueError(f"engine='batched': {reason}; use engine='sequential' or 'auto'")
    return reason is None


# --- progress -----------------------------------------------------------------------------

def _progress(rounds, enabled: bool):
    return progress_bar(rounds, enabled, desc="rounds", leave=False)


def _show(bar, row: dict) -> None:
    if hasattr(bar, "set_postfix"):
        acc = row.get("test_acc")
        loss = row.get("train_loss")
        bar.set_postfix(stage=row["stage"], loss="-" if loss is None else f"{loss:.3f}",
                        acc="-" if acc is None else f"{acc:.3f}")


