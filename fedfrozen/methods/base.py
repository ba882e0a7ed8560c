"""`Method`: the hooks a round calls (fedfrozen.engine.round, in the loop and on Flower), FedAvg's behaviour by default.

A method runs as two halves, two instances of its class built from the same Config: the server's half (held by
`fedfrozen.engine.server.Round`) and the clients' half (held by `fedfrozen.engine.clients.LocalTraining`: in this
process one
instance keeps every client's state, as Flower's nodes keep theirs in their Context.state; on Flower each node
builds its own for the round). The halves talk only in records, the same in process as on Flower: the server's
`to_client(r, i)` is the Instruction's `sent`, the client's `to_server(r, i)` the Reply's `extras`, and no hook
of one half reads or writes the other's state. The round owns the resident model, the flat buffers, the order of
events and the stage's freeze (the server step is followed by putting the frozen entries back); at each point
where methods differ it calls a hook:

    (self.settings: the method's own settings, Config.method_args, checked when the Method is built)
    setup(setup)                                  once per half, before round 0 (or a resume)
    per round r, in this order (tests/test_methods.py records it under both engines, tests/test_hook_order.py
    under the loop and under Flower for every registered method):
      server's half
        frozen_groups(r)                          groups no client trains this round (stage switch when it changes)
        on_stage_switch(frozen)                   when frozen_groups changed: drop state of the old stage (each half)
        value_penalty(r)                          lambda of the value penalty this round
        sample_clients(r)                         participation
        begin_round(r, sampled)
        anchor_coeff()                            the local objective's prox weight this round
        to_client(r, i)                           per sampled client: what its half needs (the Instruction's `sent`;
                                                  "mask": its mask when the server decides it)
      clients' half, per sampled client i (under the batched engine every client of a chunk passes the hooks
      before training first):
        from_server(r, i, sent)                   what the server sent (its own state for the round from it)
        client_mask(r, i)                         unless `sent` holds "mask": a finer trainable mask (None: all)
        init_client(r, i, opt, mask)              the local optimiser's state and rule; pre-training (SCAFFOLD I)
        client_forward(r, i)                      None, or a forward(batch indices, inputs) replacing the model's
        correction(i)                             the local objective's gradient correction (SCAFFOLD, FedDyn)
        (the client trains; the model then holds its weights)
        upload(r, i, delta)                       rewrite the update into what the client sends (in place; FedSLM)
        after_client(r, i, delta, steps, lr, mask)  the client's own state from its update (c_i, h_i, caches)
        to_server(r, i)                           what the server's state needs from it (the Reply's `extras`)
      server's half, per reply in the sampled order
        from_client(r, i, extras, weight)         fold what the client sent into the server's state
        aggregate(acc, i, delta, weight)          fold the upload into the round's accumulator (in place)
        client_mask(r, i), client_bytes(r, i, payload, trainable)   exact bytes down and up
      server's half, closing
        server_update(r, x, acc, mask, sampled)   the server step on the aggregated update (not when nobody joined);
                                                  the round then puts the frozen groups back
        on_round_end(r, row, history)             sees the History row; True stops the run
    on Flower a node's half is fresh each round: client_state(i) after the round is kept in its Context.state and
    given back by load_client_state(i, state) before from_server in its next round of the same stage
    state_dict() / load_state_dict()              everything needed for a bit-exact resume (both halves are saved)

Most methods are compositions of three parts, each replaceable by name through Config: a local
objective (fedfrozen.methods.objective, .scaffold, .feddyn), a server optimiser (.fedopt) and a
freezing schedule (.freezing). A new method either names a composition in the registry or
subclasses Method and overrides the hooks it changes (docs/methods.md has an example).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ..base.rng import seed_for
from .feddyn import FedDyn
from .fedopt import ServerOptimizer
from .freezing import FREEZE_SCHEDULES
from .objective import LocalObjective, Prox
from .scaffold import Scaffold
from .settings import Settings, component, setting

__all__ = ["Method", "LOCAL_OBJECTIVES", "PROBE", "probe_loss", "participation_probabilities", "RUNTIMES",
           "CLIENT_HOOKS", "ValuePenaltySettings", "ParticipationSettings"]

# where a method may be asked to run besides the sequential loop (Method.cannot_run)
RUNTIMES = ("batched", "flower")
# the hooks the clients' half runs (fedfrozen.engine.clients.LocalTraining), in process and on Flower alike;
# client_mask is
# also asked by the server's half (for a client's bytes, and by to_client where the server decides the mask)
CLIENT_HOOKS = ("from_server", "client_mask", "init_client", "client_forward", "correction", "upload", "after_client",
                "to_server")

PROBE = 128  # samples of a client that methods evaluate on (importance, gains, confidences)

LOCAL_OBJECTIVES = {"plain": LocalObjective, "prox": Prox, "scaffold": Scaffold, "feddyn": FedDyn}


@component
@dataclass(frozen=True)
class ValuePenaltySettings(Settings):
    """C3's penalty on the value block (Method.value_l2; Config(value_l2=...), --value-l2, ...)."""

    prefix: ClassVar[str] = "value"
    l2: float = setting(0.0, "lambda of the value penalty (stage 2)", lo=0)
    l2_mode: str = setting("ridge", "ridge: lambda/2 ||W_V||^2; prox: lambda/2 ||W_V - W_V^r||^2",
                           choices=("ridge", "prox"))
    l2_warmup: bool = setting(False, "apply the value penalty in stage 1 too")


@component
@dataclass(frozen=True)
class ParticipationSettings(Settings):
    """The skewed participation model (participation_probabilities; Config(participation_rate=...), ...)."""

    prefix: ClassVar[str] = "participation"
    rate: float = setting(0.1, "skewed: C, the expected share of clients per round (sum_i p_i = C N)", lo=0, hi=1,
                          lo_open=True)
    skew: float = setting(5.0, "skewed: a, a seeded half of the clients is (1 + a)x likelier to join", lo=0)


@torch.no_grad()
def probe_loss(setup, cid: int) -> float:
    """Mean loss of the resident model, in eval mode, on the first PROBE training samples of client `cid`."""
    model, idx = setup.model, setup.client_train[cid][:PROBE]
    training = model.training
    model.eval()
    loss = torch.nn.functional.cross_entropy(model(setup.x[idx]), setup.y[idx]).item()
    model.train(training)
    return loss


def participation_probabilities(cfg) -> np.ndarray:
    """p_i of the skewed participation model (FedSteer's, docs/methods.md): a seeded half of the clients is
    (1 + participation_skew)x likelier to join a round than the rest, scaled so that sum_i p_i = C N with
    C = participation_rate. Under `full` every p_i is 1; under `uniform` each is clients_per_round / N."""
    n = cfg.n_clients
    if cfg.participation == "full":
        return np.ones(n)
    if cfg.participation == "uniform":
        return np.full(n, (cfg.clients_per_round or n) / n)
    weight = np.ones(n)
    weight[np.random.default_rng(seed_for("participation", cfg.seed)).permutation(n)[:n // 2]] += cfg.participation_skew
    return cfg.participation_rate * n * weight / weight.sum()


class Method:
    """FedAvg, and the composition of a local objective, a server optimiser and a freezing schedule.

    local, server, schedule: component names (Config.local_objective, server_opt and
    freeze_schedule override them); frozen: the groups the schedule freezes, None for cfg.freeze;
    settings: the settings class read from cfg.method_args (default: the class's `Settings`).
    """

    name = "fedavg"
    # the method's own settings (fedfrozen.methods.settings): a frozen dataclass read as self.settings, given as
    # Config.method_args; the base has none
    Settings = Settings
    # The batched engine (fedfrozen.engine.batched) can train this method's clients at once: its hooks do not
    # replace the forward pass (client_forward) nor use the local optimiser object given to init_client
    # (None under the batched engine). A method that does sets this False.
    batched = True
    # runtime -> why this method cannot run there (RUNTIMES); what `cannot_run` does not infer by itself
    not_on: dict = {}
    # bumped when a method's results change for the same Config (a fix): the results cache keys on it, so a
    # cached History of the old behaviour is not served (fedfrozen.runs.experiments.config_key)
    results_revision = 0

    def __init__(self, cfg, *, local: str = "plain", server: str = "avg", schedule: str = "none",
                 frozen: tuple | None = (), settings: type | None = None):
        self.cfg = cfg
        self.settings = (settings or type(self).Settings).create(cfg.method, cfg.method_args)
        self.settings.check(cfg)
        local = cfg.local_objective or local
        server = cfg.server_opt or server
        schedule = cfg.freeze_schedule or schedule
        if frozen is None or (cfg.freeze_schedule and not frozen):
            frozen = tuple(cfg.freeze)
        if schedule == "none":
            frozen = ()
        if (local == "feddyn") != (server == "feddyn"):
            raise ValueError("local_objective 'feddyn' and server_opt 'feddyn' go together "
                             f"(got local={local!r}, server={server!r})")
        for field, value, table in (("local_objective", local, LOCAL_OBJECTIVES),
                                    ("freeze_schedule", schedule, FREEZE_SCHEDULES)):
            if value not in table:
                raise ValueError(f"{field} must be one of {', '.join(table)}; got {value!r}")
        self.value_l2, self.value_l2_warmup = cfg.value_l2, cfg.value_l2_warmup  # C3's penalty (ValuePenaltySettings)
        self.local = LOCAL_OBJECTIVES[local](cfg)
        self.server = ServerOptimizer(server, cfg)
        self.schedule = FREEZE_SCHEDULES[schedule](cfg, tuple(frozen))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.name!r}: local={self.local.name}, server={self.server.kind}, "
                f"schedule={self.schedule.name}, frozen={self.schedule.groups})")

    # --- where it runs -------------------------------------------------------------------------
    def cannot_run(self, runtime: str) -> str | None:
        """Why this method cannot run on `runtime` ("batched": the batched engine; "flower": the Flower apps), or
        None when it can. The one mechanism the engine choice and Flower ask: the class's `not_on` reason first,
        then what follows from the method's parts (`batched = False`). Every method runs on Flower unless it says
        otherwise: its halves talk in records there as in process."""
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}; got {runtime!r}")
        if type(self).not_on.get(runtime):
            return type(self).not_on[runtime]
        if runtime == "batched" and not self.batched:
            return (f"{type(self).__name__}.batched is False: it replaces the forward pass per client or uses "
                    f"the local optimiser object")
        return None

    # --- setup --------------------------------------------------------------------------------
    def setup(self, setup) -> None:
        """Allocate state; `setup` is the loop's Setup (model, flat buffers, client data)."""
        self.s = setup
        self.local.setup(setup.flat.numel, setup.device)
        self.server.setup(setup.flat.numel, setup.device)
        self.schedule.setup(setup)

    # --- participation ------------------------------------------------------------------------
    def sample_clients(self, r: int) -> list[int]:
        """Clients of round r, by Config.participation: `full` every client; `uniform` clients_per_round drawn
        without replacement (all when unset); `skewed` each client i independently with probability p_i
        (participation_probabilities). Seeded by (seed, r): the same schedule on every run and resume."""
        cfg = self.cfg
        if cfg.participation == "full":
            return list(range(cfg.n_clients))
        if cfg.participation == "skewed":
            rng = np.random.default_rng(seed_for("sampling", cfg.seed, r))
            return [int(i) for i in np.flatnonzero(rng.random(cfg.n_clients) < participation_probabilities(cfg))]
        m = cfg.clients_per_round or cfg.n_clients
        if m >= cfg.n_clients:
            return list(range(cfg.n_clients))
        rng = np.random.default_rng(seed_for("sampling", cfg.seed, r))
        return sorted(int(i) for i in rng.choice(cfg.n_clients, size=m, replace=False))

    # --- what trains --------------------------------------------------------------------------
    @property
    def freeze_at(self) -> int | None:
        return self.schedule.freeze_at

    @property
    def groups_to_freeze(self) -> tuple:
        """The groups the schedule freezes once it freezes."""
        return self.schedule.groups

    def frozen_groups(self, r: int) -> tuple:
        """Groups no client trains, uploads or aggregates in round r."""
        return self.schedule.frozen_at(r)

    def client_mask(self, r: int, cid: int) -> torch.Tensor | None:
        """A 0/1 float mask over the flat parameters that client `cid` trains in round r, within the
        trainable groups; None trains them all. Masked entries get no gradient and no weight decay.
        By default the freezing schedule's mask (the progressive schedule's frozen layers)."""
        return self.schedule.client_mask(r)

    def on_stage_switch(self, frozen: tuple) -> None:
        """The frozen groups changed (each half is told: the server's when it opens the round, the clients' when its
        first instruction of the new stage comes): the state of the old stage is dropped."""
        self.server.reset()
        self.local.reset()

    # --- local objective ----------------------------------------------------------------------
    def value_penalty(self, r: int) -> float:
        """lambda of the value penalty this round: value_l2 once something is frozen (always with value_l2_warmup)."""
        frozen = bool(self.frozen_groups(r))
        return self.value_l2 if (frozen or self.value_l2_warmup) else 0.0

    def anchor_coeff(self) -> float:
        return self.local.anchor_coeff()

    def correction(self, cid: int) -> torch.Tensor | None:
        return self.local.correction(cid)

    def begin_round(self, r: int, sampled: list[int]) -> None:
        """Server's half, after sampling: the round's server state (a client's half starts its round in
        from_server)."""
        self.local.begin_round()

    def init_client(self, r: int, cid: int, opt, mask: torch.Tensor) -> None:
        """Before client `cid` trains (the model holds the global weights, `opt` a fresh state and the run's
        local update rule, which a method may transform for this client: `opt.rule = dataclasses.replace(opt.rule,
        ...)`, fedfrozen.nets.update; None under the batched engine, whose clients of a chunk all pass here before any
        of
        them trains)."""
        self.local.before_client(r, cid, self.s, mask)

    def client_forward(self, r: int, cid: int):
        """None (the model's own forward), or `forward(batch_indices, inputs) -> logits` for client `cid`'s
        local steps this round, e.g. one that starts from cached activations of a frozen prefix."""
        return None

    def after_client(self, r: int, cid: int, delta: torch.Tensor, steps: int, lr: float,
                     mask: torch.Tensor) -> None:
        """Clients' half, after client `cid` trained (`mask`: what it trained): its own state from its update;
        what the server needs of it goes up in to_server."""
        self.local.after_client(cid, delta, steps, lr, mask)

    # --- communication and aggregation --------------------------------------------------------
    def upload(self, r: int, cid: int, delta: torch.Tensor) -> None:
        """Rewrite client `cid`'s update `delta` (client - global) in place into what it sends: FedAvg sends it
        as it is. Runs before `aggregate`, the drift metrics and `after_client`, which all see the upload."""

    def client_bytes(self, r: int, cid: int, payload: int, trainable: int) -> tuple[int, int]:
        """(down, up) bytes of client `cid`: `payload` is the bytes of what it trains (its mask's entries),
        `trainable` those of every trainable group. FedAvg's exchange: the payload, each way."""
        f = self.local.exchange_factor
        return f * payload, f * payload

    def aggregate(self, acc: torch.Tensor, cid: int, delta: torch.Tensor, weight: float) -> None:
        """Fold client `cid`'s update into the round's accumulator: the p_i-weighted sum."""
        acc.add_(delta, alpha=weight)

    def server_update(self, r: int, x: torch.Tensor, acc: torch.Tensor, mask: torch.Tensor,
                      sampled: list[int]) -> None:
        """Step the global weights x (in place) from the aggregate, on the trainable entries only."""
        self.server.step(x, acc, mask, len(sampled), self.cfg.n_clients)
        self.local.end_round(len(sampled), self.cfg.n_clients, mask)

    # --- per round ----------------------------------------------------------------------------
    def on_round_end(self, r: int, row: dict, history) -> bool | None:
        """After the History row of round r is appended; True stops the run."""
        self.schedule.on_round_end(r, row, history)
        return None

    # --- the records between the halves ------------------------------------------------------
    def to_client(self, r: int, cid: int) -> dict:
        """Server's half, when round r's instructions are made: the tensors client `cid`'s half reads this round
        (the Instruction's `sent`). By default the local objective's, and the client's mask when client_mask
        gives one (the schedule's layer masks)."""
        mask = self.client_mask(r, cid)
        return {**self.local.to_client(cid), **({} if mask is None else {"mask": mask})}

    def from_server(self, r: int, cid: int, tensors: dict) -> None:
        """Clients' half, before client `cid` trains (the model holds the round's global weights): load what
        to_client sent (its "mask", if any, is the round's: fedfrozen.engine.clients.LocalTraining applies it)."""
        self.local.from_server(cid, {k: v for k, v in tensors.items() if k != "mask"})

    def client_state(self, cid: int) -> dict:
        """Clients' half on Flower, after the round: the tensors client `cid` keeps for its next round (its node's
        Context.state; in process the clients' half keeps them itself)."""
        return self.local.client_state(cid)

    def load_client_state(self, cid: int, state: dict) -> None:
        """Clients' half on Flower, before from_server: what client_state returned last time in this stage ({}:
        none)."""
        self.local.load_client_state(cid, state)

    def to_server(self, r: int, cid: int) -> dict:
        """Clients' half, after after_client: what the server's state needs from client `cid` (the Reply's
        `extras`)."""
        return self.local.to_server(cid)

    def from_client(self, r: int, cid: int, tensors: dict, weight: float) -> None:
        """Server's half, as each reply is taken in the sampled order and before its update is folded (aggregate):
        what to_server sent; `weight` is the client's p_i in the round."""
        self.local.from_client(cid, tensors)

    # --- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"server": self.server.state_dict(), "local": self.local.state_dict(),
                "schedule": self.schedule.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.server.load_state_dict(state["server"])
        self.local.load_state_dict(state["local"])
        self.schedule.load_state_dict(state["schedule"])
