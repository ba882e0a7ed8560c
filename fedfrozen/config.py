"""`Config`: every setting of a federated run, validated before any work starts."""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
import warnings
from dataclasses import dataclass, field

from . import methods
from .data import DATASETS
from .methods.settings import annotation_type
from .partition import PARTITIONS
from .qkv import GROUPS

__all__ = ["Config", "field_type", "stored_form", "identity", "WHERE_FIELDS"]

_HINTS: dict = {}
# where a run finds its data, not what the run is: left out of its cache key and of the comparison of a stored
# config with the one asked for (a run cached from notebooks/, whose data root is "../data", is the run asked for
# from the project root, whose data root is "data"; so is one whose data was downloaded)
WHERE_FIELDS = ("data_root", "download")
# thresholds whose limit means something: freeze_tau=inf (every round is a plateau), freeze_rho=inf (never freeze)
_INFINITY_OK = frozenset({"freeze_tau", "freeze_rho"})


def field_type(name: str) -> tuple:
    """(base, element, optional) of a Config field's annotation: base is bool, int, float, str, dict or tuple;
    element the type of a tuple's items (else None); optional whether None is allowed."""
    if not _HINTS:
        _HINTS.update(typing.get_type_hints(Config))
    return annotation_type(_HINTS[name])


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
    n_clients: int = 10                # number of clients N
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
    method_args: dict = field(default_factory=dict)  # the method's own settings, e.g. {"core": 5} for fedsteer (fedfrozen methods --settings)
    scaffold_variant: str = "auto"     # SCAFFOLD control variates: gradient (option I) | update (option II) | auto (II for sgd, else I)
    server_lr: float | None = None     # eta_g (None: 1 for avg/momentum, 1e-2 adam/yogi, 1e-1 adagrad)
    server_momentum: float = 0.9       # FedAvgM beta
    server_beta1: float = 0.9          # FedOpt beta1
    server_beta2: float = 0.99         # FedOpt beta2
    server_tau: float = 1e-3           # FedOpt adaptivity tau
    # starting point
    init: str = "random"               # random | public (server pre-trains on the public split) | pretrained (on images outside train_subset; fedfrozen.pretrain) | path to a state_dict
    server_pretrain_epochs: int = 0    # epochs of server pre-training when init="public"
    pretrain_task: str = "rotation"    # init="pretrained": rotation (self-supervised, fresh head) | classes (the first half of the classes)
    pretrain_epochs: int = 3           # init="pretrained": epochs over the images outside train_subset
    pretrain_seed: int = 0             # init="pretrained": the pre-training's seed (same seed, same weights; part of their cache key)
    # run
    seed: int = 0
    device: str = "auto"               # auto | cpu | cuda
    eval_every: int = 1                # evaluate the global model every k rounds (and at the end)
    eval_window: int = 0               # also evaluate every one of the last k rounds; late measures use them (0: the last 3 evaluations)
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
        if self.clients_per_round is not None and self.clients_per_round == self.n_clients:
            self.clients_per_round = None
        if self.local_epochs is None and self.local_steps is None:
            self.local_epochs = 1
        self.validate()
        # one spelling per run: only the settings that differ from the method's defaults, normalised
        self.method_args = methods.settings_class(self.method).create(self.method, self.method_args).changed()

    def __getattr__(self, name: str):
        """A method setting under its flat name of earlier versions (`cfg.fedsteer_core`): deprecated, with
        a warning naming cfg.method_args; its default when this config's method does not have it."""
        if name.startswith("_") or name not in methods.flat_settings():
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        owner, setting = methods.flat_settings()[name]
        warnings.warn(f"Config.{name} is deprecated: the setting is cfg.method_args[{setting!r}] (method "
                      f"{self.method!r})", FutureWarning, stacklevel=2)
        own = methods.settings_class(self.__dict__.get("method", "fedavg"))
        if any(flat == name for flat in methods.flat_names(own).values()):
            return self.__dict__.get("method_args", {}).get(setting, own.fields()[setting].default)
        return owner.fields()[setting].default

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
        number("freeze_tau", 0)
        number("freeze_rho", 0)
        integer("freeze_patience", 1)
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
        choice("pretrain_task", ("rotation", "classes"))
        integer("pretrain_epochs", 1)
        integer("pretrain_seed", 0)
        if self.init == "pretrained" and self.train_subset is None:
            raise ValueError("init='pretrained' pre-trains on training images no client holds: set train_subset to "
                             "the federation's share of the training split (the rest is the server's)")
        integer("seed", 0)
        choice("device", ("auto", "cpu", "cuda"))
        integer("eval_every", 1)
        integer("eval_window", 0)  # a window longer than the run is the whole run, evaluated every round
        choice("engine", ("sequential", "batched", "auto"))
        integer("engine_chunk", 1)
        methods.build(self)  # the method's own checks: its settings (method_args), component compatibility

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
        """A Config from `to_dict`'s form; a stored dict of an earlier version (method settings as flat fields,
        e.g. `fedsteer_core`) is read too, its settings moved into method_args without a warning."""
        names = {f.name for f in dataclasses.fields(cls)}
        d = dict(d)
        flat = {k: d.pop(k) for k in list(d) if k in methods.flat_settings()}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown Config field(s) {unknown}")
        if flat:
            d["method_args"] = _from_flat(d.get("method", "fedavg"), d.get("method_args") or {}, flat, warn=False)
        return cls(**d)

    def replace(self, **changes) -> "Config":
        """A copy with `changes`. Another `method` without `method_args` starts from that method's default
        settings (the old method's settings are not the new one's); give method_args to set them."""
        if changes.get("method", self.method) != self.method and "method_args" not in changes:
            changes["method_args"] = {}
        return dataclasses.replace(self, **changes)


def identity(d: dict) -> dict:
    """A config dict (`Config.to_dict`, `stored_form`) without WHERE_FIELDS: what makes two runs the same run."""
    return {k: v for k, v in d.items() if k not in WHERE_FIELDS}


def stored_form(d: dict) -> dict:
    """A stored config dict (a cached config.json, a checkpoint's) as this version writes it: an earlier version's
    flat method settings moved into method_args. A dict that is not a valid Config comes back as it is (the caller's
    comparison then fails and says so)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return Config.from_dict(d).to_dict()
    except (TypeError, ValueError):
        return d


def _from_flat(method: str, args: dict, flat: dict, warn: bool) -> dict:
    """method_args with the flat-named settings `flat` ({"fedsteer_core": 5}) moved in. A flat name of another
    method's setting is dropped (it never changed this method's run), said when its value is not the default;
    `warn`: say that the flat spelling is deprecated."""
    args = dict(args)
    own = methods.flat_names(methods.settings_class(method)) if method in methods.names() else {}
    by_flat = {f: name for name, f in own.items()}
    for key, value in flat.items():
        owner, setting = methods.flat_settings()[key]
        if key in by_flat:
            args[setting] = value
            if warn:
                warnings.warn(f"Config({key}=...) is deprecated: use method_args={{{setting!r}: {value!r}}} "
                              f"(command line: --{key.replace('_', '-')})", FutureWarning, stacklevel=3)
        elif value != owner.fields()[setting].default:
            warnings.warn(f"Config({key}={value!r}) is ignored: method {method!r} has no such setting (it is a setting "
                          f"of {', '.join(methods.methods_with(owner))})", FutureWarning, stacklevel=3)
    return args


_generated_init = Config.__init__


@functools.wraps(_generated_init)
def _init(self, *args, **kwargs):
    """The dataclass's __init__, also taking the deprecated flat names of method settings (a warning each)."""
    flat = {k: kwargs.pop(k) for k in list(kwargs) if k in methods.flat_settings()}
    if flat:
        kwargs["method_args"] = _from_flat(kwargs.get("method", "fedavg"), kwargs.get("method_args") or {}, flat,
                                           warn=True)
    _generated_init(self, *args, **kwargs)


Config.__init__ = _init
