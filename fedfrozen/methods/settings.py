"""A method's own settings: a small frozen dataclass declared beside the method, validated where it is declared.

    @dataclass(frozen=True)
    class FedSteerSettings(Settings):
        prefix: ClassVar[str] = "fedsteer"
        core: int | None = setting(None, "K, the core set's clients (None: min(10, N))", lo=1)
        lambda_: float = setting(0.5, "ridge lambda of the subspace coordinates", lo=0, lo_open=True)

    class FedSteer(Method):
        Settings = FedSteerSettings          # the method reads self.settings.core

A run gives them as `Config(method="fedsteer", method_args={"core": 5})`; the command line as
`fedfrozen run --method fedsteer --fedsteer-core 5` (flags and their --help generated from these fields).
The flat name `{prefix}_{field}` (e.g. `fedsteer_core`, where a field is declared) is the command line's flag and
the name the results cache keys it by, so runs cached when it was a Config field stay found; as a Config keyword it is
refused with this spelling (one spelling a setting; stored configs of earlier versions are still read). A trailing
underscore (`lambda_`) only avoids a Python keyword; the name is `lambda`.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import ClassVar

__all__ = ["Settings", "setting", "check_value", "spec", "flat_name", "annotation_type", "component",
           "component_settings", "check_components"]


def setting(default=dataclasses.MISSING, help: str = "", *, factory=None, lo=None, hi=None, lo_open: bool = False,
            hi_open: bool = False, choices=None, inf: bool = False):
    """A field declared once: its default (or `factory` for a dict), one line of help (the flag's --help), and its
    range (`lo`, `hi`, open or closed), `choices` (a tuple, or a function giving one: a registry that plugins
    extend) or `inf` (a float whose limit means something). Checked by `check_value`: a method's settings by
    Settings.create, Config's fields by Config.validate."""
    if not help:
        raise TypeError("a setting needs its help text")
    meta = {"help": help, "lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open, "choices": choices, "inf": inf}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    if isinstance(default, (list, dict, set)):
        raise TypeError("a setting's default must be immutable (a tuple, not a list)")
    return dataclasses.field(default=default, metadata=meta)


def _name(field: str) -> str:
    return field[:-1] if field.endswith("_") else field


def _type(cls, field: str) -> tuple:
    """(base, element, optional) of a settings field's annotation (bool, int, float, str or tuple)."""
    return annotation_type(typing.get_type_hints(cls)[field])


def annotation_type(hint) -> tuple:
    """(base, element, optional) of a dataclass field's resolved annotation: base is bool, int, float, str, dict
    or tuple; element the type of a tuple's items (else None); optional whether None is allowed."""
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional, hint = len(args) < len(typing.get_args(hint)), args[0]
    base = typing.get_origin(hint) or hint
    elem = next((a for a in typing.get_args(hint) if a is not Ellipsis), None) if base is tuple else None
    return base, elem, optional


@dataclass(frozen=True)
class Settings:
    """The base of every method's settings (it has none). `prefix`: the flags' and flat names' prefix."""

    prefix: ClassVar[str] = ""

    @classmethod
    def fields(cls) -> dict:
        """name (as users write it) -> dataclass field."""
        return {_name(f.name): f for f in dataclasses.fields(cls)}

    @classmethod
    def create(cls, method: str, args: dict) -> "Settings":
        """The settings of `method` from `args` (name -> value; absent names keep their defaults), every value
        checked against its annotation and range: a clear ValueError naming method_args[name] otherwise (the checks
        across fields, `check`, need the Config and run when the Method is built)."""
        if not isinstance(args, dict):
            raise ValueError(f"method_args must be a dict of {method!r}'s settings; got {args!r}")
        fields = cls.fields()
        unknown = sorted(set(args) - set(fields))
        if unknown:
            known = ", ".join(fields) or "none"
            raise ValueError(f"method_args: method {method!r} has no setting(s) {unknown} (its settings: {known})")
        values = {}
        for name, f in fields.items():
            value = args.get(name, f.default)
            values[f.name] = _check(cls, method, name, f, value)
        return cls(**values)

    def check(self, cfg) -> None:
        """Checks across fields or against the run's Config (a subclass's; called when the Method is built);
        each field's own type and range are checked by `create`."""

    def changed(self) -> dict:
        """name -> value of the settings that differ from their defaults (what a Config stores)."""
        return {name: getattr(self, f.name) for name, f in self.fields().items() if getattr(self, f.name) != f.default}

    def __getitem__(self, name: str):
        return getattr(self, self.fields()[name].name)


def _check(cls, method: str, name: str, f, value):
    """`value` for field `f` of `cls`, normalised, or a ValueError naming method_args[name] (`check_value`)."""
    return check_value(f"method_args[{name!r}] of method {method!r}", _type(cls, f.name), f.metadata, value)


def check_value(where: str, kind: tuple, meta, value):
    """`value` checked against its annotation `kind` ((base, element, optional): `annotation_type`) and its
    field's `setting` metadata, normalised (ints of float fields become floats, lists tuples); else a ValueError
    that starts with `where` ("{where} must ..."). The one checker of Config's fields and of every method's."""
    base, elem, optional = kind
    if value is None:
        if not optional:
            raise ValueError(f"{where} must not be None")
        return None
    inf = bool(meta.get("inf"))
    if base is bool:
        ok, want = isinstance(value, bool), "True or False"
    elif base is int:
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif base is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
            math.isfinite(value) or inf and value == math.inf)
        want = "a finite number" + (" or inf" if inf else "")
        value = float(value) if ok else value
    elif base is str:
        ok, want = isinstance(value, str), "a string"
    elif base is dict:
        ok, want = isinstance(value, dict), "a dict (e.g. a JSON object)"
    elif base is tuple:
        ok = isinstance(value, (tuple, list)) and all(
            isinstance(v, elem) and not (elem is int and isinstance(v, bool)) for v in value)
        want = f"a list of {elem.__name__}s"
        value = tuple(value) if ok else value
    else:  # pragma: no cover - a new annotation kind needs a rule here
        raise TypeError(f"{where}: no type rule for {base!r}")
    if not ok:
        raise ValueError(f"{where} must be {want}; got {value!r} ({type(value).__name__})")
    choices = meta.get("choices")
    choices = choices() if callable(choices) else choices
    items = value if base is tuple else (value,)
    if choices is not None and any(v not in choices for v in items):
        raise ValueError(f"{where} must be one of {', '.join(map(str, choices))}" + (" (each)" if base is tuple else "")
                         + f"; got {value!r}")
    lo, hi = meta.get("lo"), meta.get("hi")
    for v in items:
        if lo is not None and (v <= lo if meta["lo_open"] else v < lo) or hi is not None and (
                v >= hi if meta["hi_open"] else v > hi):
            lo_s = "" if lo is None else (f"> {lo}" if meta["lo_open"] else f">= {lo}")
            hi_s = "" if hi is None else (f"< {hi}" if meta["hi_open"] else f"<= {hi}")
            bound = " and ".join(s for s in (lo_s, hi_s) if s)
            raise ValueError(f"{where} must be {bound}" + (" (each)" if base is tuple else "") + f"; got {value!r}")
    return value


def flat_name(cls, name: str) -> str:
    """The flat spelling `{prefix}_{name}` of setting `name`, with the prefix of the class that declares it
    (FedACT's settings extend FedAdamW's: its `gamma` stays `fedadamw_gamma`)."""
    field = cls.fields()[name].name
    for klass in reversed(cls.__mro__):
        if field in getattr(klass, "__annotations__", {}):
            return f"{klass.__dict__.get('prefix', cls.prefix)}_{name}"
    raise KeyError(name)  # pragma: no cover - fields() comes from the same annotations


def spec(cls) -> list[dict]:
    """One dict per setting of `cls`: name, flat name, default, help, (base, element, optional) type."""
    return [{"name": name, "flat": flat_name(cls, name), "default": f.default, "help": f.metadata.get("help", ""),
             "type": _type(cls, f.name)} for name, f in cls.fields().items()]


# --- the settings of a run's components ------------------------------------------------------------------------
# A component (a local objective, the server step, a freeze schedule, the value penalty, client participation, the
# pre-training, the batched engine) declares its settings beside its code as a Settings class registered with
# `component`. A Config takes each by its flat name (Config(prox_mu=0.1), --prox-mu, Flower's prox-mu, the cache
# key's name), keeps the ones that differ from their defaults in Config.components, and gives them back as
# attributes (cfg.prox_mu), so the component reads its settings where it always did.
_COMPONENTS: list = []
_COMPONENT_FLAT: dict = {}


def component(cls):
    """Class decorator: register the settings class of a component (its flat names must be new)."""
    if not (isinstance(cls, type) and issubclass(cls, Settings)) or not cls.prefix:
        raise TypeError(f"component: {cls!r} must subclass Settings and have a prefix")
    taken = component_settings()
    clash = [flat_name(cls, name) for name in cls.fields() if flat_name(cls, name) in taken]
    if clash and cls not in _COMPONENTS:
        raise ValueError(f"component {cls.__name__}: {clash} already belong to another component")
    if cls not in _COMPONENTS:
        _COMPONENTS.append(cls)
        _COMPONENT_FLAT.clear()
    return cls


def component_settings() -> dict:
    """flat name -> (the component's settings class, the setting's field), in registration order."""
    if not _COMPONENT_FLAT:
        for cls in _COMPONENTS:
            for name, f in cls.fields().items():
                _COMPONENT_FLAT[flat_name(cls, name)] = (cls, f)
    return _COMPONENT_FLAT


def check_components(values: dict) -> dict:
    """Config.components normalised: every name a registered component's setting (else a ValueError naming it),
    every value checked by its declaration (`check_value`), the ones at their defaults dropped."""
    if not isinstance(values, dict):
        raise ValueError(f"components must be a dict of component settings by flat name; got {values!r}")
    known = component_settings()
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"components: no component has the setting(s) {unknown} (they are: {', '.join(known)})")
    out = {}
    for flat, (cls, f) in known.items():  # in registration order: one spelling per run
        if flat in values:
            value = check_value(flat, _type(cls, f.name), f.metadata, values[flat])
            if value != f.default:
                out[flat] = value
    return out
