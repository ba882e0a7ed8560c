"""The federated round loop: one resident model, flat buffers, and the method's hooks.

One resident model: its parameters live in one flat buffer (fedfrozen.flat). For each sampled
client the global weights are copied in (`copy_`), the client trains its local steps on
batches from its own seeded generator, and its weighted update is folded in place into the
round's accumulator. The server step then moves the trainable entries only. Everything that
differs between methods (participation, what trains, gradient terms, bytes, aggregation, the
server step, per-round decisions, state) is a hook of `fedfrozen.methods.Method`; when the
frozen groups change (FedFrozen's stage switch at T0) the local optimiser is rebuilt over the
trainable parameters and the method drops the old stage's state (docs/methods.md).
"""

from __future__ import annotations

import math
import os
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from . import batched, data, local, methods, models, partition, qkv
from .config import Config
from .flat import FlatParams
from .history import History
from .io import atomic_write, environment, threads_setting
from .progress import progress_bar
from .rng import seed_for

__all__ = ["run", "CheckpointError", "Config", "evaluate", "evaluate_round", "lr_at", "round_metrics", "prepare", "Setup",
           "save_checkpoint"]

_EPS = 1e-12
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


class Setup:
    """Data on the device, client index sets, the resident model and its flat parameters."""

    def __init__(self, cfg: Config, device: torch.device, train=None, test=None):
        self.cfg, self.device = cfg, device
        if train is None:
            train, test = data.load(cfg.dataset, cfg.data_root, cfg.download)
        self.num_classes = train.num_classes
        if cfg.train_subset is not None:
            train = data.subset(train, cfg.train_subset)
        rng = np.random.default_rng(seed_for("holdout", cfg.seed))
        labels = train.y.numpy()
        val_idx, rest = _stratified_holdout(labels, cfg.val_fraction, rng)
        pub_rel, pool_rel = _stratified_holdout(labels[rest], cfg.public_fraction, rng)
        public_idx, pool = rest[pub_rel], rest[pool_rel]
        if cfg.n_clients > pool.size:
            raise ValueError(f"n_clients ({cfg.n_clients}) exceeds the {pool.size} training samples "
                             f"left for clients")
        parts = partition.make(cfg.partition, labels[pool], cfg.n_clients, seed=cfg.seed, alpha=cfg.alpha,
                               classes_per_client=cfg.classes_per_client)
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
        if cfg.init not in ("random", "public"):
            _load_initial_weights(self.model, cfg.init)
        qkv.split_qkv(self.model)
        self.flat = FlatParams(self.model)


def prepare(cfg: Config, train=None, test=None) -> Setup:
    """Resolve the device and build the Setup of `cfg` (data, clients, model), no training."""
    return Setup(cfg, _device(cfg), train, test)


def _load_initial_weights(model, path: str) -> None:
    if not os.path.isfile(path):
        raise ValueError(f"init must be 'random', 'public' or an existing state_dict file; no file {path!r}")
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


# --- evaluation ---------------------------------------------------------------------------

@torch.no_grad()
def evaluate(model, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024, amp: bool = False):
    """(mean loss, accuracy, per-sample correctness) of `model` on (x, y)."""
    model.eval()
    if len(y) == 0:
        return float("nan"), float("nan"), torch.zeros(0, dtype=torch.bool)
    losses, correct = [], []
    for i in range(0, len(y), batch_size):
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=amp):
            out = model(x[i:i + batch_size]).float()
        losses.append(F.cross_entropy(out, y[i:i + batch_size], reduction="sum"))
        correct.append(out.argmax(1) == y[i:i + batch_size])
    correct = torch.cat(correct)
    return (torch.stack(losses).sum() / len(y)).item(), correct.float().mean().item(), correct


def _pretrain_on_public(s: Setup) -> None:
    """Server warm start: `server_pretrain_epochs` of centralised training on the public split."""
    cfg = s.cfg
    opt = local.make_optimizer(cfg, s.flat)
    gen = torch.Generator().manual_seed(seed_for("server_pretrain", cfg.seed))
    local.train(s, opt, s.public_idx, gen, epochs=cfg.server_pretrain_epochs)


# --- the loop -----------------------------------------------------------------------------

def _lr_at(cfg: Config, r: int) -> float:
    """The local lr of round r: a linear warm-up over lr_warmup_rounds, then constant or cosine decay."""
    w = cfg.lr_warmup_rounds
    if r < w:
        return cfg.lr * (r + 1) / (w + 1)
    if cfg.lr_schedule == "cosine":
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * (r - w) / (cfg.rounds - w)))
    return cfg.lr


def _head_ratios(new, old) -> list:
    return [((a - b).flatten(1).norm(dim=1) / (b.flatten(1).norm(dim=1) + _EPS)) for a, b in zip(new, old)]


def _kernel_change(new, old) -> float | None:
    """Mean over layers and heads of the relative change of the attention kernels in one round."""
    if not new:
        return None
    return torch.cat(_head_ratios(new, old)).mean().item()


def _kernel_changes(new, old) -> list[float] | None:
    """Per layer (from the input up), the mean over heads of the relative kernel change in one round."""
    if not new:
        return None
    return [r.mean().item() for r in _head_ratios(new, old)]


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
    threads = threads_setting()
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    for said in cfg.warnings():
        warnings.warn(said, UserWarning, stacklevel=2)
    method = methods.build(cfg)
    if cfg.engine == "batched" and not getattr(method, "batched", True):
        raise ValueError(batched.unsupported(method, torch.nn.Module()) + "; use engine='sequential' or 'auto'")
    s = prepare(cfg, train, test)
    flat, model, device = s.flat, s.model, s.device
    use_batched = _resolve_engine(cfg, method, model)
    if cfg.init == "public":
        _pretrain_on_public(s)
    method.setup(s)

    x_global = flat.data.clone()
    delta = torch.empty_like(x_global)
    acc = torch.empty_like(x_global)
    hist = History(config=cfg.to_dict(), env=environment(str(device)))
    received_frozen: set[int] = set()
    start = 0
    if resume_from is not None:
        start = _load_checkpoint(resume_from, cfg, x_global, method, hist, received_frozen)
        flat.data.copy_(x_global)
    prev_kernels = qkv.attention_kernels(model)
    groups = qkv.GROUPS

    def configure(frozen):
        """Freeze `frozen`, rebuild the optimiser over the trainable parameters."""
        qkv.unfreeze(model, *groups)
        if frozen:
            qkv.freeze(model, *frozen)
        trainable = [g for g in groups if g not in frozen]
        opt = local.make_optimizer(cfg, flat, trainable)
        layout = batched.Layout(model, flat, trainable, frozen) if use_batched else None
        return opt, layout, flat.mask(trainable), flat.group_bytes(trainable), flat.group_bytes(frozen)

    current = method.frozen_groups(start - 1) if start > 0 else ()
    opt, layout, mask, trainable_bytes, frozen_bytes = configure(current)
    last_save = time.perf_counter()

    bar = _progress(range(start, cfg.rounds), progress)
    for r in bar:
        t0 = time.perf_counter()
        frozen = method.frozen_groups(r)
        if frozen != current:  # stage switch: fresh optimiser, method state and frozen-block delivery
            opt, layout, mask, trainable_bytes, frozen_bytes = configure(frozen)
            method.on_stage_switch(frozen)
            received_frozen.clear()
            current = frozen
        stage = 2 if frozen else 1
        value_l2 = method.value_penalty(r)
        lr = _lr_at(cfg, r)
        opt.lr = lr

        sampled = method.sample_clients(r)
        weights = s.client_sizes[sampled] / s.client_sizes[sampled].sum() if sampled else np.zeros(0)
        acc.zero_()
        client_sq = {g: torch.zeros((), device=device) for g in groups}
        method.begin_round(r, sampled)
        anchor_coeff = method.anchor_coeff()
        train_loss = 0.0 if sampled else math.nan  # a round nobody joined (skewed participation) trains nothing
        bytes_down = bytes_up = 0
        chunk = max(1, batched.chunk_size(cfg, layout, model, s, len(sampled))) if use_batched else 1
        for c0 in range(0, len(sampled), chunk):
            clients = []
            for cid in sampled[c0:c0 + chunk]:  # the hooks before training, client by client
                flat.data.copy_(x_global)
                opt.reset()  # a fresh local optimiser state per client per round
                cmask = method.client_mask(r, cid)
                opt.mask = cmask
                trains = mask if cmask is None else cmask * mask  # what this client trains, within the stage's groups
                method.init_client(r, cid, None if use_batched else opt, trains)
                seed = seed_for("local_batches", cfg.seed, r, cid)
                if not use_batched:  # (the batched engine refuses models with random layers)
                    torch.manual_seed(seed)  # dropout / stochastic depth, if the model has any
                c = dict(cid=cid, idx=s.client_train[cid], gen=torch.Generator().manual_seed(seed), mask=cmask,
                         trains=trains, forward=method.client_forward(r, cid), correction=method.correction(cid))
                if use_batched and c["forward"] is not None:
                    raise RuntimeError(f"method {method.name!r} gave a client_forward under the batched engine; "
                                       f"set its `batched = False`")
                if not use_batched:
                    c["loss_sum"], c["steps"] = local.train(
                        s, opt, c["idx"], c["gen"], epochs=cfg.local_epochs, steps=cfg.local_steps, anchor=x_global,
                        anchor_coeff=anchor_coeff, correction=c["correction"], value_l2=value_l2,
                        value_mode=cfg.value_l2_mode, mask=cmask, forward=c["forward"])
                clients.append(c)
            if use_batched:
                flat.data.copy_(x_global)
                trained = batched.train_chunk(s, layout, opt, x_global, clients, anchor_coeff=anchor_coeff,
                                              value_l2=value_l2, value_mode=cfg.value_l2_mode)
            for j, c in enumerate(clients):  # the hooks after training, in the sampled order
                cid, p = c["cid"], float(weights[c0 + j])
                if use_batched:
                    flat.data.copy_(x_global)
                    layout.scatter(trained[j][0], flat.data)  # the model holds the client's weights
                    c["loss_sum"], c["steps"] = trained[j][1], trained[j][2]
                client_loss = (c["loss_sum"] / c["steps"]).item()
                if not math.isfinite(client_loss):
                    hist.diverged = {"round": r, "client": cid}
                    warnings.warn(f"run diverged: non-finite loss at round {r}, client {cid}; stopping",
                                  RuntimeWarning, stacklevel=2)
                    break
                train_loss += p * client_loss
                torch.sub(flat.data, x_global, out=delta)
                method.upload(r, cid, delta)
                method.aggregate(acc, cid, delta, p)
                for g, sq in flat.group_sq_norms(delta).items():
                    client_sq[g] += p * sq
                trains = c["trains"]
                method.after_client(r, cid, delta, c["steps"], lr, trains)
                payload = trainable_bytes if c["mask"] is None else int(trains.count_nonzero()) * flat.element_size
                down, up = method.client_bytes(r, cid, payload, trainable_bytes)
                bytes_down += down
                bytes_up += up
                if frozen and cid not in received_frozen:  # the frozen block is sent once per client
                    bytes_down += frozen_bytes
                    received_frozen.add(cid)
            if hist.diverged:
                break
        if hist.diverged:
            break

        if sampled:  # no update from nobody: the global model (and server state) stay as they are
            method.server_update(r, x_global, acc, mask, sampled)
        flat.data.copy_(x_global)

        row = {"round": r, "stage": stage, "lr": lr, "train_loss": train_loss, "clients": [int(c) for c in sampled]}
        kernels = qkv.attention_kernels(model)
        row.update(round_metrics(flat, acc, client_sq, frozen, kernels, prev_kernels))
        prev_kernels = kernels
        row.update(_evaluate_round(s, r))
        row["bytes_down"], row["bytes_up"] = bytes_down, bytes_up
        row["seconds"] = time.perf_counter() - t0
        hist.append(row)
        _show(bar, row)

        stop = method.on_round_end(r, hist.rows[-1], hist) is True
        stop = any([cb(r, hist.rows[-1], hist) is True for cb in callbacks]) or stop  # call every callback
        due = (r + 1) % checkpoint_every == 0 and time.perf_counter() - last_save >= checkpoint_seconds
        if checkpoint is not None and r + 1 < cfg.rounds and (stop or due):
            save_checkpoint(checkpoint, cfg, r + 1, x_global, method, hist, received_frozen)
            last_save = time.perf_counter()
        if stop:
            break
    return hist


def round_metrics(flat, acc, client_sq: dict, frozen, kernels, prev_kernels) -> dict:
    """A round's model measurements for its History row: per trained group the client drift
    (sum_i p_i ||D_i||^2 / ||sum_i p_i D_i||^2 - 1, from `client_sq` = sum_i p_i ||D_i,g||^2 and the mean
    update `acc`) and the norm of the mean update (None for frozen groups; `other` only if the model has
    it), and the relative kernel change, overall and per layer."""
    row = {}
    mean_sq = flat.group_sq_norms(acc)
    for g in qkv.GROUPS:
        if g == "other" and not flat.group_numel("other"):
            continue
        trained = g not in frozen
        norm2 = mean_sq[g].item()
        row[f"drift_{g}"] = max(float(client_sq[g]) - norm2, 0.0) / (norm2 + _EPS) if trained else None
        row[f"update_norm_{g}"] = math.sqrt(norm2) if trained else None
    row["kernel_change"] = _kernel_change(kernels, prev_kernels)
    row["kernel_change_layers"] = _kernel_changes(kernels, prev_kernels)
    return row


def _resolve_engine(cfg: Config, method, model) -> bool:
    """Whether local training runs on the batched engine (fedfrozen.batched): 'batched' where it can
    (else a clear error), 'auto' where it can (else sequential), 'sequential' never."""
    if cfg.engine == "sequential":
        return False
    reason = batched.unsupported(method, model)
    if reason and cfg.engine == "batched":
        raise ValueError(f"engine='batched': {reason}; use engine='sequential' or 'auto'")
    return reason is None


def _evaluate_round(s: Setup, r: int) -> dict:
    cfg = s.cfg
    keys = ("test_loss", "test_acc", "val_loss", "val_acc", "client_acc_mean", "client_acc_worst10",
            "client_acc_std")
    if (r + 1) % cfg.eval_every and r != cfg.rounds - 1:
        return dict.fromkeys(keys)
    out = {}
    out["test_loss"], out["test_acc"], _ = evaluate(s.model, s.test_x, s.test_y, amp=cfg.amp)
    if len(s.val_idx):
        out["val_loss"], out["val_acc"], _ = evaluate(s.model, s.x[s.val_idx], s.y[s.val_idx], amp=cfg.amp)
    else:
        out["val_loss"] = out["val_acc"] = None
    if len(s.client_eval_all):
        _, _, correct = evaluate(s.model, s.x[s.client_eval_all], s.y[s.client_eval_all], amp=cfg.amp)
        n = len(s.client_eval)
        hits = torch.bincount(s.client_eval_owner, weights=correct.float(), minlength=n)
        sizes = torch.bincount(s.client_eval_owner, minlength=n).float()
        acc = (hits[sizes > 0] / sizes[sizes > 0]).cpu().numpy()
        worst = np.sort(acc)[:max(1, int(math.ceil(0.1 * acc.size)))]
        out.update(client_acc_mean=float(acc.mean()), client_acc_worst10=float(worst.mean()),
                   client_acc_std=float(acc.std()))
    else:
        out.update(client_acc_mean=None, client_acc_worst10=None, client_acc_std=None)
    return out


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


def _load_checkpoint(path, cfg, x_global, method, hist, received_frozen) -> int:
    try:
        state = torch.load(path, map_location=x_global.device, weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds for a damaged file
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(e).__name__}: {str(e)[:200]}); delete its "
                              f"folder to start over") from None
    keys = ("round", "x", "method", "rows", "diverged", "received_frozen", "config")
    if not isinstance(state, dict) or any(k not in state for k in keys):
        raise CheckpointError(f"checkpoint {path} is not a fedfrozen checkpoint (missing "
                              f"{[k for k in keys if not isinstance(state, dict) or k not in state]})")
    cfg_d = cfg.to_dict()
    if state["config"] != cfg_d:
        diff = sorted(k for k in cfg_d if state["config"].get(k) != cfg_d[k])
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


# public names of the helpers other runtimes share (fedfrozen.flower): the same rows, the same schedule
lr_at, evaluate_round = _lr_at, _evaluate_round
