"""ff.paper: notebooks 03 (§§ 1-2) and 04-06 declared as studies. At the cpu profile each declares exactly the
committed runs, in their order, and its comparisons give the committed verdict tables again from the committed
per-seed tables; the declarations follow their rules (FedAvg at T0 = T, each λ against 0, each method against
FedAvg) and refuse a sweep without its reference arm."""

from __future__ import annotations

import ast
import pathlib

import nbformat
import pandas as pd
import pytest

import fedfrozen as ff
from fedfrozen.runs.experiments import config_key
from fedfrozen.studies import paper, study

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIGURES = ROOT / "figures"
NOTEBOOKS = {"03": "03_main_results.ipynb", "04": "04_warmup_sweep.ipynb",
             "05": "05_value_l2.ipynb", "06": "06_component_drift.ipynb"}


def defaults(nb: str) -> dict:
    """The literal defaults of a notebook's parameters cell (what papermill would override)."""
    cell = next(c for c in nbformat.read(ROOT / "notebooks" / NOTEBOOKS[nb], 4).cells
                if "parameters" in c.metadata.get("tags", []))
    out = {}
    for node in ast.parse(cell.source).body:
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            try:  # literals, and list(range(n))
                out[node.target.id] = eval(compile(ast.Expression(node.value), "<parameters>", "eval"),
                                           {"__builtins__": {}, "list": list, "range": range})
            except NameError:  # profile: read from the environment
                pass
    return out


def cpu_study(nb: str, profile: str = "cpu") -> study.Study:
    p = defaults(nb)
    base = ff.profiles.federated(profile, rounds=p["rounds"], warmup_rounds=p["warmup_rounds"])
    if nb == "03":
        regimes = ff.profiles.select(profile, smoke=p["regimes"], cpu=p["regimes"],
                                     paper=[r for r in p["regimes"] if "pretrained" not in r] or ["constant"])
        return paper.main_results(profile, base, p["methods"], p["partitions"], p["baseline_partitions"], p["seeds"],
                                  p["lrs"], regimes, p["regime_alpha"], p["regime_seeds"], p["regime_n_seeds"])
    if nb == "04":
        return paper.warmup(profile, base, p["fractions"], p["alphas"], p["seeds"], p["regime_cells"],
                            p["regime_fractions"], p["lrs"])
    if nb == "05":
        return paper.value_penalty(profile, base, p["lams"], p["alphas"], p["seeds"], p["regimes"],
                                   p["regime_alpha"], p["lrs"])
    return paper.components(profile, base, p["methods"], p["alpha"], p["seeds"], p["regime"], p["lrs"])


@pytest.mark.parametrize("nb", sorted(NOTEBOOKS))
def test_each_study_declares_the_committed_runs_and_gives_the_committed_verdicts(nb):
    s = cpu_study(nb)
    runs = pd.read_csv(FIGURES / f"{nb}_per_seed.csv", index_col=0)
    assert [config_key(c) for c in s.configs()] == list(runs["key"])  # every run, in the committed order
    for j, column in enumerate(s.by):  # each arm's cell and arm are the committed grouping columns
        assert [str(study.key(a.cell, a.arm)[j]) for a in s.arms] == [str(v) for v in runs[column]]
    committed = pd.read_csv(FIGURES / f"{nb}_verdicts.csv", index_col=0)
    stats = ff.tables.mean_std(runs, list(s.by), sorted({c.measure for c in s.comparisons}))
    declared = s.verdicts(stats, rows=[c for c in s.comparisons if runs[c.measure].notna().all()])
    pd.testing.assert_frame_equal(declared, ff.tables.recompute(committed, runs))
    assert list(declared["comparison"]) == list(committed["comparison"])  # labels generated as the tables have them


def test_the_penalty_parts_and_the_component_drift_are_the_committed_families():
    s = cpu_study("05")
    runs = pd.read_csv(FIGURES / "05_per_seed.csv", index_col=0)
    stats = ff.tables.mean_std(runs, list(s.by), ["drift_v", "step_v"])
    committed = pd.read_csv(FIGURES / "05_secondary_verdicts.csv", index_col=0)
    pd.testing.assert_frame_equal(study.judge(stats, paper.penalty_parts(s)), ff.tables.recompute(committed, runs))
    drift = pd.read_csv(FIGURES / "06_drift_per_seed.csv", index_col=0)
    groups = list(dict.fromkeys(drift["group"]))
    rows = paper.component_drift(dict.fromkeys(drift["regime"]), groups)
    committed = pd.read_csv(FIGURES / "06_drift_verdicts.csv", index_col=0)
    declared = study.judge(ff.tables.mean_std(drift, ["regime", "group"], ["drift"]), rows)
    pd.testing.assert_frame_equal(declared, ff.tables.recompute(committed, drift))
    assert all(c.b == "qk" and c.measure == "drift" for c in rows) and len(rows) == 2 * (len(groups) - 1)


def test_the_warmup_sweep_runs_fedavg_at_t0_equal_t_and_each_t0_against_it():
    base = ff.profiles.federated("smoke")
    s = paper.warmup("smoke", base, [0.25, 0.5, 1.0], [0.1], [0, 1], [["constant", 0.1, 15]],
                     {"constant": [0.5]})
    for a in s.arms:
        assert (a.cfg.method == "fedavg") == (a.arm == 1.0)
        assert a.cfg.warmup_rounds == (base["warmup_rounds"] if a.arm == 1.0 else study.t0(base["rounds"], a.arm))
    assert {a.cfg.seed for a in s.arms if a.cell[0] == "constant"} == {0, 1}  # the smoke profile: its own seeds
    assert all(c.b == 1.0 and c.a != 1.0 for c in s.comparisons)
    swings = [c for c in s.comparisons if c.measure == "oscillation"]
    assert [(c.claim, c.cell) for c in swings] == [("C1", ("constant", 0.1))]  # a constant rate's stability only
    with pytest.raises(ValueError, match="fractions"):
        paper.warmup("smoke", base, [0.25], [0.1], [0])
    with pytest.raises(ValueError, match="regime_fractions"):
        paper.warmup("smoke", base, [0.25, 1.0], [0.1], [0], [["constant", 0.1, 5]], {})


def test_the_penalty_compares_each_lambda_with_none_and_the_components_each_method_with_fedavg():
    base = ff.profiles.federated("smoke")
    s = paper.value_penalty("smoke", base, [0.0, 0.01, 0.1], [0.1, 0.5], [0])
    assert {a.cfg.value_l2 for a in s.arms} == {0.0, 0.01, 0.1} and all(a.cfg.method == "fedfrozen" for a in s.arms)
    assert [(c.cell, c.a, c.measure) for c in s.comparisons][:2] == [(("scratch", 0.1), 0.01, "late_acc"),
                                                                      (("scratch", 0.1), 0.01, "disp_v")]
    assert len(s.comparisons) == 2 * 2 * 2 and all(c.b == 0.0 for c in s.comparisons)
    assert {c.measure for c in paper.penalty_parts(s)} == set(paper.PENALTY_PARTS)
    with pytest.raises(ValueError, match="lams"):
        paper.value_penalty("smoke", base, [0.01], [0.1], [0])
    c = paper.components("smoke", base, ["fedavg", "fedfrozen", "freeze_v"], 0.1, [0, 1])
    assert [(x.cell, x.a, x.b) for x in c.comparisons] == [("scratch", "fedfrozen", "fedavg"),
                                                          ("scratch", "freeze_v", "fedavg")]
    assert [a.cfg.method for a in c.arms] == ["fedavg"] * 2 + ["fedfrozen"] * 2 + ["freeze_v"] * 2
    with pytest.raises(ValueError, match="methods"):
        paper.components("smoke", base, ["fedfrozen"], 0.1, [0])


def test_a_study_by_its_own_columns_writes_them_and_judges_each_comparison_on_its_measure():
    """Study.by: an arm's cell and arm values go to the named columns; judge reads each comparison's measure."""
    tiny = dict(dataset="digits", model="vit_digits", model_kwargs=dict(embed_dim=16, depth=1, num_heads=2),
                n_clients=4, clients_per_round=2, rounds=3, local_steps=1, local_epochs=None, batch_size=16,
                eval_every=1, warmup_rounds=1, lr=1e-3)
    cfgs = [ff.Config(method="fedfrozen", value_l2=lam, seed=s, **tiny) for lam in (0.0, 0.1) for s in range(3)]
    arms = tuple(ff.controls.Arm(("scratch", 0.5), c.value_l2, c) for c in cfgs)
    rows = (study.Comparison("C3", "l2", ("scratch", 0.5), 0.1, 0.0),
            study.Comparison("C3", "l2: final", ("scratch", 0.5), 0.1, 0.0, "final_acc"))
    s = study.Study("99", arms, rows, by=("regime", "alpha", "value_l2"))
    runs = s.runs([ff.run(c, progress=False) for c in cfgs])
    assert list(runs["regime"]) == ["scratch"] * 6 and list(runs["alpha"]) == [0.5] * 6
    stats = ff.tables.mean_std(runs, list(s.by), ["late_acc", "final_acc"])
    table = s.verdicts(stats)
    assert list(table["measure"]) == ["late_acc", "final_acc"]
    by_hand = ff.tables.compare(stats, ("scratch", 0.5, 0.1), ("scratch", 0.5, 0.0), "final_acc")
    assert table["d"].iloc[1] == pytest.approx(by_hand.diff, abs=1e-9)
    with pytest.raises(ValueError, match="by"):
        study.Study("99", arms, rows, by=("regime", "value_l2")).runs([None] * 6)


def test_the_main_table_runs_the_baselines_at_their_levels_and_compares_each_with_its_own_fedavg():
    base = ff.profiles.federated("smoke")
    s = paper.main_results("smoke", base, ["fedavg", "fedfrozen", "fedprox", "fedavg:sgd", "scaffold:sgd"],
                           ["iid", "dirichlet:0.1"], ["dirichlet:0.1"], [0], regimes=["constant"])
    assert {a.arm for a in s.arms if a.cell == "iid"} == set(paper.CORE)  # the baselines at their levels only
    sgd = [a.cfg for a in s.arms if a.arm == "scaffold:sgd"]
    assert sgd and all(c.method == "scaffold" and c.optimizer == "sgd" for c in sgd)
    pairs = {(c.cell, c.a, c.b) for c in s.comparisons if c.measure == "late_acc"}
    assert ("dirichlet:0.1", "fedprox", "fedavg") in pairs and ("dirichlet:0.1", "fedfrozen", "fedprox") in pairs
    assert ("dirichlet:0.1", "scaffold:sgd", "fedavg:sgd") in pairs  # an SGD arm against FedAvg on SGD, never AdamW's
    assert not any(c.a == "scaffold:sgd" and c.b == "fedavg" for c in s.comparisons)
    regime = [a for a in s.arms if a.arm == paper.regime_arm("fedfrozen", "constant")]
    assert regime and all(a.cell == "dirichlet:0.1" and a.cfg.lr_schedule == "constant" for a in regime)
    with pytest.raises(ValueError, match="methods"):
        paper.main_results("smoke", base, ["fedavg"], ["iid"], [], [0])
