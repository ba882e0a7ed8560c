"""The federated round loop: one resident model, flat buffers, and the method's hooks.

One resident model: its parameters live in one flat buffer (fedfrozen.flat). For each sampled
client the global weights are copied in (`copy_`), the client trains its local steps on
batches from its own seeded generator, and its weighted update is folded in place into the
round's accumulator. The server step then moves the trainable entries only. Everything that
differs between methods (participation, what trains, gradient terms, bytes, aggregation, the
server step, per-round decisions, state) is a hook of `fedfrozen.methods.Method`; when the
frozen groups change (FedFrozen's stage switch at T0) the local optimiser is rebuilt over the
trainable parameters and the method drops the old stage's state (docs/methods.md).

The round itself is `fedfrozen.round`: `Round` (the server's side: opening, instructing, receiving the replies,
closing; also driven by the Flower strategy) and `LocalTraining` (the clients' side in this process, either engine:
an Instruction in, a Reply out; also what the Flower ClientApp runs); `run` below is the loop over rounds, with
setup, resume, callbacks and checkpoints.
"""

from __future__ import annotations

import math
import os
import time
import warnings

import numpy as np
import torch

from . import batched, data, local, methods, models, partition, pretrain, qkv
from .config import Config, identity, stored_form
from .flat import FlatParams
from .history import History
from .io import atomic_write, environment, follow_threads
from .progress import progress_bar
from .rng import seed_for
from .round import LocalTraining, Round, evaluate, evaluate_round, lr_at, round_metrics

__all__ = ["run", "start_up", "CheckpointError", "Config", "evaluate", "evaluate_round", "lr_at", "round_metrics",
           "prepare", "Setup", "split_training_data", "save_checkpoint"]

# --- setup --------------------------------------------------------------------------------

def _device(cfg: Config) -> torch.device:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no CUDA device is available; use device='cpu' or 'auto'")
    dev = torch.device("cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
                       else "cpu")
    if cfg.amp and dev.type != "cuda":
        raise ValueError("amp=True needs a CUDA device (amp is GPU only)")
    if dev.type == "cuda":  # TF32 matmuls and convolutions: fp32 storage, ~10-bit mantissa products
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return dev


def _stratified_holdout(labels: np.ndarray, fraction: float, rng) -> tuple[np.ndarray, np.ndarray]:
    """Split indices into (held out, rest), taking `fraction` of every class."""
    if fraction <= 0:
        return np.array([], dtype=np.int64), np.arange(labels.size)
    held = []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        held.append(idx[:int(round(fraction * idx.size))])
    held = np.sort(np.concatenate(held))
    rest = np.setdiff1d(np.arange(labels.size), held)
    return held, rest


def split_training_data(cfg: Config, train=None):
    """The training data as a run splits it: (train after `train_subset`, its labels, the validation indices, the
    server's public indices, the pool the clients are partitioned from, and the holdout generator, which `Setup`
    goes on drawing from). `ff.loop.split_training_data(cfg)[1][pool]` are the labels the partition sees."""
    if train is None:
        train, _ = data.load(cfg.dataset, cfg.data_root, cfg.download)
    if cfg.train_subset is not None:
        train = data.subset(train, cfg.train_subset)
    rng = np.random.default_rng(seed_for("holdout", cfg.seed))
    labels = train.y.numpy()
    val_idx, rest = _stratified_holdout(labels, cfg.val_fraction, rng)
    pub_rel, pool_rel = _stratified_holdout(labels[rest], cfg.public_fraction, rng)
    return train, labels, val_idx, rest[pub_rel], rest[pool_rel], rng


class Setup:
    """Data on the device, client index sets, the resident model and its flat parameters."""

    def __init__(self, cfg: Config, device: torch.device, train=None, test=None):
        self.cfg, self.device = cfg, device
        if train is None:
            train, test = data.load(cfg.dataset, cfg.data_root, cfg.download)
        self.num_classes = train.num_classes
        full_train = train
        train, labels, val_idx, public_idx, pool, rng = split_training_data(cfg, train)
        if cfg.n_clients > pool.size:
            raise ValueError(f"n_clients ({cfg.n_clients}) exceeds the {pool.size} training samples "
                             f"left for clients")
        parts = partition.make(cfg.partition, labels[pool], cfg.n_clients, seed=cfg.seed, alpha=cfg.alpha,
                               classes_per_client=cfg.classes_per_client, min_size=cfg.min_client_samples)
        self.client_train, self.client_eval = [], []
        for part in parts:
            idx = rng.permutation(pool[part])
            k = int(round(cfg.client_holdout * idx.size)) if idx.size > 1 else 0
            k = min(max(k, 1 if cfg.client_holdout > 0 and idx.size > 1 else 0), idx.size - 1)
            self.client_eval.append(torch.as_tensor(np.sort(idx[:k]), device=device))
            self.client_train.append(torch.as_tensor(np.sort(idx[k:]), device=device))
        self.client_sizes = np.array([len(t) for t in self.client_train], dtype=np.float64)
        self.x, self.y = train.x.to(device), train.y.to(device)
        self.test_x, self.test_y = test.x.to(device), test.y.to(device)
        self.val_idx = torch.as_tensor(val_idx, device=device)
        self.public_idx = torch.as_tensor(public_idx, device=device)
        # every client's held-out slice in one index tensor, with its owner, for one batched evaluation
        self.client_eval_all = torch.cat(self.client_eval)
        self.client_eval_owner = torch.cat([torch.full((len(t),), i, device=device)
                                            for i, t in enumerate(self.client_eval)])

        torch.manual_seed(seed_for("init", cfg.seed))
        kw = dict(cfg.model_kwargs)
        if cfg.model in models.PROJECT_MODELS:
            kw.setdefault("in_chans", train.x.shape[1])
            kw.setdefault("img_size", train.x.shape[2])
            patch = kw.get("patch_size", models.PROJECT_MODELS[cfg.model].get("patch_size"))
            if patch and kw["img_size"] % patch:
                raise ValueError(f"model_kwargs: patch_size {patch} does not divide the {kw['img_size']}-pixel images "
                                 f"of {cfg.dataset}; the last {kw['img_size'] % patch} rows and columns would be "
                                 f"ignored")
        self.model = models.create(cfg.model, self.num_classes, **kw).to(device)
        if cfg.init == "pretrained":
            state = pretrain.pretrained_state(cfg, full_train, self.num_classes, kw)
            pretrain.load_into(self.model, state, cfg.pretrain_task)
        elif cfg.init not in ("random", "public"):
            _load_initial_weights(self.model, cfg.init)
        qkv.split_qkv(self.model)
        self.flat = FlatParams(self.model)


def prepare(cfg: Config, train=None, test=None) -> Setup:
    """Resolve the device and build the Setup of `cfg` (data, clients, model), no training."""
    return Setup(cfg, _device(cfg), train, test)


def _load_initial_weights(model, path: str) -> None:
    if not os.path.isfile(path):
        raise ValueError(f"init must be 'random', 'public', 'pretrained' or an existing state_dict file; "
                         f"no file {path!r}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds for a file that is not a checkpoint
        raise ValueError(f"init: {path!r} is not a torch state_dict ({type(e).__name__}: {str(e)[:200]})") from None
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise ValueError(f"init: {path!r} holds a {type(state).__name__}, not a state_dict of tensors")
    if any(".qkv.q." in k or ".self_attn.q." in k for k in state):
        qkv.split_qkv(model)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ValueError(f"init: {path!r} does not fit the model {type(model).__name__} "
                         f"({str(e).splitlines()[0][:200]} ...)") from None


def _pretrain_on_public(s: Setup) -> None:
    """Server warm start: `server_pretrain_epochs` of centralised training on the public split."""
    cfg = s.cfg
    opt = local.make_optimizer(cfg, s.flat)
    gen = torch.Generator().manual_seed(seed_for("server_pretrain", cfg.seed))
    local.train(s, opt, cfg.lr, s.public_idx, gen, epochs=cfg.server_pretrain_epochs)


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
    train/test: Splits to use instead of loading `cfg.dataset` (user data; fedfrozen.data.from_tensors).
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
    method = methods.build(cfg)
    if cfg.engine == "batched" and method.cannot_run("batched"):
        raise ValueError(batched.unsupported(method, torch.nn.Module()) + "; use engine='sequential' or 'auto'")
    s, rnd, hist, start = start_up(cfg, method, train, test, resume_from)
    clients = LocalTraining(s, method, _resolve_engine(cfg, method, s.model))  # the clients' side, in this process
    clients.configure(rnd.mask)  # the stage's trainable mask decides what moves
    last_save = time.perf_counter()

    bar = _progress(range(start, cfg.rounds), progress)
    for r in bar:
        t0 = time.perf_counter()
        # 1. open the round: stage switch, lr, value penalty, the sampled clients
        plan = rnd.open(r)
        if plan.switched:
            clients.configure(plan.mask)  # the new stage's trainable mask and a fresh local optimiser

        # 2. each sampled client's instruction, its local training and its reply, received in the sampled order
        for reply in clients.replies(rnd.instructions(plan)):
            if not math.isfinite(reply.loss):
                hist.diverged = {"round": r, "client": reply.cid}
                warnings.warn(f"run diverged: non-finite loss at round {r}, client {reply.cid}; stopping",
                              RuntimeWarning, stacklevel=2)
                break
            rnd.receive(plan, reply)
        if hist.diverged:
            break

        # 3. close it: the server step, measurements and evaluation make the History row; the method may stop
        stop = rnd.finish(plan, hist, t0)
        _show(bar, hist.rows[-1])

        # 4. what the callbacks decide from it; the checkpoint
        stop = any([cb(r, hist.rows[-1], hist) is True for cb in callbacks]) or stop  # call every callback
        due = (r + 1) % checkpoint_every == 0 and time.perf_counter() - last_save >= checkpoint_seconds
        if checkpoint is not None and r + 1 < cfg.rounds and (stop or due):
            save_checkpoint(checkpoint, cfg, r + 1, rnd.x, method, hist, rnd.received_frozen)
            last_save = time.perf_counter()
        if stop:
            break
    return hist


def start_up(cfg: Config, method, train=None, test=None, resume_from=None):
    """What a run starts from, in the loop and in the Flower strategy alike: the Setup (data, model, flat buffer;
    the server's warm start on its public split when init="public"), the method set up on it, the round's server
    side, the History and the first round (> 0 when `resume_from` names a checkpoint, whose state is loaded).
    Returns (setup, round, history, first_round)."""
    s = prepare(cfg, train, test)
    if cfg.init == "public":
        _pretrain_on_public(s)
    method.setup(s)
    rnd = Round(s, method)
    hist = History(config=cfg.to_dict(), env=environment(str(s.device)))
    first = 0
    if resume_from is not None:
        first = load_checkpoint(resume_from, cfg, rnd.x, method, hist, rnd.received_frozen)
    rnd.start(first)
    return s, rnd, hist, first


def _resolve_engine(cfg: Config, method, model) -> bool:
    """Whether local training runs on the batched engine (fedfrozen.batched): 'batched' where it can
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


# --- checkpoints --------------------------------------------------------------------------

def save_checkpoint(path, cfg, next_round, x_global, method, hist, received_frozen) -> None:
    """Everything the loop needs to continue at `next_round` (atomic write).

    No RNG state is stored: every random choice after setup is drawn from a generator seeded
    by (seed, round, client), so the rounds after a resume draw what they would have drawn.
    """
    state = {"round": next_round, "x": x_global.cpu(), "method": method.state_dict(), "rows": hist.rows,
             "diverged": hist.diverged, "received_frozen": sorted(received_frozen), "config": cfg.to_dict()}
    atomic_write(path, lambda tmp: torch.save(state, tmp))


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from (truncated, empty, missing keys, another config, cut short)."""


def load_checkpoint(path, cfg, x_global, method, hist, received_frozen) -> int:
    """Load a checkpoint of `cfg` written by save_checkpoint into the global weights, the method, the History and
    the set of clients holding the frozen block; the round to continue at. CheckpointError if it cannot be used."""
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
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint {path}: the method state does not load ({type(e).__name__}: {e})") from None
    x_global.copy_(state["x"])
    hist.rows = list(rows)
    hist.diverged = state["diverged"]
    received_frozen.update(state["received_frozen"])
    return start


