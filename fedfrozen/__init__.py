"""fedfrozen: two-stage federated optimisation via attention kernel freezing (arXiv 2605.06446).

    import fedfrozen as ff
    train, test = ff.data.load("digits")
    cfg = ff.Config(method="fedfrozen", alpha=0.1, rounds=60, warmup_rounds=15)
    hist = ff.run(cfg)

The package is laid out by layer (docs/development.md), bottom first: `base` (io, progress, rng, history), `inputs`
(the datasets, partitions, augmentation, feature shifts), `nets` (the models, their Q/K/V split, flat parameters and
the update rule), `theory`, `methods`, `engine` (a run: config, setup, local training, the round, the loop), `runs`
(the cache, parallel and cluster runs), `flower`, `studies` (what the notebooks call) and the command line. Every
module is also reachable by its short name: `ff.data`, `ff.loop`, `ff.io`, `from fedfrozen import recipes`.
"""

import importlib as _importlib
import warnings as _warnings

from ._version import __version__

with _warnings.catch_warnings():
    # tqdm.auto warns (once, at import, with a path of this machine) when ipywidgets is missing;
    # timm imports it too. Import it here quietly so that notebook outputs stay clean.
    _warnings.simplefilter("ignore")
    import tqdm.auto  # noqa: F401

from . import methods  # noqa: E402
from .base.history import History  # noqa: E402
from .engine.config import Config  # noqa: E402
from .engine.loop import run  # noqa: E402
from .runs.experiments import run_many, run_or_load  # noqa: E402
from .studies.verification import verify  # noqa: E402

# each layer's modules by their short names (ff.data, ff.loop, from fedfrozen import recipes): imported on first use
MODULES = {
    "base": ("rng", "progress", "io", "history"),
    "inputs": ("shakespeare", "data", "partition", "augment", "shift"),
    "nets": ("layouts", "models", "qkv", "flat", "update"),
    "theory": ("linear_attention", "attention_sim"),
    "engine": ("config", "checkpoint", "pretrain", "local", "batched", "setup", "messages", "metrics", "clients",
               "server", "round", "loop"),
    "runs": ("cluster", "experiments", "archive", "dryrun", "timing"),
    "studies": ("profiles", "verdicts", "plots", "measures", "convergence", "tables", "selection", "study",
                "controls", "paper", "regime", "families", "recipes", "roles", "report", "budgets", "verification"),
}
_LAYER_OF = {m: layer for layer, names in MODULES.items() for m in names}


def __getattr__(name: str):
    """`ff.<module>` for every module of the layers (MODULES), imported on first use."""
    if name in _LAYER_OF:
        module = _importlib.import_module(f".{_LAYER_OF[name]}.{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'fedfrozen' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_LAYER_OF})


# the names every notebook uses, bound now (as before the layout: `ff.data`, `ff.tables`, ...)
for _name in ("controls", "data", "experiments", "layouts", "models", "partition", "plots", "profiles", "qkv",
              "regime", "tables", "verification", "io", "loop"):
    __getattr__(_name)

__all__ = ["Config", "History", "run", "run_or_load", "run_many", "controls", "data", "experiments", "methods",
           "models", "layouts", "partition", "plots", "profiles", "qkv", "regime", "tables", "verification", "verify",
           "__version__"]
