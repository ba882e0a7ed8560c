"""The controlled cells of notebook 03 § 3 (fedfrozen.studies.controls): in each comparison the two arms differ in one
thing.

The claims rest on paired comparisons; a pair that differs in its rate or its pretrained body as well as in the
method says nothing about the method alone. These tests read the Configs each cell builds (no training) and check
that, seed by seed, the two arms of every comparison differ only in the settings its label names.
"""

from __future__ import annotations

import pytest

import fedfrozen as ff
from fedfrozen import controls
from fedfrozen.engine.pretrain import weights_key

BASE = ff.profiles.federated("cpu", rounds=120, warmup_rounds=30)
ARMS = controls.build("cpu", BASE, seeds=range(15), few=range(5))


def configs(cell, arm):
    """seed -> Config of one arm of one cell."""
    return {a.cfg.seed: a.cfg for a in ARMS if a.cell == cell and a.arm == arm}


def differing(x, y) -> set:
    dx, dy = x.to_dict(), y.to_dict()
    return {k for k in dx if dx[k] != dy[k]}


@pytest.mark.parametrize("row", controls.comparisons(ARMS) + controls.rate_rows(ARMS), ids=lambda r: r[1])
def test_each_comparison_pairs_arms_that_differ_in_what_its_label_names(row):
    _, label, cell, a, b, _ = row
    ca, cb = configs(cell, a), configs(cell, b)
    assert ca and set(ca) == set(cb)  # the same seeds in both arms
    # the method and its freezing round (FedAvg carries the profile's T0, which it ignores); the rate only where the
    # label says each arm runs at its own selected rate
    allowed = {"method", "warmup_rounds"} | ({"lr"} if "selected" in label else set())
    for seed in ca:
        assert differing(ca[seed], cb[seed]) <= allowed, (label, seed, differing(ca[seed], cb[seed]))
        assert "method" in differing(ca[seed], cb[seed])
        if "selected" in label:
            assert ca[seed].lr != cb[seed].lr
        else:
            assert ca[seed].lr == cb[seed].lr


def test_the_constant_cell_runs_every_arm_at_both_rates_on_15_seeds():
    cell = "constant, Dir 0.1"
    for method, fraction in (("fedavg", None), ("fedfrozen", 0.25), ("fedfrozen", 0.5)):
        for lr in controls.CONSTANT_RATES:
            cfgs = configs(cell, controls.arm_label(method, fraction, lr))
            assert sorted(cfgs) == list(range(15))
            assert {c.lr_schedule for c in cfgs.values()} == {"constant"}
    assert {c.warmup_rounds for c in configs(cell, "fedfrozen T0 50% @ 0.001").values()} == {60}
    assert {c.alpha for a in ARMS if a.cell == "constant, Dir 0.05" for c in [a.cfg]} == {0.05}


def test_a_pretrained_body_per_seed():
    cells = (("bodies, Dir 0.1", "rotation"), ("classes, Dir 0.1", "classes"), ("rates, Dir 0.1", "rotation"))
    for cell, task in cells:
        cfgs = [a.cfg for a in ARMS if a.cell == cell]
        assert cfgs
        assert all(c.init == "pretrained" and c.pretrain_seed == c.seed and c.pretrain_task == task for c in cfgs)
    bodies = {weights_key(c) for c in configs("bodies, Dir 0.1", "fedavg @ 0.003").values()}
    assert len(bodies) == 15  # 15 distinct pre-trainings, one per seed, each cached once
    # the arms of one seed share its body
    assert len({weights_key(a.cfg) for a in ARMS if a.cell == "bodies, Dir 0.1" and a.cfg.seed == 3}) == 1


def test_the_probe_freezes_the_body_from_round_0():
    probe = configs("bodies, Dir 0.1", "freeze_body T0 0% @ 0.003")
    assert sorted(probe) == list(range(15)) and {c.warmup_rounds for c in probe.values()} == {0}


def test_bad_input_is_refused_before_any_work():
    with pytest.raises(ValueError, match="cells"):
        controls.build("cpu", BASE, cells=["constant", "nope"])
    with pytest.raises(ValueError, match="seeds"):
        controls.build("cpu", BASE, seeds=[])


def test_the_paper_profile_leaves_the_pretrained_cells_out():
    base = ff.profiles.federated("paper", rounds=10, warmup_rounds=3)
    cells = {a.cell.split(",")[0] for a in controls.build("paper", base, seeds=[0], few=[0])}
    assert cells == {"constant", "local5"}


def test_a_comparison_is_data_and_its_label_is_written_in_one_place():
    """study.Comparison unpacks as (claim, label, cell, a, b, measure); every study's FedFrozen − FedAvg label comes
    from `study.fedfrozen_vs_fedavg` (controls' constant cells, notebooks 12-15), and `against_fedavg` pairs only arms
    that were built."""
    from fedfrozen.studies import study

    row = study.fedfrozen_vs_fedavg("sgd", 0.5, 0.3)
    claim, label, cell, a, b, measure = row
    assert (claim, cell, a, b, measure) == ("C2", "sgd", "fedfrozen T0 50% @ 0.3", "fedavg @ 0.3", "late_acc")
    assert row.label == label and all(part in label for part in ("FedFrozen T0 50%", "FedAvg", "0.3", "sgd"))
    assert study.fedfrozen_vs_fedavg("x", 0.25, 1e-3).claim == "C1"
    assert study.t0(120, 0.25) == 30 and study.t0(100, 0.5) == 50 and study.t0(3, 0.25) == 1

    def arm(cell, method, fraction, lr):
        cfg = ff.Config(lr=lr, seed=0)
        return controls.Arm(cell, study.arm_label(method, fraction, lr), cfg, fraction=fraction)

    arms = [arm("x", "fedavg", None, 1e-3), arm("x", "fedfrozen", 0.5, 1e-3), arm("x", "fedfrozen", 0.25, 1e-3),
            arm("x", "fedfrozen", 0.25, 3e-3),  # no FedAvg at 3e-3: not compared
            arm("y", "fedavg", None, 1e-3)]  # no FedFrozen in y
    got = study.against_fedavg(arms)
    assert [(r.cell, r.a, r.b) for r in got] == [("x", "fedfrozen T0 25% @ 0.001", "fedavg @ 0.001"),
                                                  ("x", "fedfrozen T0 50% @ 0.001", "fedavg @ 0.001")]
    assert [r.cell for r in study.against_fedavg(arms, cell_of=lambda a: "one")] == ["one"] * 2  # cells merged


@pytest.mark.parametrize("profile", ["smoke", "cpu"])
def test_the_shared_rate_rows_are_the_constant_cells_pairs_at_one_rate(profile):
    """Notebook 03 judges C1's stability on these: every constant cell's FedFrozen − FedAvg at a rate both arms ran,
    in the comparisons' order, and none of the each-at-its-selected-rate rows."""
    arms = controls.build(profile, ff.profiles.federated(profile))
    rows = controls.comparisons(arms)
    shared = controls.shared_rate_rows(arms)
    cfg = {(a.cell, a.arm): a.cfg for a in arms}
    assert shared == [r for r in rows if r in shared]  # a subsequence, in order
    assert len(shared) == 8  # two constant cells (Dir 0.1, 0.05) x two rates x T0 25% and 50%
    for r in shared:
        assert cfg[(r.cell, r.a)].lr == cfg[(r.cell, r.b)].lr and cfg[(r.cell, r.b)].method == "fedavg"
    study = controls.study(profile, ff.profiles.federated(profile))
    assert list(study.arms) == arms and list(study.comparisons) == rows
