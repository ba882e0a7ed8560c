"""The clients' side of a round: `LocalTraining` holds the method's clients' half and turns each client's
Instruction into its Reply (local training on either engine), in this process and in the Flower ClientApp alike."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..base.rng import seed_for
from . import batched, local
from .messages import Instruction, Reply

__all__ = ["ClientWork", "LocalTraining"]


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
        what moves (fedfrozen.nets.update: its state, requires_grad); the batched engine stacks the rule's slices."""
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
        opt.mask = cmask  # the rule applies it (fedfrozen.nets.update)
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
