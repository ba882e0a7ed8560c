"""ff.study.Study: a notebook's study declared (its arms and comparisons); its per-seed table and verdicts are the
ones the notebooks computed by hand before it (the same rows, digit for digit)."""

from __future__ import annotations

import pandas as pd
import pytest

import fedfrozen as ff
from fedfrozen.studies import budgets, recipes, study

TINY = dict(dataset="digits", model="vit_digits", model_kwargs=dict(embed_dim=16, depth=1, num_heads=2), n_clients=4,
            clients_per_round=2, rounds=3, local_steps=1, local_epochs=None, batch_size=16, eval_every=1,
            warmup_rounds=1, lr=1e-3)


def test_a_modules_study_is_its_build_and_its_comparisons():
    base = ff.profiles.federated("smoke")
    rates = {"sgd": {"fedavg": 0.3, "fedfrozen": 0.1}, "p4": {"fedavg": 3e-3, "fedfrozen": 3e-3}}
    s = recipes.study("smoke", base, rates, seeds_pair=[0, 1], seeds_rest=[0], cells=("sgd", "adamw"))
    arms = recipes.build("smoke", base, rates, seeds_pair=[0, 1], seeds_rest=[0], cells=("sgd", "adamw"))
    assert list(s.arms) == arms and list(s.comparisons) == recipes.comparisons(arms, rates)
    assert s.configs() == [a.cfg for a in arms] and s.notebook == "13"
    assert any("its best" in c.label for c in s.comparisons)  # the sgd cell's own-best row, from `rates`


def test_the_runs_and_verdicts_are_the_hand_built_ones():
    """Two arms of one cell on three seeds: the per-seed table has each run's cell and arm, and the verdict table is
    verdict_table over compare(stats, ...), as 13's and 15's cells built it."""
    cfgs = [ff.Config(method=m, seed=s, **TINY) for m in ("fedavg", "fedfrozen") for s in range(3)]
    arms = tuple(ff.controls.Arm("c", study.arm_label(c.method, None if c.method == "fedavg" else 0.25, 1e-3), c,
                                 fraction=None if c.method == "fedavg" else 0.25) for c in cfgs)
    s = study.Study("99", arms, tuple(study.against_fedavg(arms)))
    hists = [ff.run(c, progress=False) for c in cfgs]
    runs = s.runs(hists)
    assert list(runs["cell"]) == ["c"] * 6 and list(runs["arm"]) == [a.arm for a in arms]
    stats = ff.tables.mean_std(runs, ["cell", "arm"], ["late_acc"])
    by_hand = ff.tables.verdict_table([(c.claim, c.label, ff.tables.compare(stats, (c.cell, c.a), (c.cell, c.b),
                                                                            "late_acc")) for c in s.comparisons])
    pd.testing.assert_frame_equal(s.verdicts(stats, "late_acc"), by_hand)
    late = {(c.method, c.seed): h.late_accuracy for c, h in zip(cfgs, hists)}
    d = sum(late[("fedfrozen", k)] - late[("fedavg", k)] for k in range(3)) / 3
    assert s.verdicts(stats, "late_acc")["d"].iloc[0] == pytest.approx(d, abs=1e-6)  # paired by seed
    with pytest.raises(ValueError, match="one History per arm \\(6\\); got 5"):
        s.runs(hists[:5])


def test_notebook_15s_study_groups_each_run_in_its_cell_at_its_budget():
    image = ff.profiles.federated("smoke")
    s = budgets.study("smoke", image, None, {}, cells=["adamw"], seeds={"adamw": [0]})
    cells = {s.cell_of(a) for a in s.arms}
    assert cells == {budgets.cell_name(a) for a in s.arms} and len(cells) == 3  # 1x, 2x, 4x
    assert {c.cell for c in s.comparisons} == {budgets.cell_name(a) for a in s.arms if a.budget in (1, 4)}
