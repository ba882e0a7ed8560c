"""fedfrozen: two-stage federated optimisation via attention kernel freezing (arXiv 2605.06446)."""

__version__ = "0.1.0"

from . import data, models, partition, qkv  # noqa: E402,F401
