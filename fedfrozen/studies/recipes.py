"""The verdict beyond one recipe (notebook 13): C1 where a drifting attention kernel should hurt most.

Every other verdict of this project comes from one recipe: local AdamW, Dirichlet label skew, a ViT that sees 16
patch tokens. The cells here change one of those at a time, each a comparison with FedAvg of the same setting, paired
by seed and judged as one family (fedfrozen.studies.verdicts), from scratch (the pretrained body was trained to predict
rotations: it is not used here):

- `sgd`: plain local SGD (no momentum, no weight decay: `profiles.SGD_AS_PUBLISHED`, as the FedAvg, FedProx,
  SCAFFOLD and FedDyn papers ran it; the paper's theory is gradient descent) at Dirichlet 0.1, with a budget
  (SGD_BUDGET: 5 local epochs, 240 rounds) measured on SELECTION_SEED: docs/cpu_profile.md's plateau test is met by
  no budget at Dirichlet 0.1 (the cosine schedule's settling dominates it), and at this one plain-SGD FedAvg is above
  AdamW FedAvg's level (`plateau_gain` prints the test's gain); the rate by the one rule on CPU_SGD_LR_GRID for
  FedAvg and for FedFrozen (T0 25%). Both arms at FedAvg's rate (the shared rate), and each at its own best as a
  second row;
- `adamw`: notebook 03's AdamW C1 pair at Dirichlet 0.1 (the same Configs: its five seeds load from the cache),
  brought to the sgd cell's seeds, so the two optimisers are compared at the same n;
- `rotation`, `patch_permutation`: IID labels and clients that see different inputs (fedfrozen.inputs.shift: client i in
  group i mod SHIFT_GROUPS, its images turned by 90°·g, or with its patches in group g's order), at AdamW's base rate;
  `late_acc` is the mean over the groups' test sets, `worst_group_acc` the lowest group's late accuracy;
- `p4`: the 49-token ViT (`vit_fmnist_p4`: patch 4, width 64, depth 3, 4 heads) at Dirichlet 0.1, its rate by the
  rule on CPU_LR_GRID on SELECTION_SEED (both arms at both rates where they choose differently);
- `p4_w48`: the adamw cell's ViT (`vit_fmnist_w48`: width 48, depth 3, 4 heads) at patch 4, so 49 tokens where the
  adamw cell's sees 16 and nothing else changes (the same rate, AdamW's base rate, the same seeds): the pair only.
  On the smoke and paper profiles the p4 cell already keeps the base model's width, so this cell would repeat its
  runs and is not built (`build` skips it where its fields are p4's).

FedFrozen at T0 = 25% of the rounds is C1's arm (on `seeds_pair`); T0 = 0 and 50% are C2's neighbours (on
`seeds_rest`; the sgd cell runs 50% only, the adamw cell the pair only).

    rates, table = recipes.rates_by_rule(profile, base, ["sgd", "p4"])     # the rule, seed 100
    arms = recipes.build(profile, base, rates, seeds_pair=range(15), seeds_rest=range(5))
    rows = recipes.comparisons(arms)                        # [Comparison(claim, label, cell, a, b, measure)]
"""

from __future__ import annotations

import numpy as np

from ..engine.config import Config
from .controls import Arm
from .profiles import (
    CPU_LR_GRID,
    CPU_SGD_LR_GRID,
    SGD_AS_PUBLISHED,
    among,
    dirichlet_fields,
    learning_rates,
    seed_lists,
    select,
)
from .study import SELECTION_SEED, Comparison, Study, against_fedavg, arm_label, cells_by_rule, t0

__all__ = ["study", "CELLS", "SELECTION_SEED", "SHIFT_GROUPS", "SGD_BUDGET", "PLATEAU_POINTS", "cell_fields", "grid_of",
           "selection_configs", "rates_by_rule", "plateau_gain", "build", "comparisons"]

CELLS = ("sgd", "adamw", "rotation", "patch_permutation", "p4", "p4_w48")
SHIFT_GROUPS = 4  # four client groups: quarter turns (exact), four patch orders
# Plain SGD's budget: local epochs and rounds, measured on SELECTION_SEED (docs/cpu_profile.md, "Plain SGD's budget":
# docs' test 1 is met by no budget at Dirichlet 0.1; at this one plain-SGD FedAvg is above AdamW's level, 0.732)
SGD_BUDGET = dict(local_epochs=5, rounds=240)
PLATEAU_POINTS = 1.0  # docs/cpu_profile.md's test 1: < 1 point of test accuracy gained over the last 10% of rounds
SMOKE_BUDGET = dict(local_steps=2, rounds=3)


def cell_fields(profile: str, base: dict, cell: str) -> dict:
    """The Config fields every run of `cell` shares (its arms add method, rate, T0 and seed), over the profile's
    fields `base` (profiles.federated)."""
    if cell not in CELLS:
        raise ValueError(f"cell must be one of {', '.join(CELLS)}; got {cell!r}")
    fields = {k: v for k, v in base.items() if k not in ("method", "lr")}
    smoke = select(profile, smoke=True, cpu=False, paper=False)
    if cell == "sgd":
        return {**fields, **dirichlet_fields(0.1), **SGD_AS_PUBLISHED, **(SMOKE_BUDGET if smoke else SGD_BUDGET)}
    if cell in ("adamw", "p4", "p4_w48"):
        fields.update(dirichlet_fields(0.1))
        more_tokens = dict(model_kwargs={**base.get("model_kwargs", {}),  # the base model at a smaller patch
                                         "patch_size": select(profile, smoke=1, cpu=4, paper=2)})
        if cell == "p4":
            fields.update(select(profile, smoke=more_tokens, cpu=dict(model="vit_fmnist_p4"), paper=more_tokens))
        elif cell == "p4_w48":
            fields.update(more_tokens)
        return fields
    return {**fields, "partition": "iid", "shift": cell, "shift_groups": 2 if smoke else SHIFT_GROUPS}


def grid_of(profile: str, cell: str) -> tuple:
    """The rates the rule chooses from for `cell` (sgd: CPU_SGD_LR_GRID; p4: CPU_LR_GRID; the smoke profile two)."""
    grid = CPU_SGD_LR_GRID if cell == "sgd" else CPU_LR_GRID
    return select(profile, smoke=grid[1:3], cpu=grid, paper=grid)


def selection_configs(profile: str, base: dict, cell: str, grid=None) -> list[Config]:
    """The configs the one rule (selection.RULE) compares for `cell`: FedAvg and FedFrozen (T0 25%) at each rate of
    its grid, on SELECTION_SEED (which no comparison evaluates)."""
    fields = cell_fields(profile, base, cell)
    fields.update(warmup_rounds=t0(fields["rounds"], 0.25), seed=SELECTION_SEED)
    return [Config(method=m, lr=float(lr), **fields) for m in ("fedavg", "fedfrozen")
            for lr in (grid_of(profile, cell) if grid is None else grid)]


def rates_by_rule(profile: str, base: dict, cells=("sgd", "p4"), experiment: str | None = None):
    """Each cell's rates by the one rule (selected_rates on its selection_configs, trained or loaded). Returns
    (rates {cell: {method: rate}}, a table of every selection run: cell, method, lr, late validation accuracy, and
    for FedAvg the gain over the last 10% of the rounds, `plateau_gain`)."""
    sel = {c: selection_configs(profile, base, c) for c in cells}
    return cells_by_rule(sel, experiment or base["dataset"], lambda c, h: dict(gain_points=plateau_gain(h, c.rounds)))


def plateau_gain(hist, rounds: int) -> float | None:
    """Points of test accuracy gained over the last 10% of the rounds (from round 0.9·T, interpolated between the
    evaluations, to the last): docs/cpu_profile.md's test 1 (a plateau: < PLATEAU_POINTS). None for a diverged run."""
    if hist.diverged:
        return None
    evaluated = [(row["round"] + 1, row["test_acc"]) for row in hist.rows if row.get("test_acc") is not None]
    if len(evaluated) < 2:
        return None
    r, acc = np.array([e[0] for e in evaluated], float), np.array([e[1] for e in evaluated], float)
    return float(100 * (acc[-1] - np.interp(0.9 * rounds, r, acc)))


def _arms(cell: str, fields: dict, plan, model: str) -> list[Arm]:
    """One Arm per (method, fraction, rate, seeds) of `plan`, one per seed."""
    out = []
    for method, fraction, lr, seeds in plan:
        warmup = t0(fields["rounds"], 0.25 if fraction is None else fraction)  # (FedAvg's key carries 25%'s)
        for s in seeds:
            cfg = Config(method=method, seed=s, **{**fields, "lr": float(lr), "warmup_rounds": warmup})
            out.append(Arm(cell, arm_label(method, fraction, lr), cfg, model, fraction))
    return out


def build(profile: str, base: dict, rates: dict, seeds_pair=range(15), seeds_rest=range(5), cells=CELLS) -> list[Arm]:
    """Every arm of notebook 13's `cells`, one Arm per seed. `rates`: {cell: {method: rate}} of the rule
    (`rates_by_rule`) for sgd and p4; the adamw and shift cells run at AdamW's base rate (profiles.learning_rates:
    FedAvg's, which FedFrozen selected too). FedAvg and FedFrozen T0 25% on `seeds_pair`, T0 0 and 50% on
    `seeds_rest`; the p4_w48 cell the pair only, at AdamW's base rate, and not where its fields are p4's (the smoke
    and paper profiles, where p4 keeps the base width)."""
    cells = among("cells", cells, CELLS)
    pair, rest = seed_lists(seeds_pair=seeds_pair, seeds_rest=seeds_rest)
    base_lr = learning_rates(["fedavg"], profile=profile, dataset=base["dataset"])["fedavg"]
    out: list[Arm] = []
    for cell in cells:
        fields = cell_fields(profile, base, cell)
        if cell == "p4_w48" and fields == cell_fields(profile, base, "p4"):
            continue
        model = fields.get("model", "")
        if cell in ("sgd", "p4") and cell not in rates:
            raise ValueError(f"rates has no selected rates for cell {cell!r} (rates_by_rule)")
        if cell == "sgd":
            shared, own = rates["sgd"]["fedavg"], rates["sgd"]["fedfrozen"]
            plan = [("fedavg", None, shared, pair), ("fedfrozen", 0.25, shared, pair), ("fedfrozen", 0.5, shared, rest)]
            if own != shared:  # FedFrozen at its own best: the second row (against FedAvg at its own)
                plan.append(("fedfrozen", 0.25, own, pair))
        elif cell in ("adamw", "p4_w48"):
            plan = [("fedavg", None, base_lr, pair), ("fedfrozen", 0.25, base_lr, pair)]
        else:
            chosen = sorted(set(rates[cell].values())) if cell == "p4" else [base_lr]
            plan = [arm for lr in chosen for arm in (("fedavg", None, lr, pair), ("fedfrozen", 0.25, lr, pair),
                                                     ("fedfrozen", 0.0, lr, rest), ("fedfrozen", 0.5, lr, rest))]
        out += _arms(cell, fields, plan, model)
    return out


def comparisons(arms: list[Arm], rates: dict | None = None) -> list[Comparison]:
    """The built cells' comparisons, a minus b paired by seed: each FedFrozen arm against FedAvg of its cell at the
    same rate (C1 for T0 25%, C2 for the others: `study.against_fedavg`), and in the sgd cell, where FedFrozen's own
    best rate differs from FedAvg's (`rates`), each arm at its own best."""
    rows = against_fedavg(arms)
    sgd = (rates or {}).get("sgd")
    if sgd and sgd["fedfrozen"] != sgd["fedavg"] and any(a.cell == "sgd" for a in arms):
        rows.append(Comparison("C1", f"FedFrozen T0 25% at its best {sgd['fedfrozen']:g} − FedAvg at its best "
                                     f"{sgd['fedavg']:g}, sgd", "sgd", arm_label("fedfrozen", 0.25, sgd["fedfrozen"]),
                               arm_label("fedavg", None, sgd["fedavg"])))
    return rows


def study(profile: str, base: dict, rates: dict, seeds_pair=range(15), seeds_rest=range(5), cells=CELLS) -> Study:
    """Notebook 13's study: `build`'s arms and their `comparisons` (with `rates`, the sgd cell's own-best row)."""
    arms = build(profile, base, rates, seeds_pair=seeds_pair, seeds_rest=seeds_rest, cells=cells)
    return Study("13", tuple(arms), tuple(comparisons(arms, rates)))
