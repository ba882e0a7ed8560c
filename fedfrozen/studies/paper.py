"""The paper's own tables as studies: the main table (notebook 03 §§ 1-2), the T0 sweep (04), the value penalty (05)
and the frozen components (06), each in the scratch cells of its Dirichlet levels and again in the regimes of its
section 2.

Each is a `study.Study` whose per-seed table groups by the notebook's own columns (`Study.by`), the columns its
committed tables have always had: a cell is the values the arms share, an arm the value the sweep moves.

    s = paper.main_results(profile, base, methods, partitions, baseline_partitions, seeds, lrs, regimes)   # 03
    s = paper.warmup(profile, base, fractions, alphas, seeds, regime_cells, regime_fractions, lrs)  # notebook 04
    s = paper.value_penalty(profile, base, lams, alphas, seeds, regimes, regime_alpha, lrs)           # notebook 05
    s = paper.components(profile, base, methods, alpha, seeds, regime, lrs)                           # notebook 06
    runs = s.runs(ff.run_many(s.configs(), experiment=...))
    verdicts = s.verdicts(ff.tables.mean_std(runs, list(s.by), [...]))

A comparison's label is generated here from its data (the sweep's value, the cell) and never parsed: the documents
quote a comparison by its columns' values (`report.groups`).
"""

from __future__ import annotations

from ..engine.config import Config
from ..inputs.partition import parse_spec
from .controls import Arm
from .profiles import arm as arm_fields
from .profiles import dirichlet_fields, learning_rates, regime_learning_rates, regime_setup
from .study import Comparison, Study, t0

__all__ = ["SCRATCH", "CORE", "BASELINE_NAMES", "SGD_NAMES", "regime_arm", "main_results", "warmup", "value_penalty",
           "PENALTY_PRIMARY", "PENALTY_PARTS", "penalty_parts", "components", "COMPONENT_NAMES", "component_drift"]

SCRATCH = "scratch"  # the regime of section 1's cells (a random start at the profile's rate schedule)


def _tag(regime: str) -> str:
    """A label's regime: nothing for section 1's scratch cells, ", <regime>" for section 2's."""
    return "" if regime == SCRATCH else f", {regime}"


def _seeds(profile: str, seeds, n_seeds: int | None):
    """The seeds of a section 2 cell: `seeds` at the smoke profile (its one seed), else range(n_seeds)."""
    return list(seeds) if profile == "smoke" or n_seeds is None else list(range(n_seeds))


# --- notebook 03 §§ 1-2: FedFrozen against FedAvg at each heterogeneity level, the baselines, the regimes ---------

CORE = ("fedavg", "fedfrozen")  # the arms of every heterogeneity level; the others run at the baseline levels
BASELINE_NAMES = {"fedprox": "FedProx (AdamW)", "scaffold": "SCAFFOLD (AdamW, option I)", "fedadam": "FedAdam"}
SGD_NAMES = {"scaffold": "SCAFFOLD", "fedprox": "FedProx", "feddyn": "FedDyn"}  # "<m>:sgd", plain SGD as published


def regime_arm(method: str, regime: str) -> str:
    """The arm of `method` in section 2's `regime` cell: "fedfrozen [pretrained]"."""
    return f"{method} [{regime}]"


def main_results(profile: str, base: dict, methods, partitions, baseline_partitions, seeds, lrs: dict | None = None,
                 regimes=(), regime_alpha: float = 0.1, regime_seeds=range(15), regime_n_seeds: dict | None = None
                 ) -> Study:
    """Notebook 03 §§ 1-2's study, by ("heterogeneity", "arm"): FedAvg and FedFrozen (CORE) at every level of
    `partitions` ("iid", "dirichlet:0.1", ...), each other arm of `methods` (a method, or "<method>:sgd") at the
    levels of `baseline_partitions`, all on `seeds` at their rates (`lrs` first); then FedAvg and FedFrozen in each
    regime of `regimes` the profile can run at Dirichlet `regime_alpha`, arms `regime_arm(method, regime)`, on the
    first `regime_n_seeds[regime]` of `regime_seeds` (all of them by default; the smoke profile: `seeds`) at the
    regime's rates. C1's comparisons: FedFrozen against FedAvg at every level and regime (late accuracy, then the
    oscillation); at the baseline levels each baseline against FedAvg and FedFrozen against it (AdamW arms), and each
    SGD arm against FedAvg on SGD."""
    if not set(CORE) <= set(methods):
        raise ValueError(f"methods must hold {list(CORE)} (every comparison is against one of them); got "
                         f"{list(methods)}")
    lr_of = learning_rates(methods, lrs, profile=profile, dataset=base["dataset"])
    arms, rows = [], []
    grid = [(spec, m) for spec in partitions for m in methods if m in CORE or spec in baseline_partitions]
    arms += [Arm(spec, m, Config(seed=s, **parse_spec(spec), **{**base, **arm_fields(m), "lr": lr_of[m]}))
             for spec, m in grid for s in seeds]
    for spec in partitions:
        rows += [Comparison("C1", f"FedFrozen − FedAvg, {spec}", spec, "fedfrozen", "fedavg"),
                 Comparison("C1", f"FedFrozen − FedAvg, {spec}: oscillation", spec, "fedfrozen", "fedavg",
                            "oscillation")]
    for spec in baseline_partitions:
        for m in methods:
            if m not in CORE and not m.endswith(":sgd"):  # both AdamW: the pair differs in the method alone
                name = BASELINE_NAMES.get(m, m)
                rows += [Comparison("C1", f"{name} − FedAvg, {spec}", spec, m, "fedavg"),
                         Comparison("C1", f"FedFrozen − {name}, {spec}", spec, "fedfrozen", m)]
    for spec in baseline_partitions:  # each baseline against FedAvg, both with the local optimiser of its paper (SGD)
        for m in methods:
            if m.endswith(":sgd") and m != "fedavg:sgd" and "fedavg:sgd" in methods:
                name = SGD_NAMES.get(m[:-4], m[:-4])
                rows.append(Comparison("C1", f"{name} − FedAvg, both SGD, {spec}", spec, m, "fedavg:sgd"))
    spec_r = f"dirichlet:{regime_alpha:g}"
    for name in regimes:
        fields = regime_setup(profile, base, name)  # the regime over the profile (smoke: a digits subset)
        if fields is None:
            continue
        lr_r = regime_learning_rates(name, list(CORE), profile=profile, dataset=base["dataset"])
        cell_seeds = list(seeds) if profile == "smoke" else \
            list(regime_seeds)[:(regime_n_seeds or {}).get(name, len(list(regime_seeds)))]
        arms += [Arm(spec_r, regime_arm(m, name), Config(method=m, seed=s, partition="dirichlet", alpha=regime_alpha,
                                                         **{**fields, "lr": lr_r[m]}))
                 for m in CORE for s in cell_seeds]
        a, b = regime_arm("fedfrozen", name), regime_arm("fedavg", name)
        rows += [Comparison("C1", f"FedFrozen − FedAvg, {spec_r}, {name}", spec_r, a, b),
                 Comparison("C1", f"FedFrozen − FedAvg, {spec_r}, {name}: oscillation", spec_r, a, b, "oscillation")]
    return Study("03", tuple(arms), tuple(rows), by=("heterogeneity", "arm"))


# --- notebook 04: T0 as a fraction of the rounds, each against FedAvg (T0 = T: FedAvg, run as such) ---------------

def _warmup_cfg(fraction: float, base_t0: int, rounds: int, /, **fields) -> Config:
    """FedAvg where `fraction` is 1.0 (with the profile's T0, which FedAvg ignores: notebook 03's config, so the
    cache is shared), else FedFrozen at T0 = `fraction` of the rounds."""
    if fraction == 1.0:
        return Config(method="fedavg", **{**fields, "warmup_rounds": base_t0})
    return Config(method="fedfrozen", **{**fields, "warmup_rounds": t0(rounds, fraction)})


def warmup(profile: str, base: dict, fractions, alphas, seeds, regime_cells=(), regime_fractions=None,
           lrs: dict | None = None) -> Study:
    """Notebook 04's study, by ("regime", "alpha", "T0_fraction"): each T0 fraction of `fractions` (1.0, FedAvg,
    among them) at each Dirichlet level of `alphas` on `seeds`, both methods at FedFrozen's rate (section 1, regime
    "scratch"); then each regime cell of `regime_cells` ((regime, alpha, n_seeds): the profile's cells only) at its
    `regime_fractions[regime]` and FedAvg, each method at its regime's rate (`lrs` overrides section 1's only, as
    the notebook always had it). C2's comparisons: each T0 against
    FedAvg of its cell; in a constant-rate cell, C1's oscillation beside it."""
    if 1.0 not in fractions:
        raise ValueError(f"fractions must hold 1.0 (FedAvg, the arm every T0 is compared with); got {list(fractions)}")
    regime_fractions = regime_fractions or {}
    missing = [name for name, _, _ in regime_cells if name not in regime_fractions]
    if missing:
        raise ValueError(f"regime_fractions must give the T0 fractions of every regime cell; missing {missing}")
    lr = learning_rates(["fedfrozen"], lrs, profile=profile, dataset=base["dataset"])["fedfrozen"]
    rounds, arms, rows = base["rounds"], [], []
    for a in alphas:
        fields = dict(partition="dirichlet", alpha=a, **{**base, "lr": lr})
        arms += [Arm((SCRATCH, a), f, _warmup_cfg(f, base["warmup_rounds"], rounds, seed=s, **fields), fraction=f)
                 for f in fractions for s in seeds]
        rows += [Comparison("C2", f"T0 = {f:.0%} of T − FedAvg, α={a:g}", (SCRATCH, a), f, 1.0)
                 for f in fractions if f != 1.0]
    for name, a, n_seeds in regime_cells:
        fields = regime_setup(profile, base, name)
        if fields is None:
            continue
        lr_r = regime_learning_rates(name, ["fedavg", "fedfrozen"], profile=profile, dataset=base["dataset"])
        for f in [*regime_fractions[name], 1.0]:
            m = "fedavg" if f == 1.0 else "fedfrozen"
            arms += [Arm((name, a), f, _warmup_cfg(f, base["warmup_rounds"], rounds, seed=s, **dirichlet_fields(a),
                                                   **{**fields, "lr": lr_r[m]}), fraction=f)
                     for s in _seeds(profile, seeds, n_seeds)]
        for f in regime_fractions[name]:
            label = f"T0 = {f:.0%} of T − FedAvg, α={a:g}, {name}"
            rows.append(Comparison("C2", label, (name, a), f, 1.0))
            if name.startswith("constant"):  # C1's stability where the rate stays up
                rows.append(Comparison("C1", f"{label}: oscillation", (name, a), f, 1.0, "oscillation"))
    return Study("04", tuple(arms), tuple(rows), by=("regime", "alpha", "T0_fraction"))


# --- notebook 05: the value penalty λ, each against λ = 0 ---------------------------------------------------------

# C3's measures beside accuracy (fedfrozen.studies.measures.parts): V's dispersion decides (the claim's "drift");
# the relative drift and the step it divides by are its parts, a family of their own that never turns a verdict
PENALTY_PRIMARY = {"disp_v": "value dispersion"}
PENALTY_PARTS = {"drift_v": "value drift", "step_v": "mean V step"}


def value_penalty(profile: str, base: dict, lams, alphas, seeds, regimes: dict | None = None,
                  regime_alpha: float = 0.1, lrs: dict | None = None) -> Study:
    """Notebook 05's study, by ("regime", "alpha", "value_l2"): FedFrozen at each penalty weight of `lams` (0.0
    among them) at each Dirichlet level of `alphas` on `seeds`, at FedFrozen's rate (section 1, regime "scratch");
    then at `regime_alpha` in each regime of `regimes` ({regime: n_seeds}; the profile's only) at its regime's rate.
    C3's comparisons: each λ > 0 against λ = 0 of its cell, in late accuracy and in V's dispersion."""
    if 0.0 not in lams:
        raise ValueError(f"lams must hold 0.0 (no penalty, the arm every λ is compared with); got {list(lams)}")
    lr = learning_rates(["fedfrozen"], lrs, profile=profile, dataset=base["dataset"])["fedfrozen"]
    cells = [(SCRATCH, a, base, lr, list(seeds)) for a in alphas]
    for name, n_seeds in (regimes or {}).items():
        fields = regime_setup(profile, base, name)
        if fields is not None:
            lr_r = regime_learning_rates(name, ["fedfrozen"], lrs, profile=profile, dataset=base["dataset"])
            cells.append((name, regime_alpha, fields, lr_r["fedfrozen"], _seeds(profile, seeds, n_seeds)))
    arms, rows = [], []
    for name, a, fields, rate, cell_seeds in cells:
        arms += [Arm((name, a), lam, Config(method="fedfrozen", partition="dirichlet", alpha=a, value_l2=lam, seed=s,
                                            **{**fields, "lr": rate}))
                 for lam in lams for s in cell_seeds]
        for lam in (x for x in lams if x != 0.0):
            label = f"value L2 λ={lam:g} − λ=0, α={a:g}{_tag(name)}"
            rows.append(Comparison("C3", label, (name, a), lam, 0.0))
            rows += [Comparison("C3", f"{label}: {words}", (name, a), lam, 0.0, m)
                     for m, words in PENALTY_PRIMARY.items()]
    return Study("05", tuple(arms), tuple(rows), by=("regime", "alpha", "value_l2"))


def penalty_parts(study: Study) -> list[Comparison]:
    """The parts of C3's ratio for each accuracy comparison of notebook 05's `study`: the relative drift and the
    mean V step (PENALTY_PARTS), reported beside the verdicts as a family of their own."""
    return [c._replace(label=f"{c.label}: {words}", measure=m)
            for c in study.comparisons if c.measure == "late_acc" for m, words in PENALTY_PARTS.items()]


# --- notebook 06: freezing one component at a time, each against FedAvg -------------------------------------------

COMPONENT_NAMES = {"fedfrozen": "freeze Q/K (FedFrozen)", "freeze_v": "freeze V", "freeze_attn": "freeze all attention",
                   "freeze_body": "freeze the whole body"}


def components(profile: str, base: dict, methods, alpha: float, seeds, regime: str | None = None,
               lrs: dict | None = None) -> Study:
    """Notebook 06's study, by ("regime", "method"): each method of `methods` (FedAvg among them) at Dirichlet
    `alpha` on `seeds` at its rate (section 1, regime "scratch"), then in `regime` where the profile can run it,
    at that regime's rates. C4's comparisons: each method against FedAvg of its regime."""
    if "fedavg" not in methods:
        raise ValueError(f"methods must hold 'fedavg' (the arm every method is compared with); got {list(methods)}")
    lr_of = learning_rates(methods, lrs, profile=profile, dataset=base["dataset"])
    cells = [(SCRATCH, base, lr_of)]
    fields = None if regime is None else regime_setup(profile, base, regime)
    if fields is not None:
        cells.append((regime, fields, regime_learning_rates(regime, methods, lrs, profile=profile,
                                                            dataset=base["dataset"])))
    arms, rows = [], []
    for name, cell_fields, rates in cells:
        arms += [Arm(name, m, Config(method=m, partition="dirichlet", alpha=alpha, seed=s,
                                     **{**cell_fields, "lr": rates[m]}))
                 for m in methods for s in seeds]
        rows += [Comparison("C4", f"{COMPONENT_NAMES.get(m, m)} − FedAvg{_tag(name)}", name, m, "fedavg")
                 for m in methods if m != "fedavg"]
    return Study("06", tuple(arms), tuple(rows), by=("regime", "method"))


def component_drift(regimes, groups) -> list[Comparison]:
    """C4's drift comparisons of notebook 06: each parameter group's drift against Q/K's in the same FedAvg runs,
    paired by seed, in each of `regimes` (a per-seed table grouped by "regime" and "group", measure "drift")."""
    return [Comparison("C4", f"{g} drift − Q/K drift, FedAvg{_tag(r)}", r, g, "qk", "drift")
            for r in regimes for g in groups if g != "qk"]
