"""Shared experiment settings of notebooks 03-07: the three profiles and the selected learning rates.

`federated(profile, rounds=40, warmup_rounds=10)` gives the Config fields every federated
notebook starts from (smoke: a tiny model for CI; cpu: digits at the project defaults; paper:
CIFAR-10 or CIFAR-100 with vit_cifar, 100 clients, 10 per round, 200 rounds). `SELECTED_LR` is the local
learning rate per method chosen by one rule for all methods (issue 5, see the README): grid
{3e-3, 1e-2, 3e-2}, Dirichlet alpha 0.1, seed 0, best final validation accuracy, ties to the
smaller lr. It was chosen on digits at 40 rounds; on the paper profile it is a starting point,
not a tuned value. `scaffold` and `fedfrozen_scaffold` were selected again, by the same rule, when
SCAFFOLD's control variates became option I under AdamW (validation accuracy at 3e-3/1e-2/3e-2:
scaffold 0.275/0.317/0.352, fedfrozen_scaffold 0.296/0.268/0.345).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["select", "federated", "SELECTED_LR", "learning_rates", "PAPER_DATASETS", "PROFILES", "data_root"]

PROFILES = ("smoke", "cpu", "paper")

SELECTED_LR = {
    "fedadagrad": 3e-3, "fedadam": 3e-3, "fedavg": 3e-2, "fedavgm": 3e-3, "feddyn": 3e-3, "fedfrozen": 3e-2,
    "fedfrozen_adam": 3e-3, "fedfrozen_prox": 3e-3, "fedfrozen_scaffold": 3e-2, "fedprox": 3e-3, "fedyogi": 3e-3,
    "freeze_attn": 3e-2, "freeze_body": 3e-3, "freeze_kernel_at_init": 1e-2, "freeze_v": 3e-2, "scaffold": 3e-2,
}
PAPER_DATASETS = ("cifar10", "cifar100")


def select(profile: str, **settings):
    """The settings of `profile` (one keyword argument per profile), with a clear error for a typo."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}; got {profile!r}")
    if profile not in settings:
        raise ValueError(f"no settings given for profile {profile!r}")
    return settings[profile]


def data_root() -> str:
    """Where the paper profile reads datasets: the project's data/ seen from notebooks/ ("../data") when
    run inside the repository, else "data" beside the notebook (e.g. /content/data on Colab)."""
    return "../data" if Path("../pyproject.toml").is_file() and Path("../notebooks").is_dir() else "data"


def federated(profile: str, rounds: int = 40, warmup_rounds: int = 10, paper_dataset: str = "cifar10") -> dict:
    """Config fields of `profile` for the federated notebooks.

    `rounds` and `warmup_rounds` apply to the cpu profile; `paper_dataset` (cifar10 or cifar100)
    to the paper profile. The dict always names its dataset, which the notebooks use as the
    results folder (results/<dataset>/).
    """
    if paper_dataset not in PAPER_DATASETS:
        raise ValueError(f"paper_dataset must be one of {', '.join(PAPER_DATASETS)}; got {paper_dataset!r}")
    return select(
        profile,
        smoke=dict(dataset="digits", rounds=3, warmup_rounds=1, n_clients=5, local_steps=2, eval_every=1,
                   model_kwargs=dict(embed_dim=16, depth=1, num_heads=2)),
        cpu=dict(dataset="digits", rounds=rounds, warmup_rounds=warmup_rounds, eval_every=5),
        paper=dict(dataset=paper_dataset, model="vit_cifar", rounds=200, warmup_rounds=50, n_clients=100,
                   clients_per_round=10, eval_every=5, download=True, data_root=data_root()))


def learning_rates(methods, overrides: dict | None = None) -> dict:
    """The local lr of each method: `overrides` first, then SELECTED_LR; a clear error for a method in neither."""
    table = {**SELECTED_LR, **(overrides or {})}
    missing = [m for m in methods if m not in table]
    if missing:
        raise ValueError(f"no learning rate for {missing}: add them to the notebook's `lrs` parameter "
                         f"(known: {sorted(table)})")
    return {m: table[m] for m in methods}
