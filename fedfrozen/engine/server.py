"""The server's side of a round: `Round` holds the global weights and the method's server half; it opens round r
(stage switch, rate, value penalty, sampling: a Plan), writes each sampled client's Instruction, receives the
Replies (from_client, aggregate, drift, bytes) and closes the round (server step, the stage's freeze, measurements:
the History row). `lr_at` is the one schedule of the local rate."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..nets import qkv
from ..nets.flat import merged_slices
from .messages import Instruction, Plan, Reply
from .metrics import evaluate_round, round_metrics

__all__ = ["Tally", "Round", "lr_at", "exchanged_bytes"]


@dataclass
class Tally:
    """What the round's replies add up to (Round.receive), for its History row."""

    client_sq: dict          # group -> sum_i p_i ||D_i,g||^2 (drift)
    bytes_down: int = 0
    bytes_up: int = 0
    train_loss: float = 0.0  # sum_i p_i loss_i over the replies received


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


def exchanged_bytes(s, method, plan: Plan, cid: int, mask) -> tuple[int, int]:
    """Client `cid`'s (down, up) bytes this round by the method's count (client_bytes): `payload` is what it trains
    (its mask within the stage's groups), `trainable` every trainable group. The loop and the Flower server both
    count this way (Flower's rows add what its records weighed as the *_wire columns)."""
    payload = plan.trainable_bytes if mask is None else int((mask * plan.mask).count_nonzero()) * s.flat.element_size
    return method.client_bytes(plan.r, cid, payload, plan.trainable_bytes)
