"""fedfrozen: two-stage federated optimisation via attention kernel freezing (arXiv 2605.06446).

    import fedfrozen as ff
    train, test = ff.data.load("digits")
    cfg = ff.Config(method="fedfrozen", alpha=0.1, rounds=60, warmup_rounds=15)
    hist = ff.run(cfg)
"""

__version__ = "0.1.0"

import warnings as _warnings  # noqa: E402

with _warnings.catch_warnings():
    # tqdm.auto warns (once, at import, with a path of this machine) when ipywidgets is missing;
    # timm imports it too. Import it here quietly so that notebook outputs stay clean.
    _warnings.simplefilter("ignore")
    import tqdm.auto  # noqa: E402,F401

from . import (  # noqa: E402
    controls,
    data,
    experiments,
    layouts,
    methods,
    models,
    partition,
    plots,
    profiles,
    qkv,
    regime,
    tables,
    verification,
)
from .config import Config  # noqa: E402
from .experiments import run_many, run_or_load  # noqa: E402
from .history import History  # noqa: E402
from .loop import run  # noqa: E402
from .verification import verify  # noqa: E402

__all__ = ["Config", "History", "run", "run_or_load", "run_many", "controls", "data", "experiments", "methods",
           "models", "layouts", "partition", "plots", "profiles", "qkv", "regime", "tables", "verification", "verify",
           "__version__"]
