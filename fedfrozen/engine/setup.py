"""What a run starts from: the data split as the run splits it, the clients' index sets, the resident model (with
its pretrained or loaded initial weights) and its flat parameters; the server's warm start on its public split."""

from __future__ import annotations

import os

import numpy as np
import torch

from ..base.rng import seed_for
from ..inputs import data, partition, shift
from ..nets import models, qkv
from ..nets.flat import FlatParams
from . import local, pretrain
from .config import Config

__all__ = ["Setup", "prepare", "split_training_data", "pretrain_on_public", "TEST_SAMPLE", "CLIENT_EVAL",
           "FINAL_SAMPLE"]

# Where clients are natural (text), the evaluations sample: the test text of Shakespeare's 100 largest roles is 334k
# windows, a pass over it 3.4 min on one thread (more than a cpu run's training). Each sample is fixed (seeded by the
# dataset, not the run), so every run and every round sees the same windows and paired arms differ by their models.
TEST_SAMPLE = 2_000     # test (and validation) windows evaluated on every evaluated round (test_acc, val_acc)
CLIENT_EVAL = 20        # held-out windows of a natural client evaluated for its local accuracy
FINAL_SAMPLE = 50_000   # test windows evaluated at the last round as well (test_acc_final; all where fewer)


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
        owner = None if train.owner is None else train.owner.numpy()[pool]  # natural clients (Shakespeare's roles)
        parts = partition.make(cfg.partition, labels[pool], cfg.n_clients, seed=cfg.seed, alpha=cfg.alpha,
                               classes_per_client=cfg.classes_per_client, min_size=cfg.min_client_samples,
                               min_size_by=cfg.min_samples_by, balance=cfg.dirichlet_balance, owner=owner)
        self.client_train, self.client_eval = [], []
        for part in parts:
            idx = rng.permutation(pool[part])
            k = int(round(cfg.client_holdout * idx.size)) if idx.size > 1 else 0
            k = min(max(k, 1 if cfg.client_holdout > 0 and idx.size > 1 else 0), idx.size - 1)
            self.client_eval.append(torch.as_tensor(np.sort(idx[:k]), device=device))
            self.client_train.append(torch.as_tensor(np.sort(idx[k:]), device=device))
        if train.owner is not None:  # natural clients hold up to ~45k windows: each evaluates a fixed sample
            self.client_eval = [e[torch.from_numpy(np.sort(np.random.default_rng(i).permutation(len(e))[:CLIENT_EVAL]))
                                  .to(device)] if len(e) > CLIENT_EVAL else e for i, e in enumerate(self.client_eval)]
        self.client_sizes = np.array([len(t) for t in self.client_train], dtype=np.float64)
        self.x, self.y = train.x.to(device), train.y.to(device)
        self.test_x, self.test_y = test.x.to(device), test.y.to(device)
        self.test_final = None  # (natural clients) the last round's larger test sample
        if test.owner is not None:  # natural clients: the federation's test text, a fixed sample during training
            self._sample_test(test, cfg, device)
        if train.owner is not None:  # natural clients: the validation windows of the federation's roles, a sample
            owners = train.owner.numpy()[val_idx]
            val_idx = val_idx[(owners >= 0) & (owners < cfg.n_clients)]
            if len(val_idx) > TEST_SAMPLE:
                val_idx = np.sort(np.random.default_rng(0).choice(val_idx, TEST_SAMPLE, replace=False))
        self.val_idx = torch.as_tensor(val_idx, device=device)
        self.public_idx = torch.as_tensor(public_idx, device=device)
        # every client's held-out slice in one index tensor, with its owner, for one batched evaluation
        self.client_eval_all = torch.cat(self.client_eval)
        self.client_eval_owner = torch.cat([torch.full((len(t),), i, device=device)
                                            for i, t in enumerate(self.client_eval)])

        torch.manual_seed(seed_for("init", cfg.seed))
        kw = dict(cfg.model_kwargs)
        if cfg.model in models.TEXT_MODELS:
            kw.setdefault("seq_len", train.x.shape[1])
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
        shift.apply(self)  # a feature shift (Config.shift): the clients' images by group, one test set per group

    def _sample_test(self, test, cfg: Config, device) -> None:
        """The federation's test set where clients are natural (test.owner): the test text of its n_clients roles; a
        fixed sample of TEST_SAMPLE of its windows (seeded by the dataset, not the run: every run sees the same) is
        evaluated on every evaluated round, and at the last round a fixed sample of FINAL_SAMPLE (all of it where
        fewer) as well (`test_final`: test_acc_final)."""
        keep = torch.nonzero((test.owner >= 0) & (test.owner < cfg.n_clients)).flatten()
        x, y = test.x[keep].to(device), test.y[keep].to(device)
        self.test_x, self.test_y = x, y
        if len(keep) > TEST_SAMPLE:
            rng = np.random.default_rng(0)
            pick = torch.from_numpy(np.sort(rng.choice(len(keep), TEST_SAMPLE, replace=False))).to(device)
            self.test_x, self.test_y = x[pick], y[pick]
            final = torch.from_numpy(np.sort(rng.choice(len(keep), min(FINAL_SAMPLE, len(keep)), replace=False)))
            self.test_final = (x[final.to(device)], y[final.to(device)])


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


def pretrain_on_public(s: Setup) -> None:
    """Server warm start: `server_pretrain_epochs` of centralised training on the public split, at the base rate
    `cfg.lr` (it precedes round 0, so no round's schedule applies; the rounds' rates are
    `fedfrozen.engine.server.lr_at`'s)."""
    cfg = s.cfg
    opt = local.make_optimizer(cfg, s.flat)
    gen = torch.Generator().manual_seed(seed_for("server_pretrain", cfg.seed))
    local.train(s, opt, cfg.lr, s.public_idx, gen, epochs=cfg.server_pretrain_epochs)
