"""The batched engine: a chunk of a round's clients trained at once, by vmap over stacked client weights.

A step of the sequential engine runs ~300 small ops for one client's 16 samples, so on a CPU it is
framework overhead more than arithmetic. Here the trainable entries of every client of a chunk are
stacked into one (clients, entries) tensor; one `torch.func.vmap(grad(...))` of the model's
`functional_call` gives every client's gradient for its own batch, `fedfrozen.engine.local.grad_terms`
adds the local objective's terms row by row, and the local update rule of `fedfrozen.nets.update` (the
clients' masks, the clip, the core) steps all rows with a handful of vector ops. Only the local
optimiser's slices (the stage's trainable entries) are stacked: the frozen ones are one shared copy,
with no gradient.

Exactly the sequential engine's training (tests/test_batched.py: weights within 1e-5):
- each client's batches and augmentation come from `fedfrozen.engine.local.draw_batches` with the same seeded
  generator;
- clients do unequal numbers of steps (Dirichlet clients differ 10x in size). The chunk is sorted
  by steps, longest first, so at step k the clients still training are a prefix of the stack:
  step k runs on that prefix only, and a finished client does not move. Nothing is computed for
  it (no masking, no padding of steps);
- batches of unequal size (an epoch's last batch) are padded to the chunk's batch size with
  weight-0 samples, and the loss is the mean over the real ones;
- AdamW's step count is the same for every client still training (k + 1).

What cannot run batched, and why (`unsupported`): a method whose `batched` is False (it replaces
the forward pass per client, e.g. AFedLF's cached prefix, or uses the local optimiser object);
a model with dropout or stochastic depth in training (their random draws would differ from the
sequential engine's). `Config.engine = "auto"` then uses the sequential engine; "batched" raises.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from ..inputs import augment
from ..methods.settings import Settings, component, setting
from ..nets.update import UpdateRule, apply_mask
from .local import autocast, draw_batches, grad_terms

__all__ = ["EntryMap", "EngineSettings", "unsupported", "train_chunk", "chunk_size", "MEMORY_BUDGET"]


@component
@dataclass(frozen=True)
class EngineSettings(Settings):
    """The batched engine's (Config(engine_chunk=...), --engine-chunk, ...)."""

    prefix: ClassVar[str] = "engine"
    chunk: int | None = setting(None, "batched engine: clients trained at once (None: as many as a memory budget "
                                "allows)", lo=1)
    compile: bool = setting(False, "batched engine: torch.compile its step (pays on long runs; benchmarks/engine.py)")

MEMORY_BUDGET = {"cpu": 2 << 30, "cuda": 16 << 30}  # bytes one chunk may use, by device type


def unsupported(method, model: nn.Module) -> str | None:
    """Why `method` on `model` cannot run on the batched engine, or None when it can."""
    reason = method.cannot_run("batched")
    if reason:
        return f"method {method.name!r} has no batched path ({reason})"
    for name, m in model.named_modules():
        p = getattr(m, "p", None) if isinstance(m, nn.modules.dropout._DropoutNd) else getattr(m, "drop_prob", None)
        if p:
            return (f"model has random layers in training ({name or 'model'}: {type(m).__name__} p={p}); the "
                    f"batched engine would draw differently from the sequential one")
    return None


class EntryMap:
    """Where each parameter lives in the stacked trainable entries or the shared frozen ones, for one stage: the
    local optimiser's `slices` (the entries the stage's trainable mask keeps: fedfrozen.nets.update.FlatOptimizer), and
    the rest."""

    def __init__(self, model: nn.Module, flat, slices):
        self.flat = flat
        self.tslices = list(slices)
        self.fslices = _complement(self.tslices, flat.numel)
        self.nt = sum(s.stop - s.start for s in self.tslices)
        shapes = {n: p.shape for n, p in model.named_parameters()}
        self.trainable, self.frozen = [], []  # (name, shape, start, stop) in the trainable / frozen vector
        for name, (a, b) in sorted(flat.param_range.items(), key=lambda kv: kv[1][0]):
            for slices, out in ((self.tslices, self.trainable), (self.fslices, self.frozen)):
                offset = 0
                for s in slices:
                    if s.start <= a and b <= s.stop:
                        out.append((name, shapes[name], offset + a - s.start, offset + b - s.start))
                    offset += s.stop - s.start
        self.vs_t = self._sub(flat.group_slice("v"), self.tslices)
        self.vs_f = self._sub(flat.group_slice("v"), self.fslices)

    @staticmethod
    def _sub(group: slice, slices) -> slice | None:
        offset = 0
        for s in slices:
            if s.start <= group.start and group.stop <= s.stop and group.stop > group.start:
                return slice(offset + group.start - s.start, offset + group.stop - s.start)
            offset += s.stop - s.start
        return None

    def gather(self, vec: torch.Tensor, frozen: bool = False) -> torch.Tensor:
        """The trainable (or frozen) entries of a flat vector, as one vector."""
        slices = self.fslices if frozen else self.tslices
        if not slices:
            return vec.new_zeros(0)
        return torch.cat([vec[s] for s in slices]) if len(slices) > 1 else vec[slices[0]]

    def scatter(self, row: torch.Tensor, out: torch.Tensor) -> None:
        """Write a trainable-entries vector into its places in the flat vector `out`."""
        offset = 0
        for s in self.tslices:
            n = s.stop - s.start
            out[s].copy_(row[offset:offset + n])
            offset += n


def _complement(slices, n: int) -> list[slice]:
    """The entries of [0, n) outside the ordered, disjoint `slices`, as slices in order."""
    out, start = [], 0
    for s in slices:
        if s.start > start:
            out.append(slice(start, s.start))
        start = s.stop
    if start < n:
        out.append(slice(start, n))
    return out


def chunk_size(cfg, layout: EntryMap, model: nn.Module, setup, n: int) -> int:
    """Clients per chunk: cfg.engine_chunk, or as many as fit MEMORY_BUDGET (estimate: the stacked
    weights, gradients and optimiser state, and the activations of one batch, per client)."""
    if cfg.engine_chunk:
        return min(cfg.engine_chunk, n)
    per_client = 8 * layout.nt * setup.flat.element_size + _activation_bytes(model, setup) * cfg.batch_size
    budget = MEMORY_BUDGET.get(setup.device.type, MEMORY_BUDGET["cpu"])
    return max(1, min(n, budget // max(per_client, 1)))


def _activation_bytes(model: nn.Module, setup) -> int:
    """Bytes of every module's output for one sample, twice over (a proxy for what backward keeps)."""
    cached = getattr(setup, "_activation_bytes", None)
    if cached is not None:
        return cached
    total = [0]

    def hook(_m, _inp, out):
        if isinstance(out, torch.Tensor):
            total[0] += out.numel() * out.element_size()

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with torch.no_grad():
            model(setup.x[:1])
    finally:
        for h in handles:
            h.remove()
    setup._activation_bytes = 2 * total[0]
    return setup._activation_bytes


_STEPS: dict = {}  # architecture and layout -> the (compiled) vmapped step, shared by the runs of a process


def _step(model: nn.Module, layout: EntryMap, amp: bool, compile: bool):
    """`step(W, frozen, buffers, x, y, w) -> (G, loss)`: every stacked client's weighted-mean loss on its own
    batch and its gradient in the trainable layout, for weights W (clients, trainable entries).

    The function runs a template copy of the model (its own weights are never used: every parameter
    comes from W or `frozen`), so one compiled step serves every run of the same architecture and
    stage in a process; torch.compile's cache on disk serves later processes. timm's attention runs
    its explicit softmax path: the fused kernel has no vmap batching rule on CPU (vmap would fall back
    to a per-client loop)."""
    arch = (type(model).__name__, tuple((n, tuple(p.shape)) for n, p in model.named_parameters()),
            tuple((n, tuple(b.shape)) for n, b in model.named_buffers()))
    key = (arch, tuple(t[0] for t in layout.trainable), amp, compile, next(model.parameters()).device.type)
    if key in _STEPS:
        return _STEPS[key]
    template = copy.deepcopy(model).train()
    for m in template.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    trainable, frozen = layout.trainable, layout.frozen
    device = next(model.parameters()).device

    def loss_fn(tparams, fparams, buffers, xb, yb, wb):
        out = functional_call(template, (tparams, fparams, buffers), (xb,))
        return (F.cross_entropy(out, yb, reduction="none") * wb).sum() / wb.sum()

    batched_grad = vmap(grad_and_value(loss_fn), in_dims=(0, None, None, 0, 0, 0), randomness="error")

    def step(W, frozen_vec, buffers, xb, yb, wb):
        a = W.shape[0]
        tparams = {name: W[:, lo:hi].view(a, *shape) for name, shape, lo, hi in trainable}
        fparams = {name: frozen_vec[lo:hi].view(shape) for name, shape, lo, hi in frozen}
        with autocast(amp, device):
            grads, loss = batched_grad(tparams, fparams, buffers, xb, yb, wb)
        G = torch.cat([grads[name].reshape(a, -1) for name, _, _, _ in trainable], dim=1)
        return G.float(), loss.detach().float()

    if compile:
        step = _compiled(step)
    _STEPS[key] = step
    return step


def _compiled(step):
    """torch.compile(step) (dynamic in the number of clients); on a compiler error, a warning and eager."""
    compiled = torch.compile(step, dynamic=True)
    state = {"fn": compiled}

    def run(*args):
        try:
            return state["fn"](*args)
        except Exception as e:  # noqa: BLE001 - a missing C++ compiler etc.: keep training, eagerly
            if state["fn"] is step:
                raise
            warnings.warn(f"engine_compile: torch.compile failed ({type(e).__name__}: {str(e)[:200]}); "
                          f"the batched engine runs eagerly", RuntimeWarning, stacklevel=2)
            state["fn"] = step
            return step(*args)

    return run


def _client_batches(order, sizes, B: int):
    """(steps, B) positions into `order` and 0/1 weights: step k holds batch k, padded with weight 0."""
    sizes_t = torch.tensor(sizes, device=order.device)
    starts = torch.cumsum(sizes_t, 0) - sizes_t
    ar = torch.arange(B, device=order.device)
    valid = ar[None, :] < sizes_t[:, None]
    pos = torch.where(valid, starts[:, None] + ar[None, :], 0)
    return pos, valid


def train_chunk(setup, layout: EntryMap, rule: UpdateRule, lr: float, x_global: torch.Tensor, clients: list, *,
                anchor_coeff=0.0, value_l2=0.0, value_mode="ridge") -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Train `clients` (objects with idx, gen, correction, mask: fedfrozen.engine.clients.ClientWork) from x_global at
    once,
    each step by `rule` (the run's, fedfrozen.nets.update.UpdateRule: each client's mask, the clip, the core) at rate
    `lr`. Returns, per client in the given order, (trained trainable entries, summed loss tensor, number of steps).
    """
    if not rule.plain:
        raise ValueError("the batched engine steps one plain rule for every client; a method that transforms the "
                         "local update rule (FedAdamW's line) runs on the sequential engine")
    cfg, model, device = setup.cfg, setup.model, setup.device
    n = len(clients)
    plans = [draw_batches(setup, c.idx, c.gen, cfg.local_epochs, cfg.local_steps) for c in clients]
    steps = [len(p[1]) for p in plans]
    rank = sorted(range(n), key=lambda i: -steps[i])  # stable: longest first, ties in the given order
    K = steps[rank[0]]
    active = [sum(s > k for s in steps) for k in range(K)]
    B = max(max(p[1]) for p in plans)

    # per step k and stacked client j: sample indices, augmentation, weights (padded, weight 0)
    idx = torch.zeros(K, n, B, dtype=torch.long, device=device)
    weight = torch.zeros(K, n, B, device=device)
    aug = torch.zeros(K, n, B, 3, dtype=torch.long, device=device) if plans[0][2] is not None else None
    for j, i in enumerate(rank):
        order, sizes, a = plans[i]
        pos, valid = _client_batches(order, sizes, B)
        k = len(sizes)
        idx[:k, j] = order[pos]
        weight[:k, j] = valid.to(weight.dtype)
        if aug is not None:
            aug[:k, j] = a[pos]

    x_t = layout.gather(x_global)
    anchor_t = x_t
    W = x_t.repeat(n, 1)
    m = torch.zeros_like(W)
    v = torch.zeros_like(W) if rule.kind == "adamw" else None
    corr_full = [clients[i].correction for i in rank]
    corr = None
    if any(c is not None for c in corr_full):
        corr = torch.stack([layout.gather(c) if c is not None else x_t.new_zeros(layout.nt) for c in corr_full])
    masks_full = [clients[i].mask for i in rank]
    mask = None
    if any(mk is not None for mk in masks_full):
        mask = torch.stack([layout.gather(mk) if mk is not None else x_t.new_ones(layout.nt) for mk in masks_full])
    extra_sq = _frozen_sq(layout, x_global, corr_full, masks_full, value_l2, value_mode) if rule.clip else None
    decay = rule.decay(mask, lr)

    frozen_vec = layout.gather(x_global, frozen=True)
    buffers = dict(model.named_buffers())
    step = _step(model, layout, cfg.amp, cfg.engine_compile)
    loss_sum = torch.zeros(n, device=device)
    with torch.no_grad():
        for k in range(K):
            a = active[k]
            # compiled: the step runs on a bucketed number of rows (a power of two, or the chunk), so that
            # a run compiles a few shapes, not one per count; the extra rows (finished clients) are dropped
            rows = min(n, 1 << (a - 1).bit_length()) if cfg.engine_compile else a
            Wk = W[:a]
            b = idx[k, :rows].reshape(-1)
            xb = setup.x[b]
            if aug is not None:
                xb = augment.apply(xb, aug[k, :rows].reshape(-1, 3))
            wk = weight[k, :rows]
            if rows > a:
                wk = torch.cat([wk[:a], torch.ones_like(wk[a:])])  # finished clients: any finite loss
            with torch.enable_grad():
                G, loss = step(W[:rows], frozen_vec, buffers, xb.view(rows, B, *xb.shape[1:]),
                               setup.y[b].view(rows, B), wk)
            G, loss = G[:a], loss[:a]
            grad_terms(G, Wk, anchor=anchor_t, anchor_coeff=anchor_coeff,
                       correction=None if corr is None else corr[:a], value_l2=value_l2, value_mode=value_mode,
                       vs=layout.vs_t)
            rule.gradient(G, None if mask is None else mask[:a], None if extra_sq is None else extra_sq[:a])
            d = None if decay is None else decay[:a]
            rule.apply(Wk, G, m[:a], None if v is None else v[:a], k + 1, lr, d)
            loss_sum[:a] += loss
    out: list = [None] * n
    for j, i in enumerate(rank):
        out[i] = (W[j], loss_sum[j], steps[i])
    return out


def _frozen_sq(layout: EntryMap, x_global, corrections, masks, value_l2, value_mode) -> torch.Tensor:
    """Per client, the squared norm of the gradient terms on frozen entries after its mask (constant over its steps:
    the frozen weights do not move), which the clip's norm over the whole buffer includes (fedfrozen.nets.update)."""
    rows = []
    x_f = layout.gather(x_global, frozen=True)
    for c, mk in zip(corrections, masks):
        g = torch.zeros_like(x_f)
        grad_terms(g, x_f, anchor=x_f, correction=None if c is None else layout.gather(c, frozen=True),
                   value_l2=value_l2, value_mode=value_mode, vs=layout.vs_f)
        apply_mask(g, None if mk is None else layout.gather(mk, frozen=True))
        rows.append(g.pow(2).sum())
    return torch.stack(rows)[:, None] if rows else None
