"""The method registry: name -> (factory, composition, one-line summary).

`Config.method` names an entry; `build(cfg)` makes the Method. The built-in presets are
compositions of the base Method's three components; a plugin registers its own class:

    class FreezeHeadFrom2(ff.methods.Method):
        def frozen_groups(self, r):
            return ("head",) if r >= 2 else ()
    ff.methods.register("freeze_head_from_2", FreezeHeadFrom2, summary="FedAvg, head frozen from round 2")
    ff.run(ff.Config(method="freeze_head_from_2"))

A registered plugin lives in this process: `run_many` with several workers spawns fresh
processes, which see it only if the module that registers it is imported there too
(or pass workers=1).
"""

from __future__ import annotations

from ..nets.qkv import GROUPS
from .afedlf import AFedLF
from .base import Method
from .fedadamw import FedAdamW
from .fedlada import FedACT, FedLADA
from .fedslm import FedSLM
from .fedtlu import FedTLU
from .head_pruning import HeadPruning
from .settings import Settings, flat_name
from .stale import MIFA, FedSteer, FedVARP

__all__ = ["register", "unregister", "names", "describe", "build", "composition", "results_revision",
           "settings_class", "flat_settings", "flat_names", "methods_with"]

_REGISTRY: dict[str, tuple] = {}
_FLAT: dict = {}  # flat_settings(), rebuilt after a registration


def register(name: str, factory=Method, *, summary: str, replace: bool = False, settings: type | None = None,
             **composition) -> None:
    """Register method `name`: `build(cfg)` returns `factory(cfg, **composition)`.

    factory: Method or a subclass (any callable taking the Config and returning a Method);
    composition: keyword arguments for it, e.g. local="prox", server="adam", schedule="warmup",
    frozen=("qk",) (None: the config's `freeze`). summary: one line for `fedfrozen methods`.
    settings: the method's settings class (fedfrozen.methods.settings; Config.method_args); by default the
    factory's `Settings` (a Method subclass's); a factory function given `settings` receives it as the keyword
    `settings` (pass it on to Method.__init__).
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"method name must be an identifier; got {name!r}")
    if not callable(factory):
        raise TypeError(f"factory must be callable (a Method subclass); got {factory!r}")
    if not summary or not isinstance(summary, str):
        raise ValueError(f"register({name!r}): give a one-line summary")
    if name in _REGISTRY and not replace:
        raise ValueError(f"method {name!r} is already registered (pass replace=True to redefine it)")
    cls = settings if settings is not None else getattr(factory, "Settings", Settings)
    if not (isinstance(cls, type) and issubclass(cls, Settings)):
        raise TypeError(f"register({name!r}): {factory!r}.Settings must subclass fedfrozen.methods.settings.Settings")
    taken = flat_settings()
    for setting, flat in flat_names(cls).items():
        owner = taken.get(flat, (None,))[0]
        if owner is not None and not (issubclass(cls, owner) or issubclass(owner, cls)):
            raise ValueError(f"register({name!r}): the setting {setting!r} spells {flat!r}, already a setting of "
                             f"{owner.__name__}; give {cls.__name__} another prefix")
    _REGISTRY[name] = (factory, dict(composition), summary, cls)
    _FLAT.clear()


def unregister(name: str) -> None:
    """Remove `name` from the registry (a test's or notebook's plugin)."""
    if name not in _REGISTRY:
        raise ValueError(f"no method {name!r} is registered")
    del _REGISTRY[name]
    _FLAT.clear()


def names() -> tuple:
    """Registered method names, in registration order."""
    return tuple(_REGISTRY)


def describe() -> dict:
    """{name: one-line summary} of every registered method."""
    return {n: s for n, (_, _, s, _) in _REGISTRY.items()}


def composition(name: str) -> dict:
    """The component choices a preset was registered with (empty for a plugin class with defaults)."""
    return dict(_REGISTRY[name][1])


def results_revision(name: str) -> int:
    """The results revision of method `name` (Method.results_revision; 0 for a factory that is not a class)."""
    if name not in _REGISTRY:
        raise ValueError(f"method must be one of {', '.join(_REGISTRY)}; got {name!r}")
    return int(getattr(_REGISTRY[name][0], "results_revision", 0))


def settings_class(name: str) -> type:
    """The settings dataclass of method `name` (its class's `Settings`; the empty base for a plain factory)."""
    if name not in _REGISTRY:
        raise ValueError(f"method must be one of {', '.join(_REGISTRY)}; got {name!r}")
    return _REGISTRY[name][3]


def flat_names(cls) -> dict:
    """setting name -> its flat spelling (`{prefix}_{name}`: the flag's name, the cache key's name,
    the command-line flag with dashes) for settings class `cls`."""
    return {name: flat_name(cls, name) for name in cls.fields()}


def flat_settings() -> dict:
    """flat name -> (the settings class that declares it, the setting's name), over every registered method."""
    if not _FLAT:
        for _, _, _, cls in _REGISTRY.values():
            for name, flat in flat_names(cls).items():
                declaring = next(k for k in reversed(cls.__mro__) if cls.fields()[name].name in
                                 getattr(k, "__annotations__", {}))
                _FLAT.setdefault(flat, (declaring, name))
    return _FLAT


def methods_with(cls) -> list[str]:
    """The registered methods whose settings include those of settings class `cls`."""
    return [n for n, (_, _, _, own) in _REGISTRY.items() if issubclass(own, cls)]


def build(cfg) -> Method:
    """The Method of `cfg.method`, with the config's component overrides applied."""
    if cfg.method not in _REGISTRY:
        raise ValueError(f"method must be one of {', '.join(_REGISTRY)}; got {cfg.method!r}")
    factory, comp, _, settings = _REGISTRY[cfg.method]
    if settings is not getattr(factory, "Settings", Settings):  # a factory function registered with settings=
        comp = {**comp, "settings": settings}
    method = factory(cfg, **comp)
    if not isinstance(method, Method):
        raise TypeError(f"method {cfg.method!r}: its factory returned {type(method).__name__}, not a Method")
    method.name = cfg.method
    return method


_BODY = tuple(g for g in GROUPS if g not in ("head", "other"))
_PRESETS = [
    ("fedavg", {}, "FedAvg: local training, p_i-weighted mean of the updates"),
    ("local_adamw", {}, "Local AdamW: fresh local AdamW every round, FedAvg of the updates (= fedavg here)"),
    ("fedprox", dict(local="prox"), "FedProx: + (mu/2)||x - x^r||^2 in the local loss"),
    ("scaffold", dict(local="scaffold"), "SCAFFOLD: control variates c - c_i on every local step"),
    ("fedavgm", dict(server="momentum"), "FedAvgM: server momentum on the mean update"),
    ("fedadam", dict(server="adam"), "FedAdam: server Adam on the mean update (Reddi et al.)"),
    ("fedyogi", dict(server="yogi"), "FedYogi: server Yogi on the mean update"),
    ("fedadagrad", dict(server="adagrad"), "FedAdagrad: server Adagrad on the mean update"),
    ("feddyn", dict(local="feddyn", server="feddyn"), "FedDyn: dynamic regulariser and its server step"),
    ("fedfrozen", dict(schedule="warmup", frozen=None), "FedFrozen: FedAvg, then Q/K frozen from round T0"),
    ("fedfrozen_prox", dict(local="prox", schedule="warmup", frozen=None), "FedFrozen with FedProx local steps"),
    ("fedfrozen_scaffold", dict(local="scaffold", schedule="warmup", frozen=None), "FedFrozen with SCAFFOLD"),
    ("fedfrozen_adam", dict(server="adam", schedule="warmup", frozen=None), "FedFrozen with a FedAdam server"),
    ("fedfrozen_plateau", dict(schedule="kernel_plateau", frozen=None),
     "FedFrozen, Q/K frozen once the kernel change stays below freeze_tau (adaptive T0)"),
    ("fedfrozen_drift", dict(schedule="drift_ratio", frozen=None),
     "FedFrozen, Q/K frozen once qk drift exceeds freeze_rho x v drift (adaptive T0)"),
    ("freeze_v", dict(schedule="warmup", frozen=("v",)), "ablation: freeze the value block from T0"),
    ("freeze_attn", dict(schedule="warmup", frozen=("qk", "v", "attn_out")), "ablation: freeze all attention from T0"),
    ("freeze_kernel_at_init", dict(schedule="start", frozen=("qk",)), "ablation: the random initial kernel, frozen"),
    ("freeze_body", dict(schedule="warmup", frozen=_BODY), "ablation: freeze all but the head from T0 (FedBABU-like)"),
]
for _name, _comp, _summary in _PRESETS:
    register(_name, Method, summary=_summary, **_comp)
register("fedadamw", FedAdamW, summary="FedAdamW: local AdamW from the server's per-tensor v and step count, "
         "pulled along the last mean update")
register("fedlada", FedLADA,
         summary="FedLADA: Adam with coupled decay, pulled along the last mean update; full v averaged")
register("fedact", FedACT, summary="FedACT [recon]: FedAdamW's step scaled coordinate-wise by local/global trust")
register("fedslm", FedSLM, summary="FedSLM [recon]: client groups hold rank-r_g SVD truncations; fused by FedAvg")
register("mifa", MIFA, summary="MIFA: the data-weighted mean of every client's latest update, stale ones reused")
register("fedvarp", FedVARP, summary="FedVARP: active updates corrected by their cached ones, plus the cache's mean")
register("fedsteer", FedSteer, summary="FedSteer: FedVARP's step with the cache seen through a core set's subspace")
register("fedtlu", FedTLU, summary="FedTLU: each round only the k highest-scoring layers train and upload")
register("fedfrozen_tlu", FedTLU, schedule="warmup", frozen=None,
         summary="FedFrozen + FedTLU: layer selection, and Q/K frozen from round T0")
register("afedlf", AFedLF, summary="AFedLF: per-client frozen prefix for gain per simulated second, prefix cache")
register("head_pruning", HeadPruning,
         summary="head pruning: clients train their most confident heads; per-head confidence-weighted averaging")
