"""One federated round as two messages, shared by `fedfrozen.loop.run` and the Flower apps (fedfrozen.flower).

The server sends each sampled client an `Instruction` (the round, the global weights, the stage, the round's rate,
value penalty and prox weight, and `sent`: what the method's server half has for that client's half); the client
answers with a `Reply` (its update, its share p_i, its training loss and steps, and `extras`: what its half sends
the server's). The server's side is `Round`, holding the method's server half; the clients' side is `LocalTraining`
(either engine), holding the clients' half, whose `replies` turns instructions into replies. `play` is the round's
order, written once: the loop runs it with `LocalTraining.replies` as the exchange, the Flower ServerApp with its
nodes (fedfrozen.flower.server), and the Flower ClientApp answers with the same `LocalTraining.replies`:

    s, rnd, hist, first = loop.start_up(cfg, method, client=client)   # the same start for both (fresh or resumed)
    clients = LocalTraining(s, client, use_batched)                    # the clients' half, in this process
    stop = play(rnd, r, hist, lambda plan, ins: (clients.replies(ins), {}))
        plan = rnd.open(r)                       # stage switch, lr, value penalty, sampling (server half)
        replies = exchange(plan, rnd.instructions(plan))   # to_client; local training; to_server
        rnd.receive(plan, reply) for each        # from_client, aggregate, drift sums, loss and bytes
        rnd.finish(plan, hist, started)          # server step, the stage's freeze, measurements: the row

A client's hooks run on its side, in one order wherever it trains (fedfrozen.methods.base lists it): from_server,
client_mask (unless the server sent the mask), init_client, client_forward, correction, (training), upload,
after_client, to_server; the server's side then takes the reply (from_client, aggregate) and counts its bytes
(client_mask, client_bytes).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from . import batched, local, qkv
from .flat import merged_slices
from .rng import seed_for

__all__ = ["Plan", "Instruction", "Reply", "Tally", "ClientWork", "Round", "LocalTraining", "play", "exchanged_bytes",
           "evaluate_round", "round_metrics", "lr_at"]

_EPS = 1e-12


@dataclass(kw_only=True)
class Plan:
    """What round r is: decided by `Round.open` before any client trains (built by keyword)."""

    r: int
    frozen: tuple            # groups no client trains
    lr: float                # the clients' local lr
    value_l2: float          # lambda of the value penalty
    sampled: list            # the clients of the round, in order
    weights: np.ndarray      # their data shares among the sampled (p_i)
    anchor_coeff: float      # the local objective's prox weight
    switched: bool           # the stage changed at this round (fresh optimiser, frozen block sent again)
    mask: torch.Tensor       # 0/1 over the flat buffer: the entries of the groups this stage trains
    trainable_bytes: int     # bytes of those groups

    @property
    def stage(self) -> int:
        return 2 if self.frozen else 1


@dataclass
class Tally:
    """What the round's replies add up to (Round.receive), for its History row."""

    client_sq: dict          # group -> sum_i p_i ||D_i,g||^2 (drift)
    bytes_down: int = 0
    bytes_up: int = 0
    train_loss: float = 0.0  # sum_i p_i loss_i over the replies received


@dataclass(frozen=True, kw_only=True)
class Instruction:
    """What the server sends client `cid` in round r (Round.instructions; on Flower, its records)."""

    r: int
    cid: int
    weight: float                      # p_i: the client's share of the sampled clients' training examples
    weights: torch.Tensor              # the global flat weights x (read only)
    frozen: tuple                      # the groups this stage freezes
    stage_mask: torch.Tensor           # 0/1 over the flat buffer: the groups this stage trains
    lr: float                          # the local rate of the round
    value_l2: float                    # lambda of the value penalty
    anchor_coeff: float                # the local objective's prox weight
    value_mode: str = "ridge"          # the value penalty's form (Config.value_l2_mode: ridge | prox)
    sent: dict = field(default_factory=dict)  # the server half's Method.to_client for this client ("mask": the
    #                                           client's mask, where the server decides it)


@dataclass(frozen=True, kw_only=True)
class Reply:
    """What client `cid` sends back: its update after Method.upload, as a view of the clients' side's buffer (valid
    until the next reply), what the server counts, and what its half of the method sends the server's."""

    cid: int
    weight: float                 # p_i, as instructed
    update: torch.Tensor          # client - global weights, as Method.upload left it
    loss: float                   # mean training loss over its steps
    steps: int
    extras: dict = field(default_factory=dict)  # the clients' half's Method.to_server


@dataclass
class ClientWork:
    """One sampled client's local training in this process."""

    ins: Instruction               # what the server sent it
    idx: torch.Tensor              # its training indices
    gen: torch.Generator           # its batch order this round
    mask: torch.Tensor | None      # the method's per-client mask (None: every trainable entry)
    trains: torch.Tensor           # what it trains: mask within the stage's groups
    forward: object = None         # the method's client_forward, or None
    correction: torch.Tensor | None = None
    loss_sum: torch.Tensor | None = None
    steps: int = 0

    @property
    def cid(self) -> int:
        return self.ins.cid

    @property
    def loss(self) -> float:
        return (self.loss_sum / self.steps).item()


def lr_at(cfg, r: int) -> float:
    """The local lr of round r: a linear warm-up over lr_warmup_rounds, then constant or cosine decay. The one
    schedule: every round's Instruction carries it, on both engines and on Flower."""
    w = cfg.lr_warmup_rounds
    if r < w:
        return cfg.lr * (r + 1) / (w + 1)
    if cfg.lr_schedule == "cosine":
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * (r - w) / (cfg.rounds - w)))
    return cfg.lr


class Round:
    """The server's side of every round: the global weights `x`, the accumulator, the stage and what each
    client already holds of the frozen block."""

    def __init__(self, s, method):
        self.s, self.method = s, method
        self.x = s.flat.data.clone()
        self.acc = torch.empty_like(self.x)
        self.received_frozen: set[int] = set()  # clients that hold the current frozen block
        self.current: tuple = ()
        self.value_mode = s.cfg.value_l2_mode  # the penalty's form, one for the run

    def start(self, first: int) -> None:
        """Before round `first` (0, or the round a resume continues at, with x and the method state loaded)."""
        self.s.flat.data.copy_(self.x)
        self.prev_kernels = qkv.attention_kernels(self.s.model)
        self.current = self.method.frozen_groups(first - 1) if first > 0 else ()
        self._set_stage(self.current)

    def _set_stage(self, frozen: tuple) -> None:
        flat = self.s.flat
        trainable = [g for g in qkv.GROUPS if g not in frozen]
        self.mask = flat.mask(trainable)
        self.frozen_slices = merged_slices(flat, frozen)  # what the round keeps in place after the server step
        self.trainable_bytes, self.frozen_bytes = flat.group_bytes(trainable), flat.group_bytes(frozen)

    def open(self, r: int) -> Plan:
        """Stage switch (fresh optimiser, method state and frozen-block delivery), lr, value penalty, sampling."""
        method = self.method
        frozen = method.frozen_groups(r)
        switched = frozen != self.current
        if switched:
            self._set_stage(frozen)
            method.on_stage_switch(frozen)
            self.received_frozen.clear()
            self.current = frozen
        value_l2 = method.value_penalty(r)
        lr = lr_at(self.s.cfg, r)
        sampled = method.sample_clients(r)
        sizes = self.s.client_sizes[sampled]
        weights = sizes / sizes.sum() if sampled else np.zeros(0)
        self.acc.zero_()
        method.begin_round(r, sampled)
        self.tally = Tally(client_sq={g: torch.zeros((), device=self.x.device) for g in qkv.GROUPS})
        return Plan(r=r, frozen=frozen, lr=lr, value_l2=value_l2, sampled=sampled, weights=weights,
                    anchor_coeff=method.anchor_coeff(), switched=switched, mask=self.mask,
                    trainable_bytes=self.trainable_bytes)

    def instructions(self, plan: Plan) -> list[Instruction]:
        """One Instruction per sampled client, in the sampled order, with what the method's server half has for it
        (Method.to_client; in this process the global weights and the tensors as they are, read only)."""
        return [Instruction(r=plan.r, cid=cid, weight=float(plan.weights[j]), weights=self.x, frozen=plan.frozen,
                            stage_mask=plan.mask, lr=plan.lr, value_l2=plan.value_l2, anchor_coeff=plan.anchor_coeff,
                            value_mode=self.value_mode, sent=self.method.to_client(plan.r, cid))
                for j, cid in enumerate(plan.sampled)]

    def receive(self, plan: Plan, reply: Reply) -> None:
        """A client's reply into the round: what its half sent (the method's from_client), its update into the
        accumulator (aggregate), the drift sums, its share of the training loss, and its (down, up) bytes by the
        method's count (`exchanged_bytes`, by the mask the server's half knows it trained by), the frozen block
        once per stage."""
        tally, weight, method = self.tally, reply.weight, self.method
        method.from_client(plan.r, reply.cid, reply.extras, weight)
        method.aggregate(self.acc, reply.cid, reply.update, weight)
        for g, sq in self.s.flat.group_sq_norms(reply.update).items():
            tally.client_sq[g] += weight * sq
        tally.train_loss += weight * reply.loss
        down, up = exchanged_bytes(self.s, method, plan, reply.cid, method.client_mask(plan.r, reply.cid))
        tally.bytes_down += down + self.frozen_block_bytes(plan, reply.cid)
        tally.bytes_up += up

    def finish(self, plan: Plan, hist, started: float, joined=None, **columns) -> bool:
        """Close the round (`close`) and append its History row with its bytes, `columns` (Flower adds what its
        records weighed) and its seconds since `started` (time.perf_counter); then the method's on_round_end.
        Returns whether the method asks to stop."""
        joined = plan.sampled if joined is None else joined
        row = self.close(plan, self.tally.train_loss if joined else math.nan, joined)
        row["bytes_down"], row["bytes_up"] = self.tally.bytes_down, self.tally.bytes_up
        row.update(columns)
        row["seconds"] = time.perf_counter() - started
        hist.append(row)
        return self.method.on_round_end(plan.r, hist.rows[-1], hist) is True

    def frozen_block_bytes(self, plan: Plan, cid) -> int:
        """Bytes of the frozen block sent to client `cid` this round: once per stage, 0 afterwards."""
        if not plan.frozen or cid in self.received_frozen:
            return 0
        self.received_frozen.add(cid)
        return self.frozen_bytes

    def close(self, plan: Plan, train_loss: float, joined=None) -> dict:
        """Server step on the aggregate of `joined` (default: the sampled; none joined: nothing moves), the
        model measurements and evaluation: the round's History row (the caller adds bytes and time)."""
        joined = plan.sampled if joined is None else joined
        s = self.s
        if joined:  # the method's server step, then the stage's freeze: the frozen entries are put back as they were
            held = [self.x[sl].clone() for sl in self.frozen_slices]
            self.method.server_update(plan.r, self.x, self.acc, self.mask, joined)
            for sl, value in zip(self.frozen_slices, held):
                self.x[sl] = value
        s.flat.data.copy_(self.x)
        row = {"round": plan.r, "stage": plan.stage, "lr": plan.lr, "train_loss": train_loss,
               "clients": [int(c) for c in plan.sampled]}
        kernels = qkv.attention_kernels(s.model)
        row.update(round_metrics(s.flat, self.acc, self.tally.client_sq, plan.frozen, kernels, self.prev_kernels))
        self.prev_kernels = kernels
        row.update(evaluate_round(s, plan.r))
        return row


class LocalTraining:
    """The clients' side of a round: the clients' half of the method (`method`: an instance of its own, set up on
    the same Setup; in this process it keeps every client's state), the local optimiser of the stage and, under the
    batched engine, its layout; `replies` turns each client's Instruction into its Reply, in order. The stage comes
    with the instructions: the first one configures it, a later one that freezes other groups switches it (a fresh
    local optimiser; the clients' half drops the old stage's state)."""

    def __init__(self, s, method, use_batched: bool):
        self.s, self.method, self.use_batched = s, method, use_batched
        self.delta = torch.empty_like(s.flat.data)  # the update of the client being replied for
        self.frozen = None  # the stage configured (None: none yet)

    def configure(self, mask: torch.Tensor) -> None:
        """The stage's trainable `mask` (Round.mask, Plan.mask) goes to the local update rule, which alone decides
        what moves (fedfrozen.update: its state, requires_grad); the batched engine stacks the rule's slices."""
        s = self.s
        self.opt = local.make_optimizer(s.cfg, s.flat, mask, model=s.model)
        self.layout = batched.EntryMap(s.model, s.flat, self.opt.slices) if self.use_batched else None

    def _stage(self, ins: Instruction) -> None:
        """The instruction's stage: configured at the first, switched when it changes."""
        if ins.frozen == self.frozen:
            return
        if self.frozen is not None:
            self.method.on_stage_switch(ins.frozen)
        self.frozen = ins.frozen
        self.configure(ins.stage_mask)

    def _prepare(self, ins: Instruction) -> ClientWork:
        """The hooks before client `ins.cid` trains; the model holds the global weights, the optimiser a fresh
        state."""
        s, method, r, cid = self.s, self.method, ins.r, ins.cid
        self._stage(ins)
        opt = self.opt
        s.flat.data.copy_(ins.weights)
        method.from_server(r, cid, ins.sent)
        opt.reset()  # a fresh local optimiser state and the run's rule, per client per round
        sent_mask = ins.sent.get("mask")
        cmask = method.client_mask(r, cid) if sent_mask is None else sent_mask.to(s.flat.data.dtype)
        opt.mask = cmask  # the rule applies it (fedfrozen.update)
        trains = ins.stage_mask if cmask is None else cmask * ins.stage_mask
        method.init_client(r, cid, None if self.use_batched else opt, trains)
        seed = seed_for("local_batches", s.cfg.seed, r, cid)
        if not self.use_batched:  # (the batched engine refuses models with random layers)
            torch.manual_seed(seed)  # dropout / stochastic depth, if the model has any
        c = ClientWork(ins, s.client_train[cid], torch.Generator().manual_seed(seed), cmask, trains,
                       method.client_forward(r, cid), method.correction(cid))
        if self.use_batched and c.forward is not None:
            raise RuntimeError(f"method {method.name!r} gave a client_forward under the batched engine; "
                               f"set its `batched = False`")
        return c

    def _reply(self, c: ClientWork) -> Reply:
        """The model holds client `c`'s trained weights: its update (client - global), as the method uploads it,
        the method's after-hook, and the Reply with what the clients' half sends up."""
        ins, method = c.ins, self.method
        delta = torch.sub(self.s.flat.data, ins.weights, out=self.delta)
        method.upload(ins.r, c.cid, delta)
        method.after_client(ins.r, c.cid, delta, c.steps, ins.lr, c.trains)
        return Reply(cid=c.cid, weight=ins.weight, update=delta, loss=c.loss, steps=c.steps,
                     extras=dict(method.to_server(ins.r, c.cid)))

    def replies(self, instructions):
        """Each instructed client's Reply, in order (a generator: the caller receives each before the next client
        prepares). Sequentially a client's hooks before training run after the previous client's reply was
        received; the batched engine prepares a whole chunk first."""
        s, cfg = self.s, self.s.cfg
        instructions = list(instructions)
        n = len(instructions)
        if n:
            self._stage(instructions[0])
        chunk = max(1, batched.chunk_size(cfg, self.layout, s.model, s, n)) if self.use_batched else 1
        for c0 in range(0, n, chunk):
            clients = []
            for ins in instructions[c0:c0 + chunk]:
                c = self._prepare(ins)
                if not self.use_batched:
                    c.loss_sum, c.steps = local.train(
                        s, self.opt, ins.lr, c.idx, c.gen, epochs=cfg.local_epochs, steps=cfg.local_steps,
                        anchor=ins.weights, anchor_coeff=ins.anchor_coeff, correction=c.correction,
                        value_l2=ins.value_l2, value_mode=ins.value_mode, forward=c.forward)
                    yield self._reply(c)
                    continue
                clients.append(c)
            if not self.use_batched:
                continue
            first = clients[0].ins  # (one rate, penalty and prox weight for the whole round)
            s.flat.data.copy_(first.weights)
            trained = batched.train_chunk(s, self.layout, self.opt.base, first.lr, first.weights, clients,
                                          anchor_coeff=first.anchor_coeff, value_l2=first.value_l2,
                                          value_mode=first.value_mode)
            for c, (weights, loss_sum, steps) in zip(clients, trained):
                s.flat.data.copy_(first.weights)
                self.layout.scatter(weights, s.flat.data)  # the model holds the client's trained weights
                c.loss_sum, c.steps = loss_sum, steps
                yield self._reply(c)


def play(rnd: Round, r: int, hist, exchange) -> bool:
    """Round r in its order, written once: the loop runs it with its clients in this process, the Flower ServerApp
    with its nodes. Opens the round (stage switch, rate, value penalty, sampling), gives `exchange(plan,
    instructions)` one Instruction per sampled client and takes back (replies, columns): the replies of the clients
    that trained, in the sampled order (an iterable: in process each is received before the next client trains),
    and columns for the History row (Flower: what its records weighed, failures). Each reply is received (from_client,
    aggregate, drift, bytes) unless its loss is not finite: then `hist.diverged` says where, nothing more is taken and
    no row is written. Else the round closes (server step on the replies received, the stage's freeze, measurements,
    evaluation: the row). Returns whether the run stops (diverged, or the method asks)."""
    started = time.perf_counter()
    plan = rnd.open(r)
    replies, columns = exchange(plan, rnd.instructions(plan))
    joined = []
    for reply in replies:
        if not math.isfinite(reply.loss):
            hist.diverged = {"round": r, "client": reply.cid}
            warnings.warn(f"run diverged: non-finite loss at round {r}, client {reply.cid}; stopping",
                          RuntimeWarning, stacklevel=2)
            return True
        rnd.receive(plan, reply)
        joined.append(reply.cid)
    return rnd.finish(plan, hist, started, joined=joined, **columns)


def exchanged_bytes(s, method, plan: Plan, cid: int, mask) -> tuple[int, int]:
    """Client `cid`'s (down, up) bytes this round by the method's count (client_bytes): `payload` is what it trains
    (its mask within the stage's groups), `trainable` every trainable group. The loop and the Flower server both
    count this way (Flower's rows add what its records weighed as the *_wire columns)."""
    payload = plan.trainable_bytes if mask is None else int((mask * plan.mask).count_nonzero()) * s.flat.element_size
    return method.client_bytes(plan.r, cid, payload, plan.trainable_bytes)


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


@torch.no_grad()
def evaluate(model, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024, amp: bool = False):
    """(mean loss, accuracy, per-sample correctness) of `model` on (x, y)."""
    model.eval()
    if len(y) == 0:
        return float("nan"), float("nan"), torch.zeros(0, dtype=torch.bool)
    losses, correct = [], []
    for i in range(0, len(y), batch_size):
        with local.autocast(amp, x.device):
            out = model(x[i:i + batch_size]).float()
        losses.append(F.cross_entropy(out, y[i:i + batch_size], reduction="sum"))
        correct.append(out.argmax(1) == y[i:i + batch_size])
    correct = torch.cat(correct)
    return (torch.stack(losses).sum() / len(y)).item(), correct.float().mean().item(), correct


def evaluate_round(s, r: int) -> dict:
    """The evaluation columns of round r's row (None on rounds that are not evaluated)."""
    cfg = s.cfg
    keys = ("test_loss", "test_acc", "val_loss", "val_acc", "client_acc_mean", "client_acc_worst10",
            "client_acc_std")
    groups = getattr(s, "test_groups", [])  # a feature shift: the test set as each group sees it (fedfrozen.shift)
    if groups:
        keys += (*(f"test_acc_g{g}" for g in range(len(groups))), "test_acc_worst")
    final = getattr(s, "test_final", None)  # natural clients: a larger test sample at the last round
    if final is not None:
        keys += ("test_loss_final", "test_acc_final")
    if (r + 1) % cfg.eval_every and r < cfg.rounds - max(cfg.eval_window, 1):
        return dict.fromkeys(keys)
    out = {}
    if groups:  # each group's accuracy; test_loss and test_acc their means, test_acc_worst the lowest
        measured = [evaluate(s.model, x, s.test_y, amp=cfg.amp)[:2] for x in groups]
        out["test_loss"] = sum(loss for loss, _ in measured) / len(groups)
        out["test_acc"] = sum(acc for _, acc in measured) / len(groups)
        out.update({f"test_acc_g{g}": acc for g, (_, acc) in enumerate(measured)})
        out["test_acc_worst"] = min(acc for _, acc in measured)
    else:  # (natural clients: a fixed sample of their test text on every evaluated round)
        out["test_loss"], out["test_acc"], _ = evaluate(s.model, s.test_x, s.test_y, amp=cfg.amp)
    if final is not None:  # ... and a larger one at the last round
        out["test_loss_final"], out["test_acc_final"] = (evaluate(s.model, *final, amp=cfg.amp)[:2]
                                                         if r == cfg.rounds - 1 else (None, None))
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


