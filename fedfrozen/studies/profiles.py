"""Shared experiment settings of the notebooks: the three profiles and the local learning rates.

`federated(profile, rounds=CPU_ROUNDS, warmup_rounds=CPU_WARMUP)` gives the Config fields every federated
notebook starts from (smoke: digits and a tiny model for CI; cpu: Fashion-MNIST at CPU_SCALE, 100 clients, 10
per round, docs/cpu_profile.md; paper: CIFAR-10 or CIFAR-100 with vit_cifar, 100 clients, 10 per round,
200 rounds, with PAPER_RECIPE: the training recipe of published federated ViT-from-scratch work,
docs/paper_profile.md).

Learning rates, one rule for all methods (fedfrozen.studies.selection.RULE): grid, Dirichlet alpha 0.1, seed 0, the
best validation accuracy averaged over the last 3 evaluations, ties to the smaller lr.
- cpu: `CPU_LR`, selected at the cpu scale by `fedfrozen select-lr --profile cpu` (the table is in the comment above it
  and in docs/cpu_profile.md). `<method>:sgd` arms (`arm`) are the method with SGD_AS_PUBLISHED local
  training. A method not selected at this scale takes FedAvg's selected rate of its optimiser.
- smoke: `SELECTED_LR`, the rates chosen on digits at 40 rounds over {3e-3, 1e-2, 3e-2} (by the final-accuracy
  version of the rule); only CI uses them now. Notes from that selection:
  `scaffold` and `fedfrozen_scaffold` were selected again, by the same rule, when SCAFFOLD's
  control variates became option I under AdamW (validation accuracy at 3e-3/1e-2/3e-2:
  scaffold 0.275/0.317/0.352, fedfrozen_scaffold 0.296/0.268/0.345). `fedtlu` and `fedfrozen_tlu` by the
  same rule: 0.099/0.120/0.127 each; `head_pruning` (s = 0.5): 0.275/0.472/0.556; `fedfrozen_plateau`
  0.394/0.507/0.669; `fedfrozen_drift` (rho 1) 0.394/0.592/0.718; `afedlf` 0.190/0.261/0.190; `fedadamw`
  0.134/0.430/0.669; `local_adamw`, `mifa`, `fedvarp`, `fedsteer` take fedavg's (they equal FedAvg in the rule's
  setting: tests); `fedlada` 0.141/0.359/0.563, `fedact` [recon] 0.197/0.099/0.106, `fedslm` 0.197/0.303/0.458.
- paper: the result of `fedfrozen select-lr --dataset cifar10` (fedfrozen.studies.selection: the same
  rule on PAPER_LR_GRID at the paper scale, stored in results/<dataset>/paper_lr.json), else
  PAPER_DEFAULT_LR for every method. Rates selected at another scale are never used at the paper scale.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..base.io import project_root

__all__ = ["select", "among", "seed_lists", "federated", "dirichlet_fields", "SPARSE_ALPHA",
           "arm", "SELECTED_LR", "CPU_LR", "REGIME_LR_GRID", "REGIME_LR", "REGIMES",
           "PRETRAINED_START", "regime_fields", "regime_setup", "regime_learning_rates", "CPU_SCALE", "CPU_ROUNDS",
           "CPU_WARMUP", "CPU_CENTRALISED", "learning_rates", "PAPER_DATASETS", "PROFILES", "data_root",
           "PAPER_RECIPE", "PAPER_DEFAULT_LR", "PAPER_LR_GRID", "paper_lr_file", "paper_learning_rates"]

PROFILES = ("smoke", "cpu", "paper")
COMMITTED = "cpu"  # the profile whose outputs, figures and tables are committed (notebooks/, figures/)

SELECTED_LR = {
    "fedadagrad": 3e-3, "fedadam": 3e-3, "fedavg": 3e-2, "fedavgm": 3e-3, "feddyn": 3e-3, "fedfrozen": 3e-2,
    "fedfrozen_adam": 3e-3, "fedfrozen_prox": 3e-3, "fedfrozen_scaffold": 3e-2, "fedprox": 3e-3, "fedyogi": 3e-3,
    "freeze_attn": 3e-2, "freeze_body": 3e-3, "freeze_kernel_at_init": 1e-2, "freeze_v": 3e-2, "scaffold": 3e-2,
    "fedtlu": 3e-2, "fedfrozen_tlu": 3e-2, "head_pruning": 3e-2, "fedfrozen_plateau": 3e-2, "fedfrozen_drift": 3e-2,
    "fedadamw": 3e-2, "local_adamw": 3e-2, "mifa": 3e-2, "fedvarp": 3e-2, "fedsteer": 3e-2,
    "fedlada": 3e-2, "fedact": 3e-3, "fedslm": 3e-2,
    "afedlf": 1e-2,
}
PAPER_DATASETS = ("cifar10", "cifar100")

# The cpu profile: Fashion-MNIST at a federated scale this 2-core machine converges in minutes per run
# (measured: docs/cpu_profile.md). 100 clients, 10 sampled per round (seeded), 1 local epoch of batch 16 on a
# fixed stratified 12,000-image subset (1,200 per class; 10% held out for validation, 10% of each client's
# share for its local accuracy), the full 10,000-image test set, vit_fmnist_w48 (patch 7, width 48, depth 3: 0.886
# centralised), local AdamW with a cosine schedule over the rounds (the paper profile's schedule). Evaluated every
# 10 rounds and on every one of the last 10 (`eval_window`): the late measures (late accuracy, oscillation;
# docs/claims.md) come from those 10 rounds. The data is read from data/ or Debian's package, else downloaded.
CPU_ROUNDS = 120  # FedAvg IID gains < 1 point over the last 10% of the rounds (docs/cpu_profile.md)
CPU_WARMUP = 30  # T0 = 25% of the rounds
# vit_fmnist_w48 trained centrally on the federation's 10,800-image pool, 15 epochs (docs/cpu_profile.md): the
# reference FedAvg at IID is measured against (tools/cpu_convergence.py, notebook 11)
CPU_CENTRALISED = 0.846
CPU_SCALE = dict(dataset="fashion_mnist", model="vit_fmnist_w48", train_subset=12000, n_clients=100,
                 clients_per_round=10, batch_size=16, eval_every=10, eval_window=10, lr_schedule="cosine")

# Learning rates at the cpu scale (`fedfrozen select-lr --profile cpu`; grids below). "<method>:sgd" is the method with
# SGD_AS_PUBLISHED local training, beside its AdamW variant.
# Selected at the cpu scale (vit_fmnist_w48, cosine over 120 rounds, Dirichlet 0.1, seed 0), late validation accuracy:
#   fedavg      1e-3 0.652, 3e-3 0.724, 1e-2 0.697, 3e-2 0.595 -> 3e-3
#   fedfrozen   1e-3 0.615, 3e-3 0.699, 1e-2 0.695, 3e-2 0.612 -> 3e-3
#   fedprox     1e-3 0.651, 3e-3 0.711, 1e-2 0.683, 3e-2 0.653 -> 3e-3
#   scaffold    1e-3 0.701, 3e-3 0.602, 1e-2 0.446, 3e-2 0.171 -> 1e-3 (option I under AdamW)
#   fedavg:sgd  1e-2 0.506, 3e-2 0.540, 1e-1 0.547, 3e-1 0.541, 1 diverged -> 1e-1
#   scaffold:sgd 1e-2 0.547, 3e-2 0.574, 1e-1 0.594, 3e-1 0.536, 1 diverged -> 1e-1 (option II)
#   fedprox:sgd 1e-2 0.505, 3e-2 0.540, 1e-1 0.547, 3e-1 0.539, 1 diverged -> 1e-1
#   feddyn:sgd  1e-2 0.549, 3e-2 0.587, 1e-1 0.556, 3e-1 0.595, 1 diverged -> 3e-1
# (3e-1, then 1, joined the SGD grid when the grid's edge won.) fedadam (the paper profile's) is not selected at
# this scale.
# The related systems of notebooks 09-10, by the same rule on the same grid
# (`fedfrozen select-lr --profile cpu --methods <names>`):
#   fedadamw 1e-3 0.416, 3e-3 0.488, 1e-2 0.497, 3e-2 0.424 -> 1e-2
#   fedlada  1e-3 0.505, 3e-3 0.506, 1e-2 0.515, 3e-2 0.474 -> 1e-2
#   fedact   1e-3 0.126, 3e-3 0.286, 1e-2 0.168, 3e-2 0.122 -> 3e-3
#   fedslm   1e-3 0.566, 3e-3 0.701, 1e-2 0.669, 3e-2 0.598 -> 3e-3
#   mifa     1e-3 0.454, 3e-3 0.514, 1e-2 0.536, 3e-2 0.461 -> 1e-2
#   fedvarp  1e-3 0.476, 3e-3 0.579, 1e-2 0.528, 3e-2 0.320 -> 3e-3
#   fedsteer 1e-3 0.638, 3e-3 0.704, 1e-2 0.721, 3e-2 0.588 -> 1e-2
#   afedlf   1e-3 0.568, 3e-3 0.666, 1e-2 0.647, 3e-2 0.544 -> 3e-3
#   fedtlu   1e-3 0.373, 3e-3 0.475, 1e-2 0.544, 3e-2 0.467 -> 1e-2
#   head_pruning 1e-3 0.661, 3e-3 0.716, 1e-2 0.723, 3e-2 0.463 -> 1e-2
CPU_LR = {"fedavg": 3e-3, "fedfrozen": 3e-3, "fedprox": 3e-3, "scaffold": 1e-3,
          "fedavg:sgd": 1e-1, "scaffold:sgd": 1e-1, "fedprox:sgd": 1e-1, "feddyn:sgd": 3e-1,
          "fedadamw": 1e-2, "fedlada": 1e-2, "fedact": 3e-3, "fedslm": 3e-3, "mifa": 1e-2, "fedvarp": 3e-3,
          "fedsteer": 1e-2, "afedlf": 3e-3, "fedtlu": 1e-2, "head_pruning": 1e-2}
CPU_LR_GRID = (1e-3, 3e-3, 1e-2, 3e-2)
# The regimes' grid (REGIMES): one step lower than CPU_LR_GRID, since fine-tuning a pretrained
# model and a rate that never decays both favour smaller rates
REGIME_LR_GRID = (3e-4, 1e-3, 3e-3, 1e-2)
# Pretrained start: the server pre-trains on the training images outside the federation's subset, which no client
# holds (fedfrozen.engine.pretrain; rotation prediction by default, docs/cpu_profile.md).
PRETRAINED_START = dict(init="pretrained")
# The regimes of issue "claims where they could hold" (notebooks 03-06 and 11's map, docs/claims.md): the cpu profile's
# scratch/cosine runs, a pretrained start, a constant local rate (the schedule most federated papers use), both,
# and five local epochs (more client drift) from scratch and pretrained. Each regime's learning rates are selected
# again by the one rule (profiles.REGIME_LR); FedFrozen is always paired with FedAvg of the same regime.
REGIMES = {
    "scratch": {},
    "pretrained": dict(PRETRAINED_START),
    "constant": dict(lr_schedule="constant"),
    "constant_pretrained": dict(PRETRAINED_START, lr_schedule="constant"),
    "local5": dict(local_epochs=5, local_steps=None),
    "local5_pretrained": dict(PRETRAINED_START, local_epochs=5, local_steps=None),
}


# Learning rates of the regimes (REGIMES) at the cpu scale, selected again by the one rule on
# REGIME_LR_GRID with the regime's fields
# (`fedfrozen select-lr --profile cpu --regime <name> --methods fedavg fedfrozen`), late validation accuracy:
#   pretrained           fedavg    3e-4 0.630, 1e-3 0.764, 3e-3 0.765, 1e-2 0.751 -> 3e-3
#                        fedfrozen 3e-4 0.628, 1e-3 0.760, 3e-3 0.764, 1e-2 0.751 -> 3e-3
#   constant             fedavg    3e-4 0.467, 1e-3 0.625, 3e-3 0.593, 1e-2 0.553 -> 1e-3
#                        fedfrozen 3e-4 0.378, 1e-3 0.535, 3e-3 0.585, 1e-2 0.544 -> 3e-3
#   constant_pretrained  fedavg    3e-4 0.661, 1e-3 0.684, 3e-3 0.647, 1e-2 0.557 -> 1e-3
#                        fedfrozen 3e-4 0.653, 1e-3 0.678, 3e-3 0.637, 1e-2 0.558 -> 1e-3
# The related systems of notebook 09 in the pretrained regime (`... --regime pretrained afedlf fedtlu head_pruning`):
#   pretrained           afedlf    3e-4 0.594, 1e-3 0.672, 3e-3 0.742, 1e-2 0.688 -> 3e-3
#                        fedtlu    3e-4 0.457, 1e-3 0.528, 3e-3 0.577, 1e-2 0.648, 3e-2 0.476 -> 1e-2 (3e-2 tried: the
#                                  grid's edge had won)
#                        head_pruning 3e-4 0.458, 1e-3 0.724, 3e-3 0.737, 1e-2 0.700 -> 3e-3
# More local work takes the rates of its start (local5: scratch's CPU_LR; local5_pretrained: pretrained's).
REGIME_LR = {"pretrained": {"fedavg": 3e-3, "fedfrozen": 3e-3, "afedlf": 3e-3, "fedtlu": 1e-2, "head_pruning": 3e-3},
             "constant": {"fedavg": 1e-3, "fedfrozen": 3e-3},
             "constant_pretrained": {"fedavg": 1e-3, "fedfrozen": 1e-3}}
REGIME_LR_FROM = {"local5": "scratch", "local5_pretrained": "pretrained"}
CPU_SGD_LR_GRID = (1e-2, 3e-2, 1e-1, 3e-1, 1.0)
SGD_AS_PUBLISHED = dict(optimizer="sgd", momentum=0.0, weight_decay=0.0)
CPU_SELECTED_ARMS = ["fedavg", "fedfrozen", "fedprox", "scaffold", "fedavg:sgd", "scaffold:sgd", "fedprox:sgd",
                     "feddyn:sgd"]

# The paper profile's local training (sources and reasons: docs/paper_profile.md)
PAPER_DEFAULT_LR = 1e-3
PAPER_SGD_DEFAULT_LR = 3e-2  # SGD arms at the paper scale without a selection
PAPER_LR_GRID = (3e-4, 1e-3, 3e-3)
PAPER_RECIPE = dict(optimizer="adamw", lr=PAPER_DEFAULT_LR, weight_decay=0.05, batch_size=32, local_epochs=1,
                    lr_schedule="cosine", lr_warmup_rounds=10, grad_clip=1.0, augment=True)


def among(name: str, given, allowed) -> list:
    """`given` as a list, or a ValueError naming `name` and what is not among `allowed` (a notebook's cells)."""
    bad = [g for g in given if g not in allowed]
    if bad:
        raise ValueError(f"{name} must be among {', '.join(allowed)}; got {bad}")
    return list(given)


def seed_lists(**seeds) -> tuple:
    """Each of the keyword seed ranges as a list, or a ValueError naming them when one is empty."""
    out = tuple(list(v) for v in seeds.values())
    if not all(out):
        raise ValueError(f"{' and '.join(seeds)} must not be empty")
    return out


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


def federated(profile: str, rounds: int = CPU_ROUNDS, warmup_rounds: int = CPU_WARMUP,
              paper_dataset: str = "cifar10") -> dict:
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
        cpu=dict(CPU_SCALE, rounds=rounds, warmup_rounds=warmup_rounds, download=True, data_root=data_root()),
        paper=dict(dataset=paper_dataset, model="vit_cifar", rounds=200, warmup_rounds=50, n_clients=100,
                   clients_per_round=10, eval_every=5, eval_window=10, download=True, data_root=data_root(),
                   **{**PAPER_RECIPE, **(_paper_overrides(paper_dataset) if profile == "paper" else {})}))


def _paper_overrides(dataset: str) -> dict:
    """amp on a GPU; the lr of fedfrozen from the paper-scale selection, when there is one."""
    import torch

    selected = paper_learning_rates(dataset) or {}
    return dict(amp=torch.cuda.is_available(), lr=selected.get("fedfrozen", PAPER_DEFAULT_LR))


def paper_lr_file(dataset: str, root=None) -> Path:
    """Where `fedfrozen select-lr` stores the paper-scale learning rates of `dataset`."""
    return (Path(root) if root is not None else project_root() / "results") / dataset / "paper_lr.json"


def paper_learning_rates(dataset: str, root=None) -> dict | None:
    """{method: lr} selected at the paper scale for `dataset`, or None if no selection was run."""
    path = paper_lr_file(dataset, root)
    if not path.is_file():
        return None
    try:
        return {m: float(v) for m, v in json.loads(path.read_text())["lr"].items()}
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a learning-rate selection ({e}); delete it or run "
                         f"`fedfrozen select-lr --dataset {dataset}` again") from None


def arm(name: str) -> dict:
    """Config fields of an arm: a registered method, or `<method>:sgd`, the method with plain SGD local training
    as its paper ran it (SGD_AS_PUBLISHED), beside its AdamW variant."""
    method, _, variant = name.partition(":")
    if variant not in ("", "sgd"):
        raise ValueError(f"arm {name!r}: the only variant is ':sgd' (plain SGD, as published)")
    return dict(method=method, **(SGD_AS_PUBLISHED if variant else {}))


def learning_rates(methods, overrides: dict | None = None, profile: str = "cpu", dataset: str = "digits",
                   root=None) -> dict:
    """The local lr of each method or arm (`<method>:sgd`): `overrides` first, then the profile's table.

    cpu: CPU_LR (selected at the cpu scale by the one rule); a method not selected there takes FedAvg's selected
    rate of its optimiser (CPU_LR["fedavg"] or CPU_LR["fedavg:sgd"]), said in docs/cpu_profile.md. smoke:
    SELECTED_LR (digits; SGD arms 0.05). paper: the paper-scale selection or PAPER_DEFAULT_LR. A clear error for
    a name in none of them."""
    from .. import methods as registry

    select(profile, smoke=None, cpu=None, paper=None)  # a clear error for a typo
    known = set(registry.names())
    if profile == "paper":
        selected = paper_learning_rates(dataset, root) or {}
        base = {m: selected.get(m, PAPER_DEFAULT_LR) for m in known}
        base.update({f"{m}:sgd": selected.get(f"{m}:sgd", PAPER_SGD_DEFAULT_LR) for m in known})
    elif profile == "cpu":
        base = {m: CPU_LR["fedavg"] for m in known}
        base.update({f"{m}:sgd": CPU_LR["fedavg:sgd"] for m in known})
        base.update(CPU_LR)
    else:
        base = {**SELECTED_LR, **{f"{m}:sgd": 0.05 for m in SELECTED_LR}}
    table = {**base, **(overrides or {})}
    missing = [m for m in methods if m not in table]
    if missing:
        raise ValueError(f"no learning rate for {missing}: add them to the notebook's `lrs` parameter "
                         f"(known: {sorted(table)})")
    return {m: table[m] for m in methods}


def regime_learning_rates(regime: str, methods, overrides: dict | None = None, profile: str = "cpu",
                          dataset: str = "digits", root=None) -> dict:
    """The local lr of each method in a regime (REGIMES): at the cpu profile the rates selected
    again for it (REGIME_LR; more local work takes its start's, REGIME_LR_FROM); a method not selected there, the
    scratch regime and the smoke and paper profiles take the profile's rates (`learning_rates`). `overrides`
    ({method: lr}) come first."""
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {', '.join(REGIMES)}; got {regime!r}")
    rates = learning_rates(methods, overrides, profile=profile, dataset=dataset, root=root)
    if profile == "cpu":
        selected = REGIME_LR.get(REGIME_LR_FROM.get(regime, regime), {})
        rates.update({m: selected[m] for m in methods if m in selected and m not in (overrides or {})})
    return rates


# Below this Dirichlet alpha the NIID-Bench draw cannot give each of the cpu profile's 100 clients (10,800 images)
# two images (every one of its bounded redraws leaves a client with fewer): such cells allow one (Config field
# min_client_samples; the same scheme and clients otherwise). The default, 2, is every other cell's partition.
SPARSE_ALPHA = 0.1


def dirichlet_fields(alpha: float) -> dict:
    """Config fields of a Dirichlet(alpha) federation as the notebooks draw it: below SPARSE_ALPHA a client may
    hold a single image (min_client_samples=1), else the default minimum of two."""
    fields = {"partition": "dirichlet", "alpha": float(alpha)}
    if alpha < SPARSE_ALPHA:
        fields["min_client_samples"] = 1
    return fields


def regime_fields(name: str) -> dict:
    """Config fields of a regime (REGIMES), laid over a profile's."""
    if name not in REGIMES:
        raise ValueError(f"regime must be one of {', '.join(REGIMES)}; got {name!r}")
    return dict(REGIMES[name])


def regime_setup(profile: str, base: dict, name: str) -> dict | None:
    """The Config fields of regime `name` over a profile's fields `base` (`federated`), as the notebooks' regime
    sections run it, or None where the profile cannot: a pretrained start needs training images no client holds
    (`train_subset`), and the paper profile gives the clients every image. The smoke profile's digits take a
    1,000-image federation and one pre-training epoch."""
    fields = {**base, **regime_fields(name)}
    if select(profile, smoke=True, cpu=False, paper=False):
        fields.update(train_subset=1000, pretrain_epochs=1)
    if fields.get("init") == "pretrained" and fields.get("train_subset") is None:
        return None
    return fields
