"""Notebook 13's cells (fedfrozen.studies.recipes): what each arm runs, what it is paired with, and the plateau test."""

import json
from pathlib import Path

import pytest

import fedfrozen as ff
from fedfrozen import recipes
from fedfrozen.runs.experiments import config_key

ROOT = Path(__file__).resolve().parents[1]
RATES = {"sgd": {"fedavg": 0.3, "fedfrozen": 0.1}, "p4": {"fedavg": 3e-3, "fedfrozen": 3e-3}}


def _cpu():
    base = ff.profiles.federated("cpu")
    return base, recipes.build("cpu", base, RATES, seeds_pair=range(15), seeds_rest=range(5))


def _differ(a, b) -> set:
    da, db = a.to_dict(), b.to_dict()
    return {k for k in da if da[k] != db[k]}


def test_the_adamw_cell_is_notebook_03s_c1_pair_brought_to_15_seeds():
    _, arms = _cpu()
    committed = {json.loads(line)["key"] for line in (ROOT / "figures" / "03_configs.jsonl").read_text().splitlines()}
    adamw = [a for a in arms if a.cell == "adamw"]
    assert sorted({a.arm for a in adamw}) == ["fedavg @ 0.003", "fedfrozen T0 25% @ 0.003"]
    assert sorted(a.cfg.seed for a in adamw if a.fraction is None) == list(range(15))
    assert all(config_key(a.cfg) in committed for a in adamw if a.cfg.seed < 5)  # its five seeds load from 03's runs


def test_every_pair_differs_in_one_thing_and_each_cell_in_what_it_says():
    _, arms = _cpu()
    by = {(a.cell, a.arm, a.cfg.seed): a.cfg for a in arms}
    for (cell, arm, seed), cfg in by.items():
        if cfg.method != "fedfrozen":
            continue
        shared = by.get((cell, ff.controls.arm_label("fedavg", None, cfg.lr), seed))
        if shared is not None:
            assert _differ(cfg, shared) <= {"method", "warmup_rounds"}, (cell, arm)
        else:  # sgd's second row: each arm at its own best rate
            own = by[(cell, ff.controls.arm_label("fedavg", None, RATES[cell]["fedavg"]), seed)]
            assert cell == "sgd" and _differ(cfg, own) <= {"method", "warmup_rounds", "lr"}, (cell, arm)
    sgd = [cfg for (cell, _, _), cfg in by.items() if cell == "sgd"]
    assert all(c.optimizer == "sgd" and c.momentum == 0 and c.weight_decay == 0 and c.alpha == 0.1 for c in sgd)
    assert all(c.local_epochs == recipes.SGD_BUDGET["local_epochs"] and c.rounds == recipes.SGD_BUDGET["rounds"]
               for c in sgd)
    for kind in ("rotation", "patch_permutation"):
        cs = [cfg for (cell, _, _), cfg in by.items() if cell == kind]
        assert all(c.shift == kind and c.shift_groups == recipes.SHIFT_GROUPS and c.partition == "iid" for c in cs)
    assert {cfg.model for (cell, _, _), cfg in by.items() if cell == "p4"} == {"vit_fmnist_p4"}
    assert all(cfg.init == "random" for cfg in by.values())  # from scratch everywhere
    counts = {}
    for a in arms:
        counts[(a.cell, a.arm)] = counts.get((a.cell, a.arm), 0) + 1
    assert counts[("sgd", "fedavg @ 0.3")] == counts[("sgd", "fedfrozen T0 25% @ 0.3")] == 15
    assert counts[("sgd", "fedfrozen T0 50% @ 0.3")] == 5 and counts[("sgd", "fedfrozen T0 25% @ 0.1")] == 15
    assert counts[("rotation", "fedfrozen T0 0% @ 0.003")] == 5 and counts[("p4", "fedavg @ 0.003")] == 15


def test_the_sgd_cell_compares_at_the_shared_rate_and_each_at_its_own_best():
    _, arms = _cpu()
    rows = recipes.comparisons(arms, RATES)
    sgd = [r for r in rows if r[2] == "sgd"]
    assert [(r[0], r[3], r[4]) for r in sgd] == [
        ("C1", "fedfrozen T0 25% @ 0.3", "fedavg @ 0.3"), ("C2", "fedfrozen T0 50% @ 0.3", "fedavg @ 0.3"),
        ("C1", "fedfrozen T0 25% @ 0.1", "fedavg @ 0.3")]
    same = {**RATES, "sgd": {"fedavg": 0.3, "fedfrozen": 0.3}}
    arms_same = recipes.build("cpu", ff.profiles.federated("cpu"), same, cells=["sgd"])
    assert len(recipes.comparisons(arms_same, same)) == 2  # one rate: no second row
    assert sum(r[0] == "C1" for r in rows) == 7  # one C1 pair a cell, and sgd's own-best row


def test_the_p4_w48_cell_is_the_adamw_cell_at_49_tokens_and_nothing_else():
    base, arms = _cpu()
    by = {(a.cell, a.fraction, a.cfg.seed): a.cfg for a in arms if a.cell in ("adamw", "p4_w48")}
    assert {(c, f) for c, f, _ in by} == {(c, f) for c in ("adamw", "p4_w48") for f in (None, 0.25)}
    for (cell, fraction, seed), cfg in by.items():
        if cell == "p4_w48":
            assert _differ(cfg, by[("adamw", fraction, seed)]) == {"model_kwargs"}
            assert cfg.model_kwargs == {"patch_size": 4}
    model = ff.nets.models.create("vit_fmnist_w48", 10, patch_size=4)
    assert model.patch_embed.num_patches == 49 and model.embed_dim == 48  # the adamw cell's model sees 16 tokens
    assert ff.nets.models.create("vit_fmnist_w48", 10).patch_embed.num_patches == 16
    for profile in ("smoke", "paper"):  # there p4 keeps the base width: p4_w48 would repeat its runs
        b = ff.profiles.federated(profile)
        assert recipes.cell_fields(profile, b, "p4_w48") == recipes.cell_fields(profile, b, "p4")
        assert not [a for a in recipes.build(profile, b, RATES, cells=["p4", "p4_w48"]) if a.cell == "p4_w48"]


def test_the_rule_runs_on_the_selection_seed_only():
    cfgs = recipes.selection_configs("cpu", ff.profiles.federated("cpu"), "sgd")
    assert {c.seed for c in cfgs} == {recipes.SELECTION_SEED} and {c.method for c in cfgs} == {"fedavg", "fedfrozen"}
    assert sorted({c.lr for c in cfgs}) == sorted(ff.profiles.CPU_SGD_LR_GRID)
    assert recipes.SELECTION_SEED not in range(15)


def test_the_plateau_gain_is_the_last_tenth_of_the_rounds_interpolated():
    hist = ff.History(config={}, env={})
    for r, acc in [(9, 0.5), (89, 0.60), (99, 0.70)]:  # rounds 10, 90, 100 evaluated
        hist.append({"round": r, "test_acc": acc})
    assert recipes.plateau_gain(hist, 100) == pytest.approx(10.0)  # from round 90 (0.60) to 100 (0.70)
    hist.diverged = {"round": 3, "client": 0}
    assert recipes.plateau_gain(hist, 100) is None


def test_a_bad_cell_is_refused_before_any_run():
    with pytest.raises(ValueError, match="cells must be among"):
        recipes.build("cpu", ff.profiles.federated("cpu"), RATES, cells=["sgd", "bfloat"])
    with pytest.raises(ValueError, match="no selected rates for cell 'p4'"):
        recipes.build("cpu", ff.profiles.federated("cpu"), {"sgd": RATES["sgd"]}, cells=["p4"])
