"""Notebook 12's cells (fedfrozen.studies.families): paired arms differ in one thing, the rule's seed is never
evaluated."""

import numpy as np
import pytest
import torch

import fedfrozen as ff
from fedfrozen import families, partition
from fedfrozen.runs.experiments import config_key

RATES = {m: {"fedavg": 1e-3, "fedfrozen": 3e-3} for m in ("linear", "swin", "cait")}


def _diff(a, b):
    da, db = a.to_dict(), b.to_dict()
    return {k for k in da if da[k] != db[k]}


@pytest.fixture(scope="module")
def arms():
    return families.build("cpu", ff.profiles.federated("cpu"), RATES, seeds=range(2), seeds_c1=range(3),
                        seeds_large=range(2))


def test_paired_arms_differ_only_in_the_freezing(arms):
    by = {(a.cell, a.arm, a.cfg.seed): a.cfg for a in arms}
    rows = families.comparisons(arms)
    assert rows
    for _, label, cell, a, b, _ in rows:
        seeds = [s for (c, arm, s) in by if c == cell and arm == a]
        assert seeds
        for s in seeds:
            assert _diff(by[(cell, a, s)], by[(cell, b, s)]) <= {"method", "warmup_rounds"}, label
            assert by[(cell, a, s)].lr == by[(cell, b, s)].lr  # at a shared rate


def test_different_selected_rates_run_both_arms_at_both(arms):
    lin = {(a.arm) for a in arms if a.cell == "linear, Dir 0.1"}
    assert {"fedavg @ 0.001", "fedavg @ 0.003", "fedfrozen T0 25% @ 0.001", "fedfrozen T0 25% @ 0.003"} <= lin
    c1 = [a.cfg.seed for a in arms if a.cell == "linear, Dir 0.1" and a.arm == "fedfrozen T0 25% @ 0.001"]
    t0 = [a.cfg.seed for a in arms if a.cell == "linear, Dir 0.1" and a.arm == "fedfrozen T0 0% @ 0.001"]
    assert sorted(c1) == [0, 1, 2] and sorted(t0) == [0, 1]  # seeds_c1 only for the C1 pair


def test_the_two_federations_differ_only_in_the_number_of_clients(arms):
    small = {(a.arm, a.cfg.seed): a.cfg for a in arms if a.cell == "100 clients, Dir 0.1"}
    big = {(a.arm, a.cfg.seed): a.cfg for a in arms if a.cell == "1000 clients, Dir 0.1"}
    assert small and small.keys() == big.keys()
    for k in small:
        assert _diff(small[k], big[k]) == {"n_clients"}
        assert big[k].rounds == 240 and big[k].local_steps == 6 and big[k].clients_per_round == 10


def test_every_arm_has_its_own_body_and_the_rules_seed_is_never_evaluated(arms):
    assert all(a.cfg.pretrain_seed == a.cfg.seed and a.cfg.init == "pretrained" for a in arms)
    assert families.SELECTION_SEED not in {a.cfg.seed for a in arms}
    sel = families.selection_configs("cpu", ff.profiles.federated("cpu"), "swin")
    seed = families.SELECTION_SEED
    assert {(c.seed, c.pretrain_seed, c.alpha) for c in sel} == {(seed, seed, 0.1)}
    assert sorted({c.lr for c in sel}) == list(ff.profiles.REGIME_LR_GRID)
    assert {c.model for c in sel} == {families.MODELS["swin"]["model"]}


def test_the_vit_cell_is_notebook_03s_bodies_cell():
    base = ff.profiles.federated("cpu")
    bodies = ff.controls.build("cpu", base, seeds=range(5), few=range(5), cells=["bodies"])
    vit = families.build("cpu", base, {}, cells=("vit",))
    assert {config_key(a.cfg) for a in vit} == {config_key(a.cfg) for a in bodies
                                               if a.arm in ("fedavg @ 0.003", "fedfrozen T0 25% @ 0.003")}


def test_every_model_builds_and_splits_at_the_profiles_shapes():
    for profile in ("smoke", "cpu"):
        for name in ("linear", "swin", "cait"):
            f = families.model_fields(profile, name)
            side = 28 if profile == "cpu" else 8
            model = ff.qkv.split_qkv(ff.models.create(f["model"], 10, **f.get("model_kwargs", {})))
            groups = ff.qkv.param_groups(model)
            assert groups["qk"] and groups["v"], (profile, name)
            assert model(torch.zeros(2, 1, side, side)).shape == (2, 10)


def test_selected_rates_and_stability():
    cfgs = families.selection_configs("smoke", ff.profiles.federated("smoke"), "linear", grid=(1e-3, 3e-3))

    class H:
        def __init__(self, acc, diverged=False):
            self.acc, self.diverged = acc, diverged

        def late(self, key):
            return self.acc

    hists = [H(0.5), H(0.9, diverged=True), H(0.4), H(0.4)]
    assert ff.study.selected_rates(cfgs, hists) == {"fedavg": 1e-3, "fedfrozen": 1e-3}  # diverged never wins
    assert families.trains_stably(cfgs, hists)
    assert not families.trains_stably(cfgs, [H(0.15), H(0.9, diverged=True), H(0.5), H(0.5)])


def test_bad_input_is_refused():
    base = ff.profiles.federated("cpu")
    with pytest.raises(ValueError, match="cells"):
        families.build("cpu", base, RATES, cells=("deit",))
    with pytest.raises(ValueError, match="rates"):
        families.build("cpu", base, {}, cells=("swin",))
    with pytest.raises(ValueError, match="model"):
        families.model_fields("cpu", "xcit")
    with pytest.raises(ValueError, match="feature_map"):
        families.model_fields("cpu", "swin", feature_map="elu")


def test_dealing_gives_every_client_its_images_where_no_redraw_can():
    labels = np.repeat(np.arange(10), 1080)
    with pytest.raises(ValueError, match="no draw"):
        partition.dirichlet(labels, 1000, 0.1, seed=0, min_size=1, max_redraws=5)
    parts = partition.dirichlet(labels, 1000, 0.1, seed=0, min_size=1, min_size_by="deal")
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 1 and sizes.sum() == labels.size
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(labels.size))  # every sample exactly once
    again = partition.dirichlet(labels, 1000, 0.1, seed=0, min_size=1, min_size_by="deal")
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    # the draw still skews labels: most clients hold few classes
    assert np.median((partition.label_counts(labels, parts) > 0).sum(1)) <= 4


def test_the_deal_rule_is_checked_before_any_work():
    with pytest.raises(ValueError, match="min_size_by"):
        partition.make("iid", np.zeros(10, dtype=int), 2, min_size_by="deal")
    with pytest.raises(ValueError, match="min_samples_by"):
        ff.Config(min_samples_by="first")
    # the default leaves every cached run's key as it was
    assert config_key(ff.Config()) == config_key(ff.Config(min_samples_by="redraw"))


def test_the_paper_profile_runs_every_cell_from_scratch_at_vit_cifars_scale():
    base = ff.profiles.federated("paper")
    arms = families.build("paper", base, RATES, seeds=range(1), seeds_c1=range(1), seeds_large=range(1))
    assert {a.cell.split(",")[0] for a in arms} == {"linear", "swin", "cait", "vit", "100 clients", "1000 clients"}
    assert {a.cfg.init for a in arms} == {"random"} and {a.cfg.dataset for a in arms} == {"cifar10"}
    assert {a.cfg.model_kwargs.get("img_size", 32) for a in arms} == {32}
    sel = families.selection_configs("paper", base, "cait")
    assert {c.init for c in sel} == {"random"} and {c.seed for c in sel} == {families.SELECTION_SEED}
