"""`Config`: every setting of a federated run, validated before any work starts."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import typing
import warnings
from dataclasses import dataclass

from .. import methods
from ..inputs.data import names as dataset_names
from ..inputs.partition import MIN_SIZE_RULES, PARTITIONS
from ..inputs.shift import SHIFTS
from ..methods.settings import annotation_type, check_value, setting
from ..nets.qkv import GROUPS

__all__ = ["Config", "field_type", "settings", "stored_form", "identity", "WHERE_FIELDS", "FREE_TEXT"]

_HINTS: dict = {}
# where a run finds its data, not what the run is: left out of its cache key and of the comparison of a stored
# config with the one asked for (a run cached from notebooks/, whose data root is "../data", is the run asked for
# from the project root, whose data root is "data"; so is one whose data was downloaded)
WHERE_FIELDS = ("data_root", "download")
# free-text fields: no choices or range, only their type (and, in `validate`, that model and init are not empty)
FREE_TEXT = ("data_root", "model", "init")


def field_type(name: str) -> tuple:
    """(base, element, optional) of a Config field's annotation, or of a component setting's (by flat name): base
    is bool, int, float, str, dict or tuple; element the type of a tuple's items (else None); optional whether None
    is allowed."""
    if name in methods.component_settings():
        cls, f = methods.component_settings()[name]
        return annotation_type(typing.get_type_hints(cls)[f.name])
    if not _HINTS:
        _HINTS.update(typing.get_type_hints(Config))
    return annotation_type(_HINTS[name])


def settings() -> list[tuple]:
    """(name, setting metadata, default) of everything a Config takes by name: its fields, in their sections, then
    every component's settings by flat name (the command line's flags, Flower's keys)."""
    out = []
    for f in dataclasses.fields(Config):
        if f.name == "_components":  # its settings follow, by flat name
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out.append((f.name, f.metadata, default))
    out += [(flat, f.metadata, f.default) for flat, (_, f) in methods.component_settings().items()]
    return out


@dataclass
class Config:
    """A federated run. Each field is declared once, in its section, with its type, default, help text (the
    command line's --help) and its range or choices (`setting`; checked by `validate`, whose own lines are only
    what the fields must satisfy together); defaults train vit_digits.

    Methods (docs/methods.md): `method` names a registered method (`fedfrozen methods` lists
    them); `local_objective`, `server_opt` and `freeze_schedule` override its components.

    One spelling a setting, in Python and in a JSON or YAML file (`to_dict`, --config):
    - a Config field by its name: Config(lr=0.01), `lr: 0.01`;
    - a component's setting (FedProx's mu, the server step's, the adaptive schedules', the value penalty's, skewed
      participation's, the pre-training's, the batched engine's), declared and checked beside the component
      (fedfrozen.methods.settings.component; `fedfrozen methods` lists them), by its flat name like a field:
      Config(prox_mu=0.1), `prox_mu: 0.1`, read as cfg.prox_mu; the Config keeps the ones that differ from their
      defaults in the read-only `components`;
    - a method's own setting in `method_args` by its name: Config(method="fedsteer", method_args={"core": 5}).
    The command line keeps its flags (--prox-mu, --fedsteer-core) and Flower its keys (prox-mu); `from_dict` also
    reads what earlier versions stored (components as a dict or as fields, method settings as flat fields).
    """

    # --- data and clients ---
    dataset: str = setting("digits", "digits | cifar10 | cifar100 | svhn | fashion_mnist | a name given to "
                           "ff.data.register", choices=dataset_names)
    data_root: str = setting("data", "where torchvision datasets live")
    download: bool = setting(False, "fetch a missing torchvision dataset")
    partition: str = setting("dirichlet", "iid | dirichlet | shards | quantity | natural (the dataset's own clients: "
                             "Shakespeare's roles)", choices=PARTITIONS)
    alpha: float = setting(0.5, "Dirichlet concentration (label skew; beta for quantity skew)", lo=0, lo_open=True)
    classes_per_client: int = setting(2, 'classes per client for partition="shards"', lo=1)
    min_client_samples: int = setting(2, "dirichlet | quantity: the fewest images a client may be dealt (how: "
                                      "min_samples_by)", lo=1)
    min_samples_by: str = setting("redraw", "dirichlet: how every client gets min_client_samples: redraw (repeat "
                                  "the whole draw) | deal (deal them at random first, then one draw; for "
                                  "federations no draw can fill, e.g. 1,000 clients at alpha 0.1)",
                                  choices=MIN_SIZE_RULES)
    dirichlet_balance: bool = setting(True, "dirichlet: NIID-Bench's balancing (a client past an equal share is dealt "
                                      "no more; the default) | False: the plain per-class draw (docs/claims.md, "
                                      "FedAvg's level)")
    n_clients: int = setting(10, "number of clients N", lo=1)
    clients_per_round: int | None = setting(None, "|S| sampled per round (None: all clients)", lo=1)
    participation: str = setting("uniform", "full | uniform (clients_per_round drawn each round) | skewed "
                                 "(Bernoulli, below)", choices=("full", "uniform", "skewed"))
    train_subset: int | None = setting(None, "a fixed stratified subset of this many training images (the same for "
                                       "every seed and method); None: all", lo=1)
    val_fraction: float = setting(0.1, "training data held out (stratified) for hyperparameter selection", lo=0, hi=0.5)
    client_holdout: float = setting(0.1, "fraction of each client's data kept for its local accuracy", lo=0, hi=0.5)
    public_fraction: float = setting(0.0, "training data held out as the server's public split", lo=0, hi=0.5)
    shift: str = setting("none", "feature shift: none | rotation | patch_permutation, by client group (fedfrozen."
                         "shift)", choices=SHIFTS)
    shift_groups: int = setting(4, "feature shift: the clients' groups k (client i in group i mod k)", lo=2)
    # --- local training ---
    rounds: int = setting(60, "communication rounds T", lo=1)
    local_epochs: int | None = setting(None, "epochs per round (default 1 when local_steps is None)", lo=1)
    local_steps: int | None = setting(None, "or: a fixed number of local steps K per round", lo=1)
    batch_size: int = setting(16, "local batch size", lo=1)
    optimizer: str = setting("adamw", "sgd | adamw (fresh state per client per round)", choices=("sgd", "adamw"))
    lr: float = setting(1e-2, "local learning rate eta (the round's, before the schedule)", lo=0, lo_open=True)
    momentum: float = setting(0.9, "SGD momentum", lo=0, hi=1)
    weight_decay: float = setting(0.01, "decoupled for AdamW, L2 for SGD", lo=0)
    lr_schedule: str = setting("constant", "constant | cosine (over rounds)", choices=("constant", "cosine"))
    lr_warmup_rounds: int = setting(0, "linear warm-up of the local lr over the first rounds, then the schedule", lo=0)
    grad_clip: float | None = setting(None, "clip the local gradient norm", lo=0, lo_open=True)
    augment: bool | None = setting(None, "random crop (4-px reflect pad) + flip per batch; None: on for cifar10/"
                                   "cifar100/svhn (no flip for svhn)")
    # --- model and method ---
    model: str = setting("vit_digits", "project model or timm name")
    model_kwargs: dict = setting(help="extra arguments to models.create", factory=dict)
    method: str = setting("fedavg", "a registered method (fedfrozen methods lists them)", choices=methods.names)
    warmup_rounds: int = setting(15, "T0: stage 2 starts at this round (>= rounds: never)", lo=0)
    freeze: tuple[str, ...] = setting(("qk",), f"groups frozen in stage 2 by the fedfrozen presets "
                                      f"({', '.join(GROUPS)})", choices=GROUPS)
    local_objective: str | None = setting(None, "override: plain | prox | scaffold | feddyn",
                                          choices=lambda: tuple(methods.LOCAL_OBJECTIVES))
    server_opt: str | None = setting(None, "override: avg | momentum | adam | yogi | adagrad | feddyn",
                                     choices=lambda: tuple(methods.SERVER_OPTIMIZERS))
    freeze_schedule: str | None = setting(None, "override: none | warmup | start | kernel_plateau | drift_ratio",
                                          choices=lambda: tuple(methods.FREEZE_SCHEDULES))
    method_args: dict = setting(help='the method\'s own settings, e.g. {"core": 5} for fedsteer (fedfrozen methods '
                                "--settings)", factory=dict)
    # the components' settings that differ from their defaults, by flat name: given by keyword (Config(prox_mu=0.1)),
    # read as cfg.prox_mu or, all of them, cfg.components (one spelling: never given as a dict; a copy carries it)
    _components: dict = setting(help="the changed component settings (internal: give them by name)", factory=dict)
    # --- starting point ---
    init: str = setting("random", "random | public (server pre-trains on the public split) | pretrained (on images "
                        "outside train_subset; fedfrozen.engine.pretrain) | path to a state_dict")
    server_pretrain_epochs: int = setting(0, 'epochs of server pre-training when init="public"', lo=0)
    # --- run ---
    seed: int = setting(0, "the seed of every random choice of the run", lo=0)
    device: str = setting("auto", "auto | cpu | cuda", choices=("auto", "cpu", "cuda"))
    eval_every: int = setting(1, "evaluate the global model every k rounds (and at the end)", lo=1)
    eval_window: int = setting(0, "also evaluate every one of the last k rounds; late measures use them (0: the last "
                               "3 evaluations)", lo=0)
    amp: bool = setting(False, "bfloat16 autocast (GPU only)")
    engine: str = setting("sequential", "local training: sequential (one client at a time) | batched (vmap over "
                          "clients) | auto", choices=("sequential", "batched", "auto"))

    def __post_init__(self):
        if isinstance(self.freeze, str):  # freeze="qk" names one group (not the groups "q" and "k")
            self.freeze = (self.freeze,)
        self._check_fields()  # one run, one value (and one cache key): ints of float fields floats, lists tuples
        if self.clients_per_round is not None and self.clients_per_round == self.n_clients:
            self.clients_per_round = None  # "all clients"
        if self.local_epochs is None and self.local_steps is None:
            self.local_epochs = 1
        self.validate()
        # one spelling per run: only the settings that differ from the method's defaults, normalised
        self.method_args = methods.settings_class(self.method).create(self.method, self.method_args).changed()
        object.__setattr__(self, "_sealed", True)  # a value from here on: one Config, one run, one cache key

    def __setattr__(self, name: str, value) -> None:
        """A Config is a value: once made it does not change (a changed one would run under its old cache key, and
        `run_or_load` could serve or store the wrong run). `cfg.replace(name=value)` makes the changed copy."""
        if self.__dict__.get("_sealed"):
            raise AttributeError(f"a Config cannot be changed once made ({name} = {value!r}): it is the run's identity "
                                 f"and cache key; make a changed copy with cfg.replace({name}=...)")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a Config cannot be changed once made (del {name}); use cfg.replace(...)")

    def __getattr__(self, name: str):
        """A component's setting by its flat name (`cfg.prox_mu`: its value in `components`, else its default). A
        method's setting is read from cfg.method_args (or, typed, from the method's `settings`): its flat name
        (`cfg.fedsteer_core`) is only the flag's, and the AttributeError says so."""
        if not name.startswith("_") and name in methods.component_settings():
            return (self.__dict__.get("_components") or {}).get(name, methods.component_settings()[name][1].default)
        if not name.startswith("_") and name in methods.flat_settings():
            owner, setting = methods.flat_settings()[name]
            raise AttributeError(f"Config has no attribute {name!r}: the setting is cfg.method_args[{setting!r}] "
                                 f"(of {', '.join(methods.methods_with(owner))}; --{name.replace('_', '-')} on the "
                                 f"command line)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def components(self) -> dict:
        """The component settings that differ from their defaults, by flat name (read only: a copy)."""
        return dict(self._components)

    def _check_fields(self) -> None:
        """Every field by its own declaration (`setting`: type, range, choices; methods/settings.check_value), its
        value normalised; the error names the field ("lr must be ...")."""
        for f in dataclasses.fields(self):  # (normalising: a made Config is already normal, so this changes nothing)
            object.__setattr__(self, f.name, check_value(f.name, field_type(f.name), f.metadata, getattr(self, f.name)))

    # --- validation -----------------------------------------------------------------------
    def validate(self) -> None:
        """Each field by its declaration (`_check_fields`), then what the fields must satisfy together; then the
        method's own checks (its settings, its components' compatibility)."""
        self._check_fields()
        if self.clients_per_round is not None and self.clients_per_round > self.n_clients:
            raise ValueError(f"clients_per_round ({self.clients_per_round}) must not exceed "
                             f"n_clients ({self.n_clients})")
        if self.participation == "full" and self.clients_per_round not in (None, self.n_clients):
            raise ValueError(f"participation='full' trains every client each round; clients_per_round "
                             f"({self.clients_per_round}) is for participation='uniform'")
        if self.participation == "skewed":
            p_max = (1 + self.participation_skew) * 2 * self.participation_rate / (2 + self.participation_skew)
            if self.n_clients > 1 and p_max > 1:
                raise ValueError(f"participation='skewed': the likelier clients would join with probability "
                                 f"{p_max:.3g} > 1 (participation_rate {self.participation_rate}, participation_skew "
                                 f"{self.participation_skew}); lower one of them")
        if not self.dirichlet_balance and self.partition != "dirichlet":
            raise ValueError(f"dirichlet_balance=False is a rule of partition 'dirichlet'; got partition "
                             f"{self.partition!r}")
        if self.partition == "natural" and self.dataset in ("digits", "cifar10", "cifar100", "svhn", "fashion_mnist"):
            raise ValueError(f"partition 'natural' takes the clients a dataset defines (Shakespeare's roles, or a "
                             f"registered dataset's owner); {self.dataset!r} defines none")
        if self.shift == "none" and self.shift_groups != 4:
            raise ValueError(f"shift_groups ({self.shift_groups}) is a setting of a feature shift; shift is 'none'")
        if self.shift != "none" and self.shift_groups > self.n_clients:
            raise ValueError(f"shift_groups ({self.shift_groups}) must not exceed n_clients ({self.n_clients}): a "
                             f"group would have no client")
        if self.local_epochs is not None and self.local_steps is not None:
            raise ValueError("give exactly one of local_epochs and local_steps, not both")
        if self.lr_warmup_rounds >= self.rounds and self.lr_warmup_rounds:
            raise ValueError(f"lr_warmup_rounds ({self.lr_warmup_rounds}) must be below rounds ({self.rounds})")
        if not self.model:
            raise ValueError(f"model must be a model name; got {self.model!r}")
        if not self.freeze:
            raise ValueError(f"freeze must name one or more groups of {', '.join(GROUPS)}; got {self.freeze!r}")
        if not self.init:
            raise ValueError(f"init must be 'random', 'public', 'pretrained' or a path; got {self.init!r}")
        if self.init == "public" and (self.public_fraction <= 0 or self.server_pretrain_epochs < 1):
            raise ValueError("init='public' needs public_fraction > 0 and server_pretrain_epochs >= 1")
        text = self.dataset == "shakespeare"
        if self.init == "pretrained" and (self.pretrain_task == "plays") != text:
            raise ValueError(f"pretrain_task {self.pretrain_task!r} does not fit dataset {self.dataset!r}: 'plays' is "
                             f"the pre-training of the Shakespeare text (the server's own plays), rotation and "
                             f"classes are image tasks")
        if self.init == "pretrained" and self.train_subset is None and not text:
            raise ValueError("init='pretrained' pre-trains on training images no client holds: set train_subset to "
                             "the federation's share of the training split (the rest is the server's)")
        methods.build(self)  # the method's own checks: its settings (method_args), component compatibility

    def warnings(self) -> list[str]:
        """Settings that are valid but make the run something other than it looks (one policy: such values
        are allowed, and said once, when the run starts)."""
        said = []
        schedule = self.freeze_schedule or methods.composition(self.method).get("schedule")
        if schedule == "warmup" and methods.freeze_round(self) is None:
            said.append(f"warmup_rounds ({self.warmup_rounds}) >= rounds ({self.rounds}): nothing is ever frozen, "
                        f"so method {self.method!r} runs as its unfrozen counterpart")
        return said

    # --- (de)serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict:
        """The Config as a JSON or YAML file holds it, in the one spelling: every field by name (freeze a list) and
        the changed component settings by flat name beside them (`prox_mu: 0.1`)."""
        d = {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "_components"}
        d["freeze"] = list(self.freeze)
        return d | dict(self.components)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        """A Config from `to_dict`'s form; a stored dict of an earlier version is read too, without a warning:
        component settings as a `components` dict or as fields at their defaults, method settings as flat fields
        (`fedsteer_core`, moved into method_args)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"_components"}
        d = dict(d)
        stored = d.pop("components", None) or {}
        if not isinstance(stored, dict):
            raise ValueError(f"components must be a dict of component settings by flat name; got {stored!r}")
        d = {**stored, **d}
        flat = {k: d.pop(k) for k in list(d) if k in methods.flat_settings()}
        unknown = sorted(set(d) - names - set(methods.component_settings()))
        if unknown:
            raise ValueError(f"unknown Config field(s) {unknown}")
        if flat:
            d["method_args"] = _from_flat(d.get("method", "fedavg"), d.get("method_args") or {}, flat)
        return cls(**d)

    def replace(self, **changes) -> "Config":
        """A copy with `changes` (fields, and component settings by flat name). Another `method` without
        `method_args` starts from that method's default settings (the old method's settings are not the new
        one's); give method_args to set them."""
        if changes.get("method", self.method) != self.method and "method_args" not in changes:
            changes["method_args"] = {}
        _refuse_components(changes)
        return dataclasses.replace(self, **changes)  # (_components is copied, the flat names in changes go over it)


def _refuse_components(kwargs: dict) -> None:
    if "components" in kwargs:
        raise ValueError(f"components is read only: give a component's setting by its name, e.g. Config(prox_mu=0.1) "
                         f"(got components={kwargs['components']!r})")


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


def _from_flat(method: str, args: dict, flat: dict) -> dict:
    """method_args with the flat-named settings `flat` ({"fedsteer_core": 5}) of a stored config of an earlier
    version moved in. A flat name of another method's setting is dropped (it never changed this method's run), said
    when its value is not the default."""
    args = dict(args)
    own = methods.flat_names(methods.settings_class(method)) if method in methods.names() else {}
    by_flat = {f: name for name, f in own.items()}
    for key, value in flat.items():
        owner, setting = methods.flat_settings()[key]
        if key in by_flat:
            args[setting] = value
        elif value != owner.fields()[setting].default:
            warnings.warn(f"Config({key}={value!r}) is ignored: method {method!r} has no such setting (it is a setting "
                          f"of {', '.join(methods.methods_with(owner))})", FutureWarning, stacklevel=3)
    return args


_generated_init = Config.__init__


@functools.wraps(_generated_init)
def _init(self, *args, **kwargs):
    """The dataclass's __init__, also taking the component settings by flat name (Config(prox_mu=0.1): checked by
    their declarations, the changed ones kept in `components`). A method setting's flat name is refused with its
    spelling (method_args), and so is a `components` dict."""
    _refuse_components(kwargs)
    flat = sorted(k for k in kwargs if k in methods.flat_settings())
    if flat:
        key = flat[0]
        owner, setting = methods.flat_settings()[key]
        raise ValueError(f"{key} is a method's setting: give it as method_args={{{setting!r}: ...}} (of "
                         f"{', '.join(methods.methods_with(owner))}; command line: --{key.replace('_', '-')})")
    given = {k: kwargs.pop(k) for k in list(kwargs) if k in methods.component_settings()}
    unknown = sorted(set(kwargs) - {f.name for f in dataclasses.fields(Config)})
    if unknown:
        names = [name for name, _, _ in settings()]
        near = {k: difflib.get_close_matches(k, names, n=2) for k in unknown}
        hint = "; ".join(f"{k}: did you mean {' or '.join(v)}?" for k, v in near.items() if v)
        raise ValueError(f"Config has no setting(s) {unknown}" + (f" ({hint})" if hint else "")
                         + " (fedfrozen run --help lists them all)")
    # a copy (Config.replace, dataclasses.replace) carries the changed ones in _components: the given go over them
    kwargs["_components"] = methods.check_components({**(kwargs.get("_components") or {}), **given})
    _generated_init(self, *args, **kwargs)


Config.__init__ = _init
