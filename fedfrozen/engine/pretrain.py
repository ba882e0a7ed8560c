"""A pretrained start (`Config(init="pretrained")`): federated fine-tuning of a kernel that is already good.

Before round 0 the server trains the model centrally on training images **no client holds**: the images of the
dataset's training split outside the federation's fixed `train_subset` (so `train_subset` must leave some out).
Three pre-training tasks (`Config.pretrain_task`):

- `rotation` (default): self-supervised. Each image is shown turned by 0, 90, 180 or 270 degrees (drawn per image
  and epoch from the pre-training generator) and the model learns which; no label is used. The body (patch
  embedding, attention, MLPs, norms) keeps what it learnt, the classification head is the run's own fresh one, so
  the federated task starts at chance and has everything to gain, from a kernel that already attends.
- `classes`: supervised on the first half of the classes only (their labels, images outside the subset); the whole
  model, head included, is kept, so the federated task starts at most half solved.
- `plays` (text with natural clients, `dataset="shakespeare"`): next-character prediction on the server's own plays
  (`data.SHAKESPEARE_PRETRAIN_PLAYS`, whose roles are never clients); the body is kept, the head is the run's own.

The weights are made once per setting and cached like a run: `results/pretrained/<key>.pt`, where the key hashes
the dataset (and, for texts other than the Shakespeare release, their digest: data.source_version), model, its
arguments, the subset, the task, the epochs and `pretrain_seed` (the same seed gives
bit-identical weights on the same machine and thread count), written atomically. Pre-training: AdamW, lr
PRETRAIN_LR with a cosine schedule over its steps, batch PRETRAIN_BATCH, weight decay 0.05.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from ..base.io import atomic_write, file_lock, project_root
from ..base.rng import seed_for
from ..inputs import data
from ..methods.settings import Settings, component, setting
from ..nets import models

__all__ = ["PretrainSettings", "PRETRAIN_TASKS", "PRETRAIN_LR", "PRETRAIN_BATCH", "outside_indices", "weights_key",
           "cache_dir", "pretrained_state", "load_into", "task_data", "task_batches"]

PRETRAIN_TASKS = ("rotation", "classes", "plays")
PRETRAIN_LR = 1e-3
PRETRAIN_BATCH = 64
_VERSION = 1  # part of every weights key: bump when what the pre-training computes changes


@component
@dataclass(frozen=True)
class PretrainSettings(Settings):
    """The pre-training of init="pretrained" (Config(pretrain_epochs=...), --pretrain-epochs, ...)."""

    prefix: ClassVar[str] = "pretrain"
    task: str = setting("rotation", 'init="pretrained": rotation (self-supervised, fresh head) | classes (the first '
                        "half of the classes) | plays (text: the server's own plays)", choices=PRETRAIN_TASKS)
    epochs: int = setting(3, 'init="pretrained": epochs over the images outside train_subset', lo=1)
    seed: int = setting(0, 'init="pretrained": the pre-training\'s seed (same seed, same weights; part of their '
                        "cache key)", lo=0)


def outside_indices(train: data.Split, train_subset: int | None) -> np.ndarray:
    """Indices of the training images outside the federation's fixed subset (`data.subset_indices`): the images
    no client, validation split or public split ever holds (text with natural clients: the samples no client owns,
    the server's plays). A ValueError when there are none."""
    if train.owner is not None:
        outside = np.flatnonzero(train.owner.numpy() < 0)
        if not outside.size:
            raise ValueError("init='pretrained' pre-trains on text no client owns; this dataset leaves none out")
        return outside
    if train_subset is None or train_subset >= len(train):
        raise ValueError(f"init='pretrained' pre-trains on training images no client holds, so train_subset must "
                         f"leave some out; got train_subset={train_subset!r} of {len(train)} images")
    keep = data.subset_indices(train, train_subset)
    return np.setdiff1d(np.arange(len(train)), keep)


def weights_key(cfg) -> str:
    """The cache key of the pretrained weights of `cfg` (12 hex digits): what the pre-training depends on."""
    from .._version import __version__

    content = dict(dataset=cfg.dataset, model=cfg.model, model_kwargs=cfg.model_kwargs, train_subset=cfg.train_subset,
                   task=cfg.pretrain_task, epochs=cfg.pretrain_epochs, seed=cfg.pretrain_seed, version=_VERSION,
                   package=__version__)
    source = data.source_version(cfg)  # other Shakespeare texts than the release: their digest
    if source is not None:
        content["source"] = source
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:12]


def cache_dir() -> Path:
    """Where pretrained weights are kept: results/pretrained/ of the project (beside the run cache)."""
    return project_root() / "results" / "pretrained"


def task_data(task: str, x: torch.Tensor, y: torch.Tensor, num_classes: int):
    """The images and labels the pre-training task sees: all of them for `rotation` (their labels unused), those of
    the first half of the classes for `classes`."""
    if task == "classes":
        keep = torch.nonzero(y < max(1, num_classes // 2)).flatten()
        return x[keep], y[keep]
    return x, y


def task_batches(task: str, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator, batch: int):
    """One epoch of the pre-training task over `task_data` as (inputs, targets) batches, in an order (and, for
    `rotation`, with quarter turns) drawn from `gen`."""
    order = torch.randperm(len(x), generator=gen)
    turns = torch.randint(0, 4, (len(x),), generator=gen) if task == "rotation" else None
    for start in range(0, len(order), batch):
        b = order[start:start + batch]
        if task == "rotation":
            xb = torch.stack([torch.rot90(img, int(k), dims=(1, 2)) for img, k in zip(x[b], turns[b])])
            yield xb, turns[b]
        else:
            yield x[b], y[b]


def _train(cfg, train: data.Split, num_classes: int, kw: dict) -> dict:
    """Pre-train a fresh model on the images outside the subset; its state_dict (split layout: not split)."""
    outside = torch.as_tensor(outside_indices(train, cfg.train_subset))
    x, y = task_data(cfg.pretrain_task, train.x[outside], train.y[outside], num_classes)
    torch.manual_seed(seed_for("pretrain", cfg.pretrain_seed))
    head = 4 if cfg.pretrain_task == "rotation" else num_classes
    model = models.create(cfg.model, head, **kw)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=PRETRAIN_LR, weight_decay=0.05)
    per_epoch = math.ceil(len(x) / PRETRAIN_BATCH)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, per_epoch * cfg.pretrain_epochs))
    gen = torch.Generator().manual_seed(seed_for("pretrain_batches", cfg.pretrain_seed))
    for _ in range(cfg.pretrain_epochs):
        for xb, yb in task_batches(cfg.pretrain_task, x, y, gen, PRETRAIN_BATCH):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
            sched.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def pretrained_state(cfg, train: data.Split, num_classes: int, kw: dict) -> dict:
    """The pretrained state_dict of `cfg`: loaded from the cache, else trained once and cached (atomically). Under
    an advisory lock per key (`.<key>.lock`): a second process that needs the same weights (run_many's workers on
    a grid's pretrained runs of one seed) waits for the first and loads its file instead of training them again."""
    path = cache_dir() / f"{weights_key(cfg)}.pt"
    if path.is_file():
        return torch.load(path, map_location="cpu", weights_only=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path.parent / f".{path.stem}.lock", remove=True):
        if path.is_file():  # made by the process this one waited for
            return torch.load(path, map_location="cpu", weights_only=True)
        state = _train(cfg, train, num_classes, kw)
        atomic_write(path, lambda tmp: torch.save(state, tmp))
    return state


def load_into(model: torch.nn.Module, state: dict, task: str) -> list[str]:
    """Load pretrained weights into the run's model (before Q/K/V are split): everything but the classification
    head for `rotation` and `plays` (the body: its head answered another question, or another text's), everything
    for `classes`. Returns the names kept from the run's own initialisation."""
    head = {n for n, p in model.named_parameters() if n.startswith("head.")}
    take = {k: v for k, v in state.items() if not (task in ("rotation", "plays") and k in head)}
    own = model.state_dict()
    bad = [k for k, v in take.items() if k not in own or own[k].shape != v.shape]
    if bad:
        raise ValueError(f"pretrained weights do not fit the model {type(model).__name__}: {bad[:5]}")
    model.load_state_dict(take, strict=False)
    return sorted(set(own) - set(take))
