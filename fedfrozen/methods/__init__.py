"""Federated methods as hooks on one round loop, and the registry of their names.

    fedfrozen.methods.Method         the hooks, FedAvg's behaviour by default (base.py)
    fedfrozen.methods.register(...)  add a method; build(cfg) makes one; describe() lists them
    components: objective.py (plain, prox), scaffold.py, feddyn.py, fedopt.py (server steps),
                freezing.py (schedules)
    a method's own settings: settings.py (Settings, setting), given as Config.method_args; a component's
    (ProxSettings, ServerSettings, FreezeSettings, ...): declared beside it with `component`, given by flat name
    (Config(prox_mu=0.1)) and kept in Config.components

Update rules and sources: docs/methods.md.
"""

from .base import LOCAL_OBJECTIVES, Method
from .fedopt import DEFAULT_SERVER_LR, SERVER_STEPS, ServerOptimizer
from .freezing import FREEZE_SCHEDULES, FreezeSchedule, freeze_round
from .objective import LocalObjective
from .registry import (
    build,
    composition,
    describe,
    flat_names,
    flat_settings,
    methods_with,
    names,
    register,
    results_revision,
    settings_class,
    unregister,
)
from .scaffold import SCAFFOLD_VARIANTS, scaffold_variant
from .settings import Settings, check_components, component, component_settings, setting

SERVER_OPTIMIZERS = tuple(SERVER_STEPS)

__all__ = ["freeze_round", "Method", "LocalObjective", "FreezeSchedule", "ServerOptimizer", "register", "unregister",
           "names", "describe", "build", "composition", "results_revision", "LOCAL_OBJECTIVES", "SERVER_OPTIMIZERS",
           "SERVER_STEPS",
           "FREEZE_SCHEDULES", "DEFAULT_SERVER_LR", "SCAFFOLD_VARIANTS", "scaffold_variant",
           "Settings", "setting", "settings_class", "flat_names", "flat_settings", "methods_with", "component",
           "component_settings", "check_components"]
