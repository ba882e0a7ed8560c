"""Notebook 15's cells (fedfrozen.studies.budgets): a longer budget is the notebooks' own run with more rounds."""

import pytest

import fedfrozen as ff
from fedfrozen.runs.experiments import config_key
from fedfrozen.studies import budgets, recipes, roles

RATES = {"sgd": {"fedavg": 0.3, "fedfrozen": 0.3}, "adamw_5ep": {"fedavg": 3e-3, "fedfrozen": 1e-2},
         "scratch": {"fedavg": 3e-3, "fedfrozen": 3e-3}, "pretrained": {"fedavg": 1e-3, "fedfrozen": 1e-3}}


def _cpu(cells=budgets.CELLS):
    image, text = ff.profiles.federated("cpu"), roles.fields("cpu", "data")
    return image, text, budgets.build("cpu", image, text, RATES, cells=cells)


def test_the_first_budget_is_the_notebooks_own_runs():
    image, text, arms = _cpu()
    own = recipes.build("cpu", image, {"sgd": RATES["sgd"]}, cells=["adamw", "sgd", "p4_w48"])
    own += roles.build("cpu", text, {k: RATES[k] for k in roles.INITS})
    keys = {config_key(a.cfg) for a in own}
    first = [a for a in arms if a.budget == 1 and a.cell != "adamw_5ep"]
    assert first and all(config_key(a.cfg) in keys for a in first)  # they load from notebooks 13's and 14's cache


def test_a_longer_budget_changes_the_rounds_and_t0_only():
    _, _, arms = _cpu()
    first = {(a.cell, a.cfg.method, a.cfg.seed): a.cfg for a in arms if a.budget == 1}
    longer = [a for a in arms if a.budget > 1]
    assert {a.budget for a in longer} == {2, 4}
    for a in longer:
        ref = first[(a.cell, a.cfg.method, a.cfg.seed)]
        da, db = a.cfg.to_dict(), ref.to_dict()
        assert {k for k in da if da[k] != db[k]} == {"rounds", "warmup_rounds"}
        assert a.cfg.rounds == a.budget * ref.rounds and a.cfg.warmup_rounds == round(0.25 * a.cfg.rounds)


def test_each_cell_runs_its_plan():
    _, _, arms = _cpu()
    for cell, (pair_at, fedavg_at, seeds) in budgets.PLAN.items():
        got = {(a.budget, a.cfg.method) for a in arms if a.cell == cell}
        assert got == {(m, "fedavg") for m in (*pair_at, *fedavg_at)} | {(m, "fedfrozen") for m in pair_at}, cell
        assert {a.cfg.seed for a in arms if a.cell == cell} == set(seeds)
    rows = budgets.comparisons(arms)
    assert len(rows) == sum(len(p) for p, _, _ in budgets.PLAN.values())  # a C1 row where the pair ran, no other
    assert ("C1", "FedFrozen T0 25% − FedAvg, both at 0.003, adamw, 480 rounds", "adamw, 480 rounds",
            "fedfrozen T0 25% @ 0.003", "fedavg @ 0.003") in rows
    five = [a.cfg for a in arms if a.cell == "adamw_5ep"]
    assert {(c.local_epochs, c.rounds, c.optimizer, c.lr) for c in five} == {(5, 240, "adamw", 3e-3)}  # FedAvg's rate
    assert {c.pretrain_seed == c.seed for a in arms if a.cell == "text_pretrained" for c in [a.cfg]} == {True}


def test_the_rule_for_adamw_5ep_runs_on_the_selection_seed():
    cfgs = budgets.selection_configs("cpu", ff.profiles.federated("cpu"))
    assert {c.seed for c in cfgs} == {budgets.SELECTION_SEED} and len(cfgs) == 2 * len(ff.profiles.CPU_LR_GRID)
    assert {(c.local_epochs, c.rounds) for c in cfgs} == {(5, 240)}


def test_bad_input_is_refused_before_any_run():
    image, text = ff.profiles.federated("cpu"), roles.fields("cpu", "data")
    with pytest.raises(ValueError, match="cells must be among"):
        budgets.build("cpu", image, text, RATES, cells=["adamw", "lstm"])
    with pytest.raises(ValueError, match="needs text_base"):
        budgets.build("cpu", image, None, RATES, cells=["text_scratch"])
    with pytest.raises(ValueError, match="runs at one rate"):
        budgets.build("cpu", image, text, {**RATES, "scratch": {"fedavg": 3e-3, "fedfrozen": 3e-2}},
                      cells=["text_scratch"])
    with pytest.raises(ValueError, match="no selected rates for cell 'sgd'"):
        budgets.build("cpu", image, text, {}, cells=["sgd"])
    with pytest.raises(ValueError, match="seeds for cell 'adamw' must not be empty"):
        budgets.build("cpu", image, text, RATES, cells=["adamw"], seeds={"adamw": []})
