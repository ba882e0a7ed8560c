"""`Config`: every setting of a federated run, validated before any work starts."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field

from . import methods
from .data import DATASETS
from .partition import PARTITIONS
from .qkv import GROUPS

__all__ = ["Config", "field_type"]

_HINTS: dict = {}
# thresholds whose limit means something: freeze_tau=inf (every round is a plateau), freeze_rho=inf (never freeze)
_INFINITY_OK = frozenset({"freeze_tau", "freeze_rho"})


def field_type(name: str) -> tuple:
    """(base, element, optional) of a Config field's annotation: base is bool, int, float, str, dict or tuple;
    element the type of a tuple's items (else None); optional whether None is allowed."""
    if not _HINTS:
        _HINTS.update(typing.get_type_hints(Config))
    hint, optional = _HINTS[name], False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional, hint = len(args) < len(typing.get_args(hint)), args[0]
    base = typing.get_origin(hint) or hint
    elem = next((a for a in typing.get_args(hint) if a is not Ellipsis), None) if base is tuple else None
    return base, elem, optional


@dataclass
class Config:
    """A federated run. Field comments say what each one means; defaults train vit_digits.

    Methods (docs/methods.md): `method` names a registered method (`fedfrozen methods` lists
    them); `local_objective`, `server_opt` and `freeze_schedule` override its components.
    """

    # data and clients
    dataset: str = "digits"            # digits | cifar10 | cifar100 | svhn | fashion_mnist
    data_root: str = "data"            # where torchvision datasets live
    download: bool = False             # fetch a missing torchvision dataset
    partition: str = "dirichlet"       # iid | dirichlet | shards | quantity
    alpha: float = 0.5                 # Dirichlet concentration (label skew; beta for quantity skew)
    classes_per_client: int = 2        # for partition="shards"
    n_clients: int = 20                # number of clients N
    clients_per_round: int | None = None  # |S| sampled per round (None: all clients)
    participation: str = "uniform"     # full | uniform (clients_per_round drawn each round) | skewed (Bernoulli, below)
    participation_rate: float = 0.1    # skewed: C, the expected share of clients per round (sum_i p_i = C N)
    participation_skew: float = 5.0    # skewed: a, a seeded half of the clients is (1 + a)x likelier to join
    train_subset: int | None = None    # a fixed stratified subset of this many training images (the same for every seed and method); None: all
    val_fraction: float = 0.1          # training data held out (stratified) for hyperparameter selection
    client_holdout: float = 0.1        # fraction of each client's data kept for its local accuracy
    public_fraction: float = 0.0       # training data held out as the server's public split
    # local training
    rounds: int = 60                   # communication rounds T
    local_epochs: int | None = None    # epochs per round (default 1 when local_steps is None)
    local_steps: int | None = None     # or: a fixed number of local steps K per round
    batch_size: int = 16
    optimizer: str = "adamw"           # sgd | adamw (fresh state per client per round)
    lr: float = 1e-2                   # local learning rate eta (AdamW; see README for the pilot)
    momentum: float = 0.9              # SGD momentum
    weight_decay: float = 0.01         # decoupled for AdamW, L2 for SGD
    lr_schedule: str = "constant"      # constant | cosine (over rounds)
    lr_warmup_rounds: int = 0          # linear warm-up of the local lr over the first rounds, then the schedule
    grad_clip: float | None = None     # clip the local gradient norm
    augment: bool | None = None        # random crop (4-px reflect pad) + flip per batch; None: on for cifar10/cifar100/svhn (no flip for svhn)
    # model and method
    model: str = "vit_digits"          # project model or timm name
    model_kwargs: dict = field(default_factory=dict)  # extra arguments to models.create
    method: str = "fedavg"             # a registered method (fedfrozen methods lists them)
    warmup_rounds: int = 15            # T0: stage 2 starts at this round (>= rounds: never)
    freeze: tuple[str, ...] = ("qk",)            # groups frozen in stage 2 by the fedfrozen presets
    value_l2: float = 0.0              # lambda of the value penalty (stage 2)
    value_l2_mode: str = "ridge"       # ridge: lambda/2 ||W_V||^2; prox: lambda/2 ||W_V - W_V^r||^2
    value_l2_warmup: bool = False      # apply the value penalty in stage 1 too
    local_objective: str | None = None  # override: plain | prox | scaffold | feddyn
    server_opt: str | None = None      # override: avg | momentum | adam | yogi | adagrad | feddyn
    freeze_schedule: str | None = None  # override: none | warmup | start | kernel_plateau | drift_ratio
    freeze_tau: float = 0.01           # kernel_plateau: relative kernel change below which a round counts as a plateau (inf: every round)
    freeze_rho: float = 4.0            # drift_ratio: freeze when qk drift exceeds rho times v drift (chosen on the simulator; inf: never)
    freeze_patience: int = 3           # adaptive schedules: consecutive rounds the condition must hold
    prox_mu: float = 0.01              # FedProx mu
    feddyn_alpha: float = 0.01         # FedDyn alpha
    tlu_k: int | None = None           # FedTLU: layers trained per round (None: 25% of the layers, at least 1)
    afedlf_max_depth: int | None = None  # AFedLF: deepest frozen prefix (blocks); None: all but the last block
    head_sparsity: float = 0.5         # head pruning: share s of attention heads each client leaves untrained, in [0, 1)
    head_weighting: str = "confidence"  # head pruning: per-head aggregation weights p_i*c_ih (confidence) or p_i (uniform)
    fedadamw_gamma: float = 0.9        # FedAdamW: weight gamma of the pull along the last mean update (lr and wd scaled by 1 - gamma)
    fedadamw_server_moments: bool = True  # FedAdamW: clients start from the server's per-tensor v and step counter
    fedact_alpha: float = 0.9          # FedACT [recon]: weight alpha of the global direction in the local step
    fedact_tau_min: float = 0.1        # FedACT [recon]: lower clip of the coordinate trust (1: trust == 1)
    fedslm_ranks: tuple[int, ...] = ()           # FedSLM [recon]: ranks r_1 < ... < r_G of the groups' truncated linear layers; () = 1/6, 1/3, 2/3 of the smallest layer (8, 16, 32 on vit_digits)
    fedslm_adapter_rank: int = 0       # FedSLM: rank of each client's adapter on its truncated base (0: no adapters)
    fedsteer_core: int | None = None   # FedSteer: K, the clients of the core set whose cached updates span the subspace (None: min(10, N))
    fedsteer_lambda: float = 0.5       # FedSteer: ridge lambda of the subspace coordinates (> 0)
    fedsteer_select_rounds: int = 5    # FedSteer: the core set is re-chosen at the end of the first rounds, then fixed
    scaffold_variant: str = "auto"     # SCAFFOLD control variates: gradient (option I) | update (option II) | auto (II for sgd, else I)
    server_lr: float | None = None     # eta_g (None: 1 for avg/momentum, 1e-2 adam/yogi, 1e-1 adagrad)
    server_momentum: float = 0.9       # FedAvgM beta
    server_beta1: float = 0.9          # FedOpt beta1
    server_beta2: float = 0.99         # FedOpt beta2
    server_tau: float = 1e-3           # FedOpt adaptivity tau
    # starting point
    init: str = "random"               # random | public (server pre-trains on the public split) | path to a state_dict
    server_pretrain_epochs: int = 0    # epochs of server pre-training when init="public"
    # run
    seed: int = 0
    device: str = "auto"               # auto | cpu | cuda
    eval_every: int = 1                # evaluate the global model every k rounds (and at the end)
    amp: bool = False                  # bfloat16 autocast (GPU only)
    engine: str = "sequential"         # local training: sequential (one client at a time) | batched (vmap over clients) | auto
    engine_chunk: int | None = None    # batched engine: clients trained at once (None: as many as a memory budget allows)
    engine_compile: bool = False       # batched engine: torch.compile its step (pays on long runs; benchmarks/engine.py)

    def __post_init__(self):
        if isinstance(self.freeze, str):  # freeze="qk" names one group (not the groups "q" and "k")
            self.freeze = (self.freeze,)
        self._check_types()
        # one run, one value (and one cache key): ints given for float fields become floats, lists tuples,
        # clients_per_round = n_clients is "all clients"
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if field_type(f.name)[0] is float and isinstance(value, int) and not isinstance(value, bool):
                setattr(self, f.name, float(value))
        self.freeze = tuple(self.freeze)
        self.fedslm_ranks = tuple(self.fedslm_ranks)
        if self.clients_per_round is not None and self.clients_per_round == self.n_clients:
            self.clients_per_round = None
        if self.local_epochs is None and self.local_steps is None:
            self.local_epochs = 1
        self.validate()

    def _check_types(self) -> None:
        """Every field against its annotation (generated from the field list: a new field is covered too):
        booleans are True/False (not "false"), numbers are finite numbers, strings strings, None only where the
        annotation allows it."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            base, elem, optional = field_type(f.name)
            if value is None:
                if not optional:
                    raise ValueError(f"{f.name} must not be None")
                continue
            if base is bool:
                ok = isinstance(value, bool)
                want = "True or False"
            elif base is int:
                ok = isinstance(value, int) and not isinstance(value, bool)
                want = "an integer"
            elif base is float:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
                    math.isfinite(value) or f.name in _INFINITY_OK and value == math.inf)
                want = "a finite number" + (" or inf" if f.name in _INFINITY_OK else "")
            elif base is str:
                ok = isinstance(value, str)
                want = "a string"
            elif base is dict:
                ok = isinstance(value, dict)
                want = "a dict (e.g. a JSON object)"
            elif base is tuple:
                ok = isinstance(value, (tuple, list)) and all(
                    isinstance(v, elem) and not (elem is int and isinstance(v, bool)) for v in value)
                want = f"a list of {elem.__name__}s"
            else:  # pragma: no cover - a new annotation kind needs a rule here
                raise TypeError(f"Config field {f.name}: no type rule for {base!r}")
            if not ok:
                raise ValueError(f"{f.name} must be {want}; got {value!r} ({type(value).__name__})")

    # --- validation -----------------------------------------------------------------------
    def validate(self) -> None:
        self._check_types()
        def choice(name, allowed):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}; got {value!r}")

        # types (and None) were checked from the annotations by _check_types: these are the ranges
        def integer(name, lo):
            value = getattr(self, name)
            if value is not None and value < lo:
                raise ValueError(f"{name} must be an integer >= {lo}; got {value!r}")

        def number(name, lo, hi=float("inf"), lo_open=False):
            value = getattr(self, name)
            if value is None:
                return
            if (value <= lo if lo_open else value < lo) or value > hi:
                bound = f"> {lo}" if lo_open else f">= {lo}"
                raise ValueError(f"{name} must be {bound}" + (f" and <= {hi}" if hi < float("inf") else "")
                                 + f"; got {value!r}")

        choice("dataset", DATASETS)
        choice("partition", PARTITIONS)
        number("alpha", 0, lo_open=True)
        integer("classes_per_client", 1)
        integer("n_clients", 1)
        integer("clients_per_round", 1)
        if self.clients_per_round is not None and self.clients_per_round > self.n_clients:
            raise ValueError(f"clients_per_round ({self.clients_per_round}) must not exceed "
                             f"n_clients ({self.n_clients})")
        choice("participation", ("full", "uniform", "skewed"))
        number("participation_rate", 0, 1, lo_open=True)
        number("participation_skew", 0)
        if self.participation == "full" and self.clients_per_round not in (None, self.n_clients):
            raise ValueError(f"participation='full' trains every client each round; clients_per_round "
                             f"({self.clients_per_round}) is for participation='uniform'")
        if self.participation == "skewed":
            p_max = (1 + self.participation_skew) * 2 * self.participation_rate / (2 + self.participation_skew)
            if self.n_clients > 1 and p_max > 1:
                raise ValueError(f"participation='skewed': the likelier clients would join with probability "
                                 f"{p_max:.3g} > 1 (participation_rate {self.participation_rate}, participation_skew "
                                 f"{self.participation_skew}); lower one of them")
        number("val_fraction", 0, 0.5)
        if self.train_subset is not None and self.train_subset < 1:
            raise ValueError(f"train_subset must be a positive number of images or None; got {self.train_subset!r}")
        number("client_holdout", 0, 0.5)
        number("public_fraction", 0, 0.5)
        integer("rounds", 1)
        if self.local_epochs is not None and self.local_steps is not None:
            raise ValueError("give exactly one of local_epochs and local_steps, not both")
        integer("local_epochs", 1)
        integer("local_steps", 1)
        integer("batch_size", 1)
        choice("optimizer", ("sgd", "adamw"))
        number("lr", 0, lo_open=True)
        number("momentum", 0, 1)
        number("weight_decay", 0)
        choice("lr_schedule", ("constant", "cosine"))
        integer("lr_warmup_rounds", 0)
        if self.lr_warmup_rounds >= self.rounds and self.lr_warmup_rounds:
            raise ValueError(f"lr_warmup_rounds ({self.lr_warmup_rounds}) must be below rounds ({self.rounds})")
        number("grad_clip", 0, lo_open=True)
        if not self.model:
            raise ValueError(f"model must be a model name; got {self.model!r}")
        choice("method", methods.names())
        integer("warmup_rounds", 0)
        unknown = [g for g in self.freeze if g not in GROUPS]
        if unknown or not self.freeze:
            raise ValueError(f"freeze must name one or more groups of {', '.join(GROUPS)}; got {self.freeze!r}")
        number("value_l2", 0)
        choice("value_l2_mode", ("ridge", "prox"))
        if self.local_objective is not None:
            choice("local_objective", tuple(methods.LOCAL_OBJECTIVES))
        if self.server_opt is not None:
            choice("server_opt", methods.SERVER_OPTIMIZERS)
        if self.freeze_schedule is not None:
            choice("freeze_schedule", tuple(methods.FREEZE_SCHEDULES))
        choice("scaffold_variant", methods.SCAFFOLD_VARIANTS)
        ranks = self.fedslm_ranks
        if any(r < 1 for r in ranks):
            raise ValueError(f"fedslm_ranks must be integers >= 1 (or empty: the default ranks); got {ranks!r}")
        if any(b <= a for a, b in zip(ranks, ranks[1:])):
            raise ValueError(f"fedslm_ranks must be increasing (r_1 < ... < r_G); got {ranks!r}")
        integer("fedslm_adapter_rank", 0)
        integer("fedsteer_core", 1)
        if self.fedsteer_core is not None and self.fedsteer_core > self.n_clients and self.method == "fedsteer":
            raise ValueError(f"fedsteer_core ({self.fedsteer_core}) must not exceed n_clients ({self.n_clients}): "
                             "the core set is drawn from the clients")
        number("fedsteer_lambda", 0, lo_open=True)
        integer("fedsteer_select_rounds", 0)
        number("fedact_alpha", 0)
        number("fedact_tau_min", 0, 1, lo_open=True)
        number("fedadamw_gamma", 0, 1)
        if self.fedadamw_gamma >= 1:
            raise ValueError(f"fedadamw_gamma must be in [0, 1); got {self.fedadamw_gamma!r}")
        number("freeze_tau", 0)
        number("freeze_rho", 0)
        integer("freeze_patience", 1)
        integer("tlu_k", 1)
        integer("afedlf_max_depth", 0)
        number("head_sparsity", 0, 1)
        if self.head_sparsity >= 1:
            raise ValueError(f"head_sparsity must be in [0, 1): at least one head trains; got {self.head_sparsity!r}")
        choice("head_weighting", ("confidence", "uniform"))
        number("prox_mu", 0)
        number("feddyn_alpha", 0, lo_open=True)
        number("server_lr", 0, lo_open=True)
        number("server_momentum", 0, 1)
        number("server_beta1", 0, 1)
        number("server_beta2", 0, 1)
        number("server_tau", 0, lo_open=True)
        if not self.init:
            raise ValueError(f"init must be 'random', 'public' or a path; got {self.init!r}")
        integer("server_pretrain_epochs", 0)
        if self.init == "public" and (self.public_fraction <= 0 or self.server_pretrain_epochs < 1):
            raise ValueError("init='public' needs public_fraction > 0 and server_pretrain_epochs >= 1")
        integer("seed", 0)
        choice("device", ("auto", "cpu", "cuda"))
        integer("eval_every", 1)
        choice("engine", ("sequential", "batched", "auto"))
        integer("engine_chunk", 1)
        methods.build(self)  # the method's own checks (component compatibility)

    def warnings(self) -> list[str]:
        """Settings that are valid but make the run something other than it looks (one policy: such values
        are allowed, and said once, when the run starts)."""
        said = []
        schedule = self.freeze_schedule or methods.composition(self.method).get("schedule")
        if schedule == "warmup" and self.warmup_rounds >= self.rounds:
            said.append(f"warmup_rounds ({self.warmup_rounds}) >= rounds ({self.rounds}): nothing is ever frozen, "
                        f"so method {self.method!r} runs as its unfrozen counterpart")
        return said

    # --- (de)serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["freeze"] = list(self.freeze)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown Config field(s) {unknown}")
        return cls(**d)

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)
