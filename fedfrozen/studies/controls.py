"""Controlled comparisons: FedFrozen against FedAvg where the two arms differ in one thing (notebook 03 § 3).

Notebooks 03 and 04 select each arm's local rate on the validation split (profiles.REGIME_LR), so at a constant rate
from scratch FedAvg runs at 1e-3 and FedFrozen at 3e-3: their runs differ from round 0, long before anything
freezes. Their pretrained cells start every seed from one body (pretrain_seed 0), so 15 seeds are 15 federations over
one kernel, chosen by one task. The cells here take each of those factors apart (docs/claims.md, "One thing at a
time"):

- `constant`: a constant rate from scratch, FedAvg and FedFrozen (T0 = 25% and 50% of the rounds) each at both
  selected rates (1e-3 and 3e-3), so each pair can be judged at a shared rate as well as at each arm's own;
- `bodies`: a pretrained start whose body is pre-trained with the run's own seed (pretrain_seed = seed: one body
  per seed), FedAvg, FedFrozen at T0 = 0 and 25%, and the linear probe (freeze_body from round 0: how much the
  body alone already solves);
- `classes`: the same with the supervised pre-training task (`pretrain_task="classes"`), fewer seeds;
- `rates`: the `bodies` pair (FedAvg, FedFrozen T0 = 25%) at each rate of RATES, fewer seeds (does the sign of
  C1 pretrained depend on the rate chosen on seed 0?);
- `local5`: five local epochs from scratch (the rates of the scratch regime), the pair at 15 seeds.

    arms = controls.build(profile, base, seeds=range(15), few=range(5))   # [Arm(cell, arm, cfg), ...]
    rows = controls.comparisons(arms)                       # [Comparison(claim, label, cell, a, b, measure), ...]

Every arm of a cell shares the cell's seeds, its data, partition and start, so paired by seed the two arms of a
comparison differ in the one setting their labels name (tests/test_controls.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.config import Config
from .profiles import among, dirichlet_fields, regime_learning_rates, regime_setup, seed_lists, select
from .study import Comparison, Study, arm_label, fedfrozen_vs_fedavg, t0

__all__ = ["Arm", "arms_of", "RATES", "CONSTANT_RATES", "CELLS", "build", "study", "comparisons", "shared_rate_rows",
           "rate_rows", "arm_label", "profile_seeds"]

CONSTANT_RATES = (1e-3, 3e-3)  # the rates selected for FedAvg and for FedFrozen at a constant rate (REGIME_LR)
RATES = (1e-3, 3e-3, 1e-2)  # the `rates` cell: REGIME_LR_GRID's rates around the pretrained regime's choice
CELLS = ("constant", "bodies", "classes", "rates", "local5")


@dataclass(frozen=True)
class Arm:
    """One arm of a cell, one of its seeds: the cell ("constant, Dir 0.1"), the arm ("fedfrozen T0 25% @ 1e-3"),
    the Config of that seed, the model's short name where the cell compares models (notebooks 12-14), T0 as a
    fraction of the rounds (None for FedAvg, or where the arm does not say) and the run's budget as a multiple of its
    cell's first (notebook 15; 1 elsewhere)."""

    cell: str
    arm: str
    cfg: Config
    model: str = ""
    fraction: float | None = None
    budget: int = 1


def arms_of(cell: str, fields: dict, alpha: float, seeds, plan, rounds: int, model: str = "",
            bodies: bool = False) -> list[Arm]:
    """One Arm per (method, fraction, rate) of `plan` and seed, at Dirichlet `alpha`: T0 the fraction of `rounds`
    (FedAvg, fraction None, keeps fields' warmup_rounds); `bodies`: a pretrained run's body pre-trained with its own
    seed."""
    out = []
    for method, fraction, lr in plan:
        warmup = fields["warmup_rounds"] if fraction is None else t0(rounds, fraction)
        for s in seeds:
            cfg = Config(method=method, seed=s, **dirichlet_fields(alpha), **{**fields, "lr": lr,
                                                                               "warmup_rounds": warmup})
            if bodies and cfg.init == "pretrained":
                cfg = cfg.replace(pretrain_seed=s)
            out.append(Arm(cell, arm_label(method, fraction, lr), cfg, model, fraction))
    return out


def build(profile: str, base: dict, seeds=range(15), few=range(5), alpha: float = 0.1, few_alphas=(0.05,),
          cells=CELLS) -> list[Arm]:
    """Every arm of the controlled cells `cells` (in CELLS' order, the first the most important), one Arm per seed:
    `seeds` for the main cells (constant at `alpha`, bodies, local5), `few` for the others (constant at each of
    `few_alphas`, classes, rates). `base` is the profile's fields (profiles.federated). A cell the profile cannot
    run (a pretrained start at the paper profile: no images outside the clients') is left out."""
    cells = among("cells", cells, CELLS)
    seeds, few = seed_lists(seeds=seeds, few=few)
    rounds = base["rounds"]
    out: list[Arm] = []
    for cell in CELLS:
        if cell not in cells:
            continue
        if cell == "constant":
            fields = regime_setup(profile, base, "constant")
            grid = [(m, f, lr) for lr in CONSTANT_RATES for m, f in (("fedavg", None), ("fedfrozen", 0.25),
                                                                      ("fedfrozen", 0.5))]
            out += arms_of(f"constant, Dir {alpha:g}", fields, alpha, seeds, grid, rounds)
            for a in few_alphas:
                out += arms_of(f"constant, Dir {a:g}", fields, a, few, grid, rounds)
            continue
        regime = "local5" if cell == "local5" else "pretrained"
        fields = regime_setup(profile, base, regime)
        if fields is None:
            continue
        # every arm of the cell at FedAvg's rate (at the cpu profile FedFrozen selected the same)
        r = regime_learning_rates(regime, ["fedavg"], profile=profile, dataset=base["dataset"])["fedavg"]
        if cell == "local5":
            out += arms_of(f"local5, Dir {alpha:g}", fields, alpha, seeds,
                           [("fedavg", None, r), ("fedfrozen", 0.25, r)], rounds)
        elif cell == "bodies":
            grid = [("fedavg", None, r), ("fedfrozen", 0.0, r), ("fedfrozen", 0.25, r), ("freeze_body", 0.0, r)]
            out += arms_of(f"bodies, Dir {alpha:g}", fields, alpha, seeds, grid, rounds, bodies=True)
        elif cell == "classes":
            grid = [("fedavg", None, r), ("fedfrozen", 0.0, r), ("fedfrozen", 0.25, r)]
            out += arms_of(f"classes, Dir {alpha:g}", {**fields, "pretrain_task": "classes"}, alpha, few, grid, rounds,
                           bodies=True)
        elif cell == "rates":
            grid = [(m, f, rate) for rate in RATES for m, f in (("fedavg", None), ("fedfrozen", 0.25))]
            out += arms_of(f"rates, Dir {alpha:g}", fields, alpha, few, grid, rounds, bodies=True)
    return out


def comparisons(arms: list[Arm]) -> list[Comparison]:
    """The comparisons of the built cells, (claim, label, cell, arm a, arm b): a minus b paired by seed.

    constant: each FedFrozen T0 against FedAvg at each shared rate (C1 for T0 25%, C2 for 50%), and at each arm's
    selected rate (FedFrozen 3e-3 against FedAvg 1e-3: the comparison of notebooks 03 and 04, now on runs of one
    machine); bodies and classes: FedFrozen T0 25% (C1) and 0 (C2) against FedAvg, and the probe against FedAvg
    (C4: the whole body frozen); local5: the pair. The `rates` cell is its own table (`rate_rows`); the constant
    cells' pairs at a shared rate are also `shared_rate_rows`."""
    have = {(a.cell, a.arm) for a in arms}
    rows = []

    def add(claim, label, cell, a, b):
        if (cell, a) in have and (cell, b) in have:
            rows.append(Comparison(claim, label, cell, a, b))

    for cell in dict.fromkeys(a.cell for a in arms):
        kind = _kind(cell)
        if kind == "constant":
            rows += _shared_rate(cell, have)
            for f, claim in ((0.25, "C1"), (0.5, "C2")):
                add(claim, f"FedFrozen T0 {f:.0%} at {CONSTANT_RATES[1]:g} − FedAvg at {CONSTANT_RATES[0]:g} "
                    f"(each its selected rate), {cell}", cell, arm_label("fedfrozen", f, CONSTANT_RATES[1]),
                    arm_label("fedavg", None, CONSTANT_RATES[0]))
        elif kind in ("bodies", "classes", "local5"):
            (r,) = {a.cfg.lr for a in arms if a.cell == cell}
            fs = (0.25,) if kind == "local5" else (0.0, 0.25)
            for f in fs:  # T0 = 25%: C1's comparison; T0 = 0 (the pretrained kernel frozen throughout): C2's
                add("C1" if f else "C2", f"FedFrozen T0 {f:.0%} − FedAvg, {cell}", cell, arm_label("fedfrozen", f, r),
                    arm_label("fedavg", None, r))
            # the probe (the whole body frozen from round 0): C4's freezing of every group, and how much the body
            # alone solves
            add("C4", f"linear probe − FedAvg, {cell}", cell, arm_label("freeze_body", 0.0, r),
                arm_label("fedavg", None, r))
    return rows


def _shared_rate(cell: str, have: set) -> list[Comparison]:
    """A constant cell's FedFrozen (T0 25%, 50%) − FedAvg rows at each shared rate, where both arms were built."""
    rows = [fedfrozen_vs_fedavg(cell, f, lr) for lr in CONSTANT_RATES for f in (0.25, 0.5)]
    return [r for r in rows if (cell, r.a) in have and (cell, r.b) in have]


def shared_rate_rows(arms: list[Arm]) -> list[Comparison]:
    """The rows of `comparisons` that pair FedFrozen with FedAvg at one shared rate in a constant cell, in their
    order: where the rate stays up, notebook 03 judges C1's stability (oscillation) on them too."""
    have = {(a.cell, a.arm) for a in arms}
    return [r for cell in dict.fromkeys(a.cell for a in arms) if _kind(cell) == "constant"
            for r in _shared_rate(cell, have)]


def _kind(cell: str) -> str:
    """The kind of a cell this module built and named ("constant, Dir 0.1" -> "constant")."""
    return cell.split(",")[0]


def rate_rows(arms: list[Arm]) -> list[tuple]:
    """The `rates` cell's comparisons: FedFrozen T0 25% − FedAvg at each rate (claim, label, cell, a, b)."""
    rows = []
    for cell in dict.fromkeys(a.cell for a in arms if _kind(a.cell) == "rates"):
        for lr in sorted({a.cfg.lr for a in arms if a.cell == cell}):
            rows.append(Comparison("C1", f"FedFrozen T0 25% − FedAvg, both at {lr:g}, pretrained (a body per seed)",
                                   cell, arm_label("fedfrozen", 0.25, lr), arm_label("fedavg", None, lr)))
    return rows


def profile_seeds(profile: str, seeds, few, smoke_seeds):
    """The seeds of the main and the few-seed cells at a profile (smoke: `smoke_seeds` for both)."""
    return select(profile, smoke=(list(smoke_seeds), list(smoke_seeds)), cpu=(list(seeds), list(few)),
                  paper=(list(seeds), list(few)))


def study(profile: str, base: dict, seeds=range(15), few=range(5), alpha: float = 0.1, few_alphas=(0.05,),
          cells=CELLS) -> Study:
    """Notebook 03 § 3's study: `build`'s arms and their `comparisons` (the `rates` cell's are `rate_rows`, a family
    of their own)."""
    arms = build(profile, base, seeds=seeds, few=few, alpha=alpha, few_alphas=few_alphas, cells=cells)
    return Study("03_controls", tuple(arms), tuple(comparisons(arms)))
