"""FedFrozen on text with natural clients (notebook 14): Shakespeare's speaking roles, next-character prediction.

Every other notebook trains on images. Here each speaking role of each play is a client (LEAF's Shakespeare,
`fedfrozen.inputs.shakespeare`, `data.shakespeare_splits`): roles differ in length by orders of magnitude, in
vocabulary and
in style, a heterogeneity no Dirichlet draw made. A causal character Transformer (`char_transformer`: width 64,
2 layers, 4 heads) reads 80 characters and predicts the next (accuracy as LEAF reports it, and the test loss).

The federation (`fields`): the `N_CLIENTS` largest roles of the 31 plays that are not the server's, `PER_ROUND` of
them a round, every client `BUDGET["local_steps"]` steps of 16 windows a round (roles are very unequal: an epoch would
be 80 steps for one and 3,000 for another), AdamW and the cosine schedule of the image notebooks. Two starts
(`INITS`), each a cell of its own:

- `scratch`: a random initialisation;
- `pretrained`: a body trained centrally on the server's six plays (data.SHAKESPEARE_PRETRAIN_PLAYS, whose roles are
  never clients; `pretrain_task="plays"`, PRETRAIN_EPOCHS over their windows), one body per seed (pretrain_seed =
  seed), the head the run's own.

In each cell FedAvg against FedFrozen at T0 = 25% of the rounds (C1, on `seeds_pair`) and at T0 = 0 and 50% (C2's
neighbours, on `seeds_rest`), and C3: FedFrozen T0 25% with the value penalty λ = VALUE_L2 against the same arm
without it (on `seeds_rest`). C4 reads the FedAvg runs' drift: each attention group's (V, the output projection)
against Q/K's, paired by seed (`drift_table`). Each cell's local rate by the one rule
(fedfrozen.studies.selection.RULE) on
LR_GRID for FedAvg and for FedFrozen (T0 25%), read on the mean of the held-out SELECTION_SEEDS (no comparison
evaluates them; one seed chose rates 2.4-2.6 sd away from the evaluated seeds' mean: docs/cpu_profile.md); where the
two choose differently every arm runs at both rates, each comparison at a shared one.

    base = roles.fields(profile, data_root)                          # the federation of the profile
    rates, table = roles.rates_by_rule(profile, base, roles.INITS)   # the rule, seeds 100-102
    arms = roles.build(profile, base, rates, seeds_pair=range(15), seeds_rest=range(5))
    rows = roles.comparisons(arms)                                   # [Comparison(claim, label, cell, a, b, measure)]
"""

from __future__ import annotations

from ..engine.config import Config
from .controls import Arm
from .profiles import CPU_LR_GRID, among, seed_lists, select
from .profiles import data_root as default_data_root
from .study import SELECTION_SEED, Comparison, Study, against_fedavg, arm_label, cells_by_rule, t0

__all__ = ["study", "INITS", "SELECTION_SEED", "SELECTION_SEEDS", "N_CLIENTS", "PER_ROUND", "BUDGET", "SMOKE_BUDGET",
           "PRETRAIN_EPOCHS", "VALUE_L2", "LR_GRID", "DRIFT_GROUPS", "fields", "cell_fields", "selection_seeds",
           "selection_configs", "rates_by_rule", "penalty_arm", "build", "is_sensitivity", "comparisons", "drift_table"]

INITS = ("scratch", "pretrained")
N_CLIENTS = 100          # the 100 largest roles (of the 349 with 2,000 characters or more outside the server's plays)
PER_ROUND = 10           # clients a round
BUDGET = dict(rounds=100, local_steps=10)  # docs/cpu_profile.md, "Shakespeare's budget"
SMOKE_BUDGET = dict(rounds=3, local_steps=2)
PRETRAIN_EPOCHS = 1      # over the server's plays' windows (383k: one epoch is ~6,000 steps of 64)
VALUE_L2 = 0.01          # C3's λ on V (notebook 05's smaller one)
LR_GRID = CPU_LR_GRID    # AdamW's grid of the image notebooks
DRIFT_GROUPS = ("v", "attn_out", "mlp", "norm", "embed", "head")  # C4: each against Q/K's drift in the same runs
SELECTION_SEEDS = (SELECTION_SEED, 101, 102)  # the rule reads the mean of these held-out seeds (cpu, paper)


def fields(profile: str, data_root: str | None = None) -> dict:
    """The Config fields every run of notebook 14 shares at `profile` (its arms add method, rate, T0, seed and the
    start): the smoke profile's federation is six roles of the small text the tests write (`data_root` names its
    folder), the cpu profile's the N_CLIENTS largest roles of the release in `data_root` (default: the project's
    data/ folder, profiles.data_root), the paper profile's every role of the release at width 128, depth 4."""
    profile_fields = select(
        profile,
        smoke=dict(model="char_transformer_tiny", n_clients=6, clients_per_round=3, eval_every=1, **SMOKE_BUDGET),
        cpu=dict(model="char_transformer", n_clients=N_CLIENTS, clients_per_round=PER_ROUND, eval_every=10,
                 eval_window=10, lr_schedule="cosine", download=True, **BUDGET),
        paper=dict(model="char_transformer", model_kwargs=dict(embed_dim=128, depth=4), n_clients=349,
                   clients_per_round=PER_ROUND, eval_every=10, eval_window=10, lr_schedule="cosine", download=True,
                   rounds=400, local_steps=20))
    root = data_root if data_root is not None else default_data_root()
    return dict(dataset="shakespeare", data_root=root, partition="natural", batch_size=16, **profile_fields)


def cell_fields(base: dict, init: str) -> dict:
    """`base` (fields) with the start of cell `init` ("scratch" or "pretrained": the server's plays, PRETRAIN_EPOCHS;
    each run's body is pre-trained with its own seed, set by the arms)."""
    if init not in INITS:
        raise ValueError(f"init must be one of {', '.join(INITS)}; got {init!r}")
    if init == "scratch":
        return dict(base)
    return {**base, "init": "pretrained", "pretrain_task": "plays", "pretrain_epochs": PRETRAIN_EPOCHS}


def _grid(profile: str) -> tuple:
    return select(profile, smoke=LR_GRID[1:3], cpu=LR_GRID, paper=LR_GRID)


def selection_seeds(profile: str) -> tuple:
    """The held-out seeds the rule reads at `profile`: SELECTION_SEEDS (the smoke profile: SELECTION_SEED alone)."""
    return select(profile, smoke=(SELECTION_SEED,), cpu=SELECTION_SEEDS, paper=SELECTION_SEEDS)


def selection_configs(profile: str, base: dict, init: str, grid=None, seeds=None) -> list[Config]:
    """The configs the one rule compares for cell `init`: FedAvg and FedFrozen (T0 25%) at each rate of LR_GRID (the
    smoke profile two of them), on each of `seeds` (default `selection_seeds(profile)`; a pretrained run's body
    pre-trained with its own seed). The rule reads the mean over the seeds (`study.selected_rates`)."""
    f = cell_fields(base, init)
    f.update(warmup_rounds=t0(f["rounds"], 0.25))
    seeds = selection_seeds(profile) if seeds is None else tuple(seeds)
    return [Config(method=m, lr=float(lr), seed=s, **f, **({"pretrain_seed": s} if init == "pretrained" else {}))
            for s in seeds for m in ("fedavg", "fedfrozen") for lr in (_grid(profile) if grid is None else grid)]


def rates_by_rule(profile: str, base: dict, inits=INITS, experiment: str = "shakespeare", seeds=None):
    """Each cell's rates by the one rule (`selected_rates` on its selection_configs on `seeds`, default
    `selection_seeds(profile)`, trained or loaded). Returns
    (rates {init: {method: rate}}, a table of every selection run: cell (the start), method, lr, seed, late validation
    and test accuracy)."""
    inits = among("inits", inits, INITS)
    return cells_by_rule({i: selection_configs(profile, base, i, seeds=seeds) for i in inits}, experiment,
                         extra=lambda cfg, hist: {"seed": cfg.seed})


def penalty_arm(lr: float) -> str:
    """The arm label of C3's FedFrozen T0 25% at `lr` with the value penalty VALUE_L2."""
    return f"{arm_label('fedfrozen', 0.25, lr)} + V L2 {VALUE_L2:g}"


def build(profile: str, base: dict, rates: dict, seeds_pair=range(15), seeds_rest=range(5), inits=INITS,
          sensitivity: dict | None = None) -> list[Arm]:
    """Every arm of notebook 14's cells `inits`, one Arm per seed (cell = the start). `rates`: {init: {method: rate}}
    of the rule (`rates_by_rule`); every arm at each rate the cell's two methods chose, and at each rate `sensitivity`
    ({init: [rate, ...]}) adds (a rate-sensitivity cell: its comparisons are judged apart from the rule's,
    `is_sensitivity`). FedAvg and FedFrozen T0 25% on `seeds_pair`; FedFrozen T0 0 and 50%, and T0 25% with the value
    penalty (C3), on `seeds_rest`. A pretrained run's body is pre-trained with its own seed."""
    inits = among("inits", inits, INITS)
    pair, rest = seed_lists(seeds_pair=seeds_pair, seeds_rest=seeds_rest)
    missing = [i for i in inits if i not in rates]
    if missing:
        raise ValueError(f"rates has no selected rates for {missing} (rates_by_rule)")
    sensitivity = dict(sensitivity or {})
    unknown = sorted(set(sensitivity) - set(INITS))
    if unknown or any(not isinstance(lr, float | int) or lr <= 0 for v in sensitivity.values() for lr in v):
        raise ValueError(f"sensitivity must map starts among {', '.join(INITS)} to positive rates; got {sensitivity!r}")
    out: list[Arm] = []
    for init in inits:
        f = cell_fields(base, init)
        for lr in sorted(set(rates[init].values()) | {float(x) for x in sensitivity.get(init, ())}):
            plan = [("fedavg", None, pair), ("fedfrozen", 0.25, pair), ("fedfrozen", 0.0, rest),
                    ("fedfrozen", 0.5, rest), ("fedfrozen", 0.25, rest)]
            for i, (method, fraction, seeds) in enumerate(plan):
                c3 = i == len(plan) - 1
                warmup = t0(f["rounds"], 0.25 if fraction is None else fraction)  # (FedAvg's key carries 25%'s)
                for s in seeds:
                    extra = {"pretrain_seed": s} if init == "pretrained" else {}
                    if c3:
                        extra["value_l2"] = VALUE_L2
                    cfg = Config(method=method, seed=s, **{**f, "lr": float(lr), "warmup_rounds": warmup, **extra})
                    out.append(Arm(init, penalty_arm(lr) if c3 else arm_label(method, fraction, lr), cfg,
                                   f["model"], fraction))
    return out


def is_sensitivity(rates: dict, cell: str, lr: float) -> bool:
    """Whether `lr` in cell `cell` is a rate-sensitivity rate (built at `build(..., sensitivity=...)`): one the rule
    chose for neither method."""
    return float(lr) not in {float(x) for x in rates[cell].values()}


def comparisons(arms: list[Arm]) -> list[Comparison]:
    """The built cells' comparisons, a minus b paired by seed: each FedFrozen arm against FedAvg of its cell at the
    same rate (C1 for T0 25%, C2 for T0 0 and 50%: `study.against_fedavg`), and the value penalty against the same
    FedFrozen arm without it (C3)."""
    have = {(a.cell, a.arm) for a in arms}
    c3 = [Comparison("C3", f"FedFrozen T0 25% with V L2 {VALUE_L2:g} − without, at {lr:g}, {cell}", cell,
                     penalty_arm(lr), arm_label("fedfrozen", 0.25, lr))
          for cell, lr in dict.fromkeys((a.cell, a.cfg.lr) for a in arms) if (cell, penalty_arm(lr)) in have]
    return against_fedavg(arms) + c3


def drift_table(arms: list[Arm], hists, sizes: dict | None = None) -> "pd.DataFrame":  # noqa: F821 - pandas
    """C4's per-seed rows: for every FedAvg run, Q/K and each of DRIFT_GROUPS, the group's parts over all its rounds
    (`ff.measures.parts`, last=None): `drift` the mean relative client drift (the measure C4 is judged on), `step`
    the mean update's norm, `disp` the clients' dispersion and, with `sizes` ({group: parameter count},
    `ff.measures.group_sizes`), `disp_per_param` = disp / sqrt(numel). One row per run and group: key, cell, lr, seed,
    group, drift, step, disp, disp_per_param."""
    import pandas as pd

    from ..runs.experiments import config_key
    from .measures import parts

    rows = []
    for a, h in zip(arms, hists):
        if a.cfg.method != "fedavg" or h.diverged:
            continue
        frame = h.to_frame()
        for g in ("qk", *DRIFT_GROUPS):
            if f"drift_{g}" not in frame:
                continue
            numel = (sizes or {}).get(g)
            got = parts(h, g, last=None, numel=numel, frame=frame)
            rows.append(dict(key=config_key(a.cfg), cell=a.cell, lr=a.cfg.lr, seed=a.cfg.seed, group=g,
                             drift=got[f"drift_{g}"], step=got[f"step_{g}"], disp=got[f"disp_{g}"],
                             disp_per_param=got.get(f"disp_{g}_per_param", float("nan"))))
    return pd.DataFrame(rows, columns=["key", "cell", "lr", "seed", "group", "drift", "step", "disp",
                                       "disp_per_param"])


def study(profile: str, base: dict, rates: dict, seeds_pair=range(15), seeds_rest=range(5), inits=INITS,
          sensitivity: dict | None = None) -> Study:
    """Notebook 14's study: `build`'s arms and their `comparisons` (the rate-sensitivity cell's among them:
    `is_sensitivity` tells them apart)."""
    arms = build(profile, base, rates, seeds_pair=seeds_pair, seeds_rest=seeds_rest, inits=inits,
                 sensitivity=sensitivity)
    return Study("14", tuple(arms), tuple(comparisons(arms)))
