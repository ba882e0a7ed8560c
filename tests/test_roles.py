"""Notebook 14's cells (fedfrozen.studies.roles): the federation of Shakespeare's roles, what each arm runs and what
it is
paired with, C4's drift rows, and the text's identity in the cache keys."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import fedfrozen as ff
from fedfrozen import data, pretrain, roles
from fedfrozen import shakespeare as S
from fedfrozen.runs.experiments import config_key

RATES = {"scratch": {"fedavg": 3e-3, "fedfrozen": 3e-3}, "pretrained": {"fedavg": 3e-3, "fedfrozen": 1e-2}}


def _cpu():
    base = roles.fields("cpu", "data")
    return base, roles.build("cpu", base, RATES, seeds_pair=range(15), seeds_rest=range(5))


def _differ(a, b) -> set:
    da, db = a.to_dict(), b.to_dict()
    return {k for k in da.keys() | db.keys() if da.get(k) != db.get(k)}


def test_the_federation_is_the_largest_roles_with_fixed_local_steps():
    base, arms = _cpu()
    assert base["dataset"] == "shakespeare" and base["partition"] == "natural"
    assert all(a.cfg.n_clients == roles.N_CLIENTS and a.cfg.clients_per_round == roles.PER_ROUND for a in arms)
    assert all(a.cfg.local_steps == roles.BUDGET["local_steps"] and a.cfg.local_epochs is None for a in arms)
    assert all(a.cfg.rounds == roles.BUDGET["rounds"] and a.cfg.model == "char_transformer" for a in arms)
    scratch = [a.cfg for a in arms if a.cell == "scratch"]
    pre = [a.cfg for a in arms if a.cell == "pretrained"]
    assert all(c.init == "random" for c in scratch)
    assert all(c.init == "pretrained" and c.pretrain_task == "plays" and c.pretrain_seed == c.seed
               and c.pretrain_epochs == roles.PRETRAIN_EPOCHS for c in pre)  # a body per seed


def test_the_seeds_of_each_arm_and_both_rates_where_the_arms_chose_differently():
    _, arms = _cpu()
    seeds = {}
    for a in arms:
        seeds.setdefault((a.cell, a.arm), []).append(a.cfg.seed)
    assert seeds[("scratch", "fedavg @ 0.003")] == list(range(15))
    assert seeds[("scratch", "fedfrozen T0 25% @ 0.003")] == list(range(15))
    assert seeds[("scratch", "fedfrozen T0 0% @ 0.003")] == list(range(5))
    assert seeds[("scratch", "fedfrozen T0 25% @ 0.003 + V L2 0.01")] == list(range(5))
    assert {arm for cell, arm in seeds if cell == "scratch"} == {
        "fedavg @ 0.003", "fedfrozen T0 0% @ 0.003", "fedfrozen T0 25% @ 0.003", "fedfrozen T0 50% @ 0.003",
        "fedfrozen T0 25% @ 0.003 + V L2 0.01"}
    pre = {arm for cell, arm in seeds if cell == "pretrained"}
    assert len(pre) == 10 and {"fedavg @ 0.003", "fedavg @ 0.01"} <= pre  # both rates, every arm


def test_every_comparison_pairs_arms_that_differ_in_one_thing():
    _, arms = _cpu()
    by = {(a.cell, a.arm, a.cfg.seed): a.cfg for a in arms}
    rows = roles.comparisons(arms)
    assert [r[0] for r in rows].count("C1") == 3  # scratch at one rate, pretrained at two
    assert [r[0] for r in rows].count("C3") == 3 and [r[0] for r in rows].count("C2") == 6
    for claim, label, cell, a, b, _ in rows:
        pairs = [(by[(cell, a, s)], by[(cell, b, s)]) for (c, arm, s) in by if c == cell and arm == a]
        assert pairs, label
        for x, y in pairs:
            expected = {"value_l2"} if claim == "C3" else {"method", "warmup_rounds"}
            assert _differ(x, y) <= expected and _differ(x, y), label
            assert x.lr == y.lr and x.seed == y.seed


def test_the_rule_runs_on_held_out_seeds_no_comparison_evaluates():
    cfgs = roles.selection_configs("cpu", roles.fields("cpu", "data"), "pretrained")
    assert {c.seed for c in cfgs} == set(roles.SELECTION_SEEDS) and len(roles.SELECTION_SEEDS) == 3
    assert all(c.pretrain_seed == c.seed for c in cfgs)  # each seed's own body
    assert sorted({c.lr for c in cfgs}) == list(roles.LR_GRID) and {c.method for c in cfgs} == {"fedavg", "fedfrozen"}
    assert len(cfgs) == 3 * 2 * len(roles.LR_GRID)
    assert not set(roles.SELECTION_SEEDS) & set(range(15))
    smoke = roles.selection_configs("smoke", roles.fields("smoke", "data"), "scratch")
    assert {c.seed for c in smoke} == {roles.SELECTION_SEED}  # CI's profile: one held-out seed


def test_the_rule_reads_the_mean_over_the_selection_seeds():
    """One seed that favours a rate does not choose it against the others' mean; a rate with a diverged seed never
    wins; one seed is the rule as before."""
    from fedfrozen.studies.study import selected_rates

    def hist(acc):
        return SimpleNamespace(diverged={"round": 3} if acc is None else None, late=lambda col: acc)

    cfgs = [ff.Config(method="fedavg", lr=lr, seed=s) for s in (100, 101, 102) for lr in (1e-3, 3e-2)]
    accs = {(100, 1e-3): 0.30, (100, 3e-2): 0.32, (101, 1e-3): 0.34, (101, 3e-2): 0.29, (102, 1e-3): 0.33,
            (102, 3e-2): 0.30}
    hists = [hist(accs[(c.seed, c.lr)]) for c in cfgs]
    assert selected_rates(cfgs, hists) == {"fedavg": 1e-3}
    assert selected_rates(cfgs[:2], hists[:2]) == {"fedavg": 3e-2}  # seed 100 alone: the outlier's choice
    hists[0] = hist(None)  # 1e-3 diverged on one seed
    assert selected_rates(cfgs, hists) == {"fedavg": 3e-2}


def test_bad_cells_and_missing_rates_are_refused_naming_them():
    base = roles.fields("cpu", "data")
    with pytest.raises(ValueError, match="init must be one of scratch, pretrained; got 'warm'"):
        roles.cell_fields(base, "warm")
    with pytest.raises(ValueError, match=r"rates has no selected rates for \['pretrained'\]"):
        roles.build("cpu", base, {"scratch": RATES["scratch"]})
    with pytest.raises(ValueError, match="inits must be among"):
        roles.rates_by_rule("cpu", base, ["scratch", "warm"])


def test_c4_rows_are_each_fedavg_runs_group_drift_over_the_rounds():
    _, arms = _cpu()
    frame = pd.DataFrame({"round": [0, 1], "drift_qk": [1.0, 3.0], "update_norm_qk": [2.0, 2.0],
                          "drift_v": [0.5, 0.5], "update_norm_v": [1.0, 3.0],
                          "drift_attn_out": [2.0, 4.0], "update_norm_attn_out": [1.0, 1.0]})
    hist = SimpleNamespace(diverged=None, to_frame=lambda: frame)
    table = roles.drift_table(arms, [hist] * len(arms), sizes={"qk": 4, "v": 16})
    fedavg = [a for a in arms if a.cfg.method == "fedavg"]
    assert len(table) == 3 * len(fedavg) and set(table["group"]) == {"qk", "v", "attn_out"}
    first = table[table["key"] == config_key(fedavg[0].cfg)].set_index("group")
    assert first["drift"].to_dict() == {"qk": 2.0, "v": 0.5, "attn_out": 3.0}
    assert first["step"].to_dict() == {"qk": 2.0, "v": 2.0, "attn_out": 1.0}
    # the dispersion sqrt(drift) * step, per round, then its mean; per parameter / sqrt(numel) where sizes has it
    assert first.loc["v", "disp"] == pytest.approx(0.5 ** 0.5 * 2.0) and first.loc["v", "disp_per_param"] == \
        pytest.approx(0.5 ** 0.5 * 2.0 / 4)
    assert first.loc["qk", "disp"] == pytest.approx((2.0 + 3.0 ** 0.5 * 2.0) / 2)
    assert np.isnan(first.loc["attn_out", "disp_per_param"])


def test_c4_compares_every_group_with_qk():
    assert set(roles.DRIFT_GROUPS) == set(ff.qkv.GROUPS) - {"qk", "other"}


def test_other_texts_than_the_release_never_share_a_key_or_pretrained_weights_with_it(tmp_path):
    cfg = ff.Config(dataset="shakespeare", partition="natural", data_root=str(tmp_path / "none"), n_clients=6,
                    model="char_transformer_tiny", init="pretrained", pretrain_task="plays")
    assert data.source_version(cfg) is None  # nothing there: the release is what a run would fetch
    S.write_sample(tmp_path / "a")
    S.write_sample(tmp_path / "b")
    sample_a, sample_b = (cfg.replace(data_root=str(tmp_path / x)) for x in "ab")
    assert data.source_version(sample_a).startswith("texts-")
    assert config_key(sample_a) == config_key(sample_b) != config_key(cfg)  # the text, not where it lies
    assert pretrain.weights_key(sample_a) == pretrain.weights_key(sample_b) != pretrain.weights_key(cfg)
    (tmp_path / "b" / S.TEXTS / f"{S.PLAYS[0]}_gut.txt").write_text("HAMLET.\nanother text\n")
    assert config_key(sample_a.replace(data_root=str(tmp_path / "b"))) != config_key(sample_a)


@pytest.mark.skipif(not (ff.io.project_root() / "data" / S.TARBALL).is_file(), reason="the release is not in data/")
def test_the_release_unpacked_is_the_release(tmp_path):
    import tarfile

    tarball = ff.io.project_root() / "data" / S.TARBALL
    assert S.texts_digest(tarball) == S.TEXTS_SHA256
    with tarfile.open(tarball, "r:gz") as tar:
        tar.extractall(tmp_path, members=[m for m in tar.getmembers() if m.name.startswith(S.TEXTS)], filter="data")
    assert S.source_version(tmp_path) is None and S.source_version(tarball.parent) is None


def test_a_sensitivity_rate_adds_every_arm_at_it_and_is_told_apart():
    base = roles.fields("cpu", "data")
    rates = {"scratch": {"fedavg": 3e-3, "fedfrozen": 3e-3}, "pretrained": {"fedavg": 1e-3, "fedfrozen": 1e-3}}
    plain = roles.build("cpu", base, rates, seeds_pair=range(2), seeds_rest=range(1))
    arms = roles.build("cpu", base, rates, seeds_pair=range(2), seeds_rest=range(1), sensitivity={"scratch": [3e-2]})
    extra = [a for a in arms if a.cfg.lr == 3e-2]
    assert len(arms) == len(plain) + len(extra) and {a.cell for a in extra} == {"scratch"}
    assert {a.arm for a in extra} == {a.arm.replace("@ 0.003", "@ 0.03") for a in plain if a.cell == "scratch"}
    assert roles.is_sensitivity(rates, "scratch", 3e-2) and not roles.is_sensitivity(rates, "scratch", 3e-3)
    rows = roles.comparisons(arms)
    assert sum("at 0.03" in r[1] for r in rows) == 4  # C1, C2 twice, C3 at the sensitivity rate
    with pytest.raises(ValueError, match="sensitivity must map starts"):
        roles.build("cpu", base, rates, sensitivity={"warm": [3e-2]})
    with pytest.raises(ValueError, match="sensitivity must map starts"):
        roles.build("cpu", base, rates, sensitivity={"scratch": [-1.0]})


def test_seed_agreement_counts_the_seeds_that_pick_the_mean_best_alone():
    from fedfrozen.studies.selection import seed_agreement

    accs = {0: (0.5, 0.4), 1: (0.3, 0.6), 2: (0.35, 0.5), 3: (0.4, 0.4)}
    rows = [dict(cell="c", arm="a", lr=lr, seed=s, acc=acc) for s, pair in accs.items()
            for lr, acc in zip((1e-3, 3e-2), pair)]
    rows += [dict(cell="c", arm="b", lr=1e-3, seed=s, acc=0.1) for s in range(4)]  # one rate: no choice to make
    got = seed_agreement(pd.DataFrame(rows), ["cell", "arm"], "acc", chosen_on=(0, 3, 9))
    assert len(got) == 1 and got.loc[0, "arm"] == "a" and got.loc[0, "best_on_mean"] == 3e-2
    assert got.loc[0, "seeds"] == 4 and got.loc[0, "seeds_picking_it"] == 2  # seed 3's tie goes to the smaller rate
    assert got.loc[0, "seed 0 picks"] == 1e-3 and got.loc[0, "seed 3 picks"] == 1e-3
    assert got.loc[0, "seed 9 picks"] is None
    none = seed_agreement(pd.DataFrame(rows[-4:]), ["cell", "arm"], "acc", chosen_on=(0,))  # no arm with two rates
    assert none.empty and list(none.columns) == ["cell", "arm", "rates", "best_on_mean", "seeds", "seeds_picking_it",
                                                 "seed 0 picks"]


def test_the_cpu_profiles_one_seed_table_follows_from_the_committed_rows():
    """docs/cpu_profile.md's table of one seed's choices in notebook 03 § 3 is seed_agreement of the committed
    per-seed rows, row for row."""
    import re

    from fedfrozen.studies.selection import seed_agreement

    root = ff.io.project_root()
    runs = pd.read_csv(root / "figures" / "03_controls_per_seed.csv", index_col=0)
    runs["rule_arm"] = runs["arm"].str.split(" @ ").str[0]
    got = seed_agreement(runs, ["cell", "rule_arm"], chosen_on=(0,))
    names = {"fedavg": "FedAvg", "fedfrozen T0 25%": "FedFrozen T0 25%", "fedfrozen T0 50%": "FedFrozen T0 50%"}
    text = (root / "docs" / "cpu_profile.md").read_text()
    row = r"^\| (\w+, Dir [\d.]+, [^|]+) \| [^|]+ \| ([\de-]+) \| (\d+) of (\d+) \| ([\de-]+) \|$"
    quoted = re.findall(row, text, re.M)
    assert len(quoted) == len(got) == 8
    for (_, row), (arm, best, k, n, seed0) in zip(got.iterrows(), quoted):
        assert arm == f"{row['cell']}, {names[row['rule_arm']]}"
        assert (float(best), int(k), int(n), float(seed0)) == (row["best_on_mean"], row["seeds_picking_it"],
                                                              row["seeds"], row["seed 0 picks"])
