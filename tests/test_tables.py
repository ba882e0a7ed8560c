"""Tables: per-run rows, mean ± std over seeds, honest formatting of missing values, the paired rule."""

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fedfrozen as ff


def stats_of(values):
    df = pd.DataFrame({"method": ["a"] * len(values), "x": values})
    return ff.tables.mean_std(df, "method", ["x"])


def test_mean_std_counts_finite_values_and_runs():
    stats = stats_of([1.0, 3.0, np.nan])
    assert stats.loc["a", ("x", "mean")] == 2.0
    assert stats.loc["a", ("x", "std")] == pytest.approx(np.sqrt(2.0))
    assert stats.loc["a", ("x", "count")] == 2
    assert stats.loc["a", ("runs", "n")] == 3


@pytest.mark.parametrize("values, text", [
    ([1.0, 3.0], "2.000 ± 1.414"),
    ([1.0, 3.0, np.nan], "2.000 ± 1.414 (2 of 3 runs)"),
    ([4.0, np.nan, np.nan], "4.000 (1 of 3 runs)"),  # one value has no std: never "± 0.000"
    ([5.0], "5.000"),
    ([np.nan, np.nan], "n/a"),
])
def test_format_mean_std_says_how_many_runs_have_a_value(values, text):
    assert ff.tables.format_mean_std(stats_of(values)).loc["a", "x"] == text


def test_summarise_rounds_to_target_is_nan_when_never_reached():
    cfg = ff.Config(method="fedavg", partition="iid", n_clients=2, rounds=2, local_steps=1, eval_every=1,
                    model_kwargs=dict(embed_dim=16, depth=1, num_heads=2))
    hist = ff.run(cfg, progress=False)
    reached = ff.tables.summarise([cfg], [hist], target=0.0)
    never = ff.tables.summarise([cfg], [hist], target=1.01)
    assert reached["rounds_to_target"].iloc[0] == 1.0  # evaluated after round index 0, i.e. one round
    assert np.isnan(never["rounds_to_target"].iloc[0]) and np.isnan(never["MB_to_target"].iloc[0])
    assert reached["MB_to_target"].iloc[0] == pytest.approx(
        (hist.rows[0]["bytes_up"] + hist.rows[0]["bytes_down"]) / 1e6)


def test_learning_rates_use_overrides_first_and_name_unknown_methods():
    lrs = ff.profiles.learning_rates(["fedavg", "fedprox"], {"fedprox": 0.5})
    assert lrs == {"fedavg": ff.profiles.CPU_LR["fedavg"], "fedprox": 0.5}
    assert ff.profiles.learning_rates(["fedavg"], profile="smoke") == {"fedavg": ff.profiles.SELECTED_LR["fedavg"]}
    with pytest.raises(ValueError, match="my_method"):
        ff.profiles.learning_rates(["my_method"])


def test_selected_lr_covers_every_builtin_method():
    assert set(ff.profiles.SELECTED_LR) == set(ff.methods.names())


def test_federated_profiles_build_valid_configs():
    for profile in ("smoke", "cpu", "paper"):
        ff.Config(method="fedfrozen", **ff.profiles.federated(profile))  # validated on construction
    assert ff.profiles.federated("cpu", rounds=30, warmup_rounds=7)["warmup_rounds"] == 7
    cpu = ff.profiles.federated("cpu")
    assert cpu["dataset"] == "fashion_mnist" and cpu["model"] == "vit_fmnist_w48"  # the notebooks' results folder
    assert cpu["lr_schedule"] == "cosine"  # the paper profile's schedule too (docs/cpu_profile.md)
    assert (cpu["n_clients"], cpu["clients_per_round"], cpu["train_subset"]) == (100, 10, 12000)
    assert (cpu["rounds"], cpu["warmup_rounds"]) == (ff.profiles.CPU_ROUNDS, ff.profiles.CPU_WARMUP) == (120, 30)
    assert ff.profiles.federated("smoke")["dataset"] == "digits"  # CI stays on the embedded dataset
    assert ff.profiles.federated("paper", paper_dataset="cifar100")["dataset"] == "cifar100"
    with pytest.raises(ValueError, match="paper_dataset"):
        ff.profiles.federated("paper", paper_dataset="svhn")
    with pytest.raises(ValueError, match="profile"):
        ff.profiles.federated("gpu")


def test_paired_rule_closed_forms():
    # d = (0.1, 0.2, 0.3): mean 0.2, sd 0.1, n 3 -> half-width t(0.975, 2) * 0.1 / sqrt(3) = 4.302653 * 0.057735
    c = ff.tables.compare_runs([0.5, 0.6, 0.7], [0.4, 0.4, 0.4])
    assert c.diff == pytest.approx(0.2) and c.n == 3
    assert c.mean_a == pytest.approx(0.6) and c.mean_b == pytest.approx(0.4)
    assert ff.tables.t_quantile(3) == pytest.approx(4.302653, abs=1e-6)
    assert c.half_width == pytest.approx(4.302653 * 0.1 / math.sqrt(3), rel=1e-6)  # 0.2484 > 0.2: not resolved
    assert not c.resolved and c.verdict == "no difference resolved"
    assert c.interval == pytest.approx((0.2 - c.half_width, 0.2 + c.half_width))
    # the same differences over 5 seeds: d = (0.1, 0.2, 0.3, 0.2, 0.2): sd = sqrt(0.02 / 4), t(0.975, 4) = 2.776445
    c = ff.tables.compare_runs([0.5, 0.6, 0.7, 0.6, 0.6], [0.4] * 5)
    assert c.half_width == pytest.approx(2.776445 * math.sqrt(0.005) / math.sqrt(5), rel=1e-6)  # 0.0878 < 0.2
    assert c.resolved and c.verdict == "higher"
    assert ff.tables.compare_runs([0.4] * 5, [0.5, 0.6, 0.7, 0.6, 0.6]).verdict == "lower"
    assert str(c) == "0.600 vs 0.400: d = +0.200 ± 0.088 (5): higher"


def test_paired_rule_uses_the_pairing_not_the_spread_of_each_arm():
    # each arm varies a lot over seeds (sd 0.2), but a is b + 0.01 seed by seed: the pairs resolve it
    b = [0.2, 0.5, 0.8, 0.4, 0.6]
    c = ff.tables.compare_runs([x + 0.01 + 0.001 * i for i, x in enumerate(b)], b)
    assert c.resolved and c.verdict == "higher" and c.half_width < 0.01


@pytest.mark.parametrize("shift", [1e-9, 0.003, -0.04, 0.5])
def test_a_constant_shift_is_always_resolved(shift):
    b = np.array([0.31, 0.52, 0.44, 0.60, 0.29, 0.71])
    c = ff.tables.compare_runs(b + shift, b)
    assert c.resolved and c.verdict == ("higher" if shift > 0 else "lower")


@pytest.mark.parametrize("values", [[0.5], [0.5, 0.5], [0.2, 0.7, 0.4, 0.9, 0.1]])
def test_identical_arms_never_resolve(values):
    c = ff.tables.compare_runs(values, values)
    assert c.diff == 0 and not c.resolved and c.verdict == "no difference resolved"


def test_one_seed_resolves_nothing_and_bad_input_is_named():
    c = ff.tables.compare_runs([0.9], [0.1])
    assert c.n == 1 and c.half_width == math.inf and not c.resolved
    with pytest.raises(ValueError, match="at least one pair"):
        ff.tables.compare_runs([], [])
    with pytest.raises(ValueError, match="seed by seed"):
        ff.tables.compare_runs([0.1, 0.2], [0.1])
    # a non-finite pair is left out
    assert ff.tables.compare_runs([0.5, float("nan"), 0.7], [0.4, 0.4, 0.6]).n == 2


def test_compare_reads_a_mean_std_table_and_pairs_on_seeds():
    df = pd.DataFrame({"method": ["a"] * 3 + ["b"] * 3, "seed": [0, 1, 2, 2, 0, 1],
                       "final_acc": [0.4, 0.5, 0.6, 0.35, 0.25, 0.3]})
    stats = ff.tables.mean_std(df, "method", ["final_acc"])
    assert ff.tables.compare(stats, "a", "b") == ff.tables.compare_runs([0.4, 0.5, 0.6], [0.25, 0.3, 0.35])
    # seeds only one arm has are left out; arms sharing none are refused by name
    extra = pd.concat([df, pd.DataFrame({"method": ["a", "c"], "seed": [7, 8], "final_acc": [0.9, 0.1]})])
    stats = ff.tables.mean_std(extra, "method", ["final_acc"])
    assert ff.tables.compare(stats, "a", "b").n == 3
    with pytest.raises(ValueError, match="share no seed"):
        ff.tables.compare(stats, "a", "c")
    with pytest.raises(KeyError, match="no row 'z'"):
        ff.tables.compare(stats, "a", "z")
    with pytest.raises(ValueError, match="made by tables.mean_std"):
        ff.tables.compare(stats, "a", "b", col="worst10_acc")


def test_compare_finds_rows_of_a_one_key_list_as_the_index_names_them():
    df = pd.DataFrame({"rank": ["2", "2", "full", "full"], "seed": [0, 1, 0, 1], "final_acc": [0.5, 0.6, 0.4, 0.4]})
    stats = ff.tables.mean_std(df, ["rank"], ["final_acc"])
    assert list(stats.index) == ["2", "full"]
    assert ff.tables.compare(stats, "2", "full").diff == pytest.approx(0.15)


def test_resolution_is_the_smallest_half_width():
    cs = [ff.tables.compare_runs([0.5, 0.6, 0.7], [0.4] * 3), ff.tables.compare_runs([0.5, 0.6], [0.5, 0.5])]
    assert ff.tables.resolution(cs) == min(c.half_width for c in cs)


def test_paper_data_root_is_the_projects_data_from_notebooks_and_local_data_elsewhere(tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    monkeypatch.chdir(tmp_path / "notebooks")
    assert ff.profiles.data_root() == "../data"
    elsewhere = tmp_path / "colab" / "content"  # e.g. Colab's /content, no repository around it
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    assert ff.profiles.data_root() == "data"


# --- the family rule (Holm), power, the per-seed tables (issue: verdicts a reviewer accepts) ---------------------

def test_holm_on_known_p_values():
    # sorted 0.01, 0.02, 0.03, 0.04 -> 4 * 0.01, 3 * 0.02, 2 * 0.03 (0.06 kept), 1 * 0.04 -> max(0.06, 0.04)
    assert ff.tables.holm([0.04, 0.01, 0.03, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert ff.tables.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert ff.tables.holm([0.03]) == [0.03]  # a family of one is unchanged
    assert ff.tables.holm([]) == []


def test_paired_p_matches_scipys_paired_t_test_and_the_rule():
    from scipy.stats import ttest_rel

    a, b = np.array([0.71, 0.69, 0.73, 0.70, 0.72]), np.array([0.70, 0.69, 0.71, 0.70, 0.70])
    c = ff.tables.compare_runs(a, b)
    assert c.p_value == pytest.approx(ttest_rel(a, b).pvalue, rel=1e-9)
    assert (c.p_value < 0.05) == c.resolved
    assert c.sd == pytest.approx(np.std(a - b, ddof=1))


def test_detectable_difference_at_80_percent_power():
    # large n: (z(0.975) + z(0.8)) * sd / sqrt(n) = 2.8016 * sd / sqrt(n)
    assert ff.tables.detectable(1.0, 400) == pytest.approx(2.8016 / 20, rel=0.01)
    # the C1 at alpha 0.1: sd(d) 1.85 points over 5 seeds -> about 3 points
    assert 2.5 < ff.tables.detectable(1.85, 5) < 3.5
    # more seeds, smaller detectable difference; one seed detects nothing
    assert ff.tables.detectable(1.85, 20) < ff.tables.detectable(1.85, 10) < ff.tables.detectable(1.85, 5)
    assert ff.tables.detectable(1.0, 1) == math.inf
    # and it is what it says: a true difference of that size is found with probability 0.8 (simulated)
    rng = np.random.default_rng(0)
    delta = ff.tables.detectable(1.0, 8)
    d = rng.normal(delta, 1.0, size=(20000, 8))
    hw = ff.tables.t_quantile(8) * d.std(axis=1, ddof=1) / np.sqrt(8)
    assert (np.abs(d.mean(axis=1)) > hw).mean() == pytest.approx(0.8, abs=0.01)


def test_adjust_turns_raw_verdicts_into_family_verdicts():
    """p = 0.020, 0.025 and 1e-4 (d, half-width and n made to give them): Holm sorts them 1e-4, 0.020, 0.025 and
    multiplies by 3, 2, 1, kept monotone -> 3e-4, 0.04, 0.04: all three hold; doubled to six, the four near 0.02
    do not (6 x 1e-4, 5 x 1e-4, then 4 x 0.020 = 0.08)."""
    rows = []
    for d, p in ((0.01, 0.020), (0.01, 0.025), (0.02, 1e-4)):
        from scipy.stats import t

        tstat = t.isf(p / 2, 4)
        sd = d * math.sqrt(5) / tstat
        rows.append(dict(d=d, half_width=ff.tables.t_quantile(5) * sd / math.sqrt(5), n=5))
    out = ff.tables.adjust(pd.DataFrame(rows))
    assert out["p"].tolist() == pytest.approx([0.020, 0.025, 1e-4], rel=1e-6)
    assert out["p_holm"].tolist() == pytest.approx([0.04, 0.04, 3e-4], rel=1e-6)
    assert out["verdict_holm"].tolist() == ["higher", "higher", "higher"]
    out2 = ff.tables.adjust(pd.DataFrame(rows * 2))  # six comparisons: the p ~ 0.02 ones no longer hold
    assert (out2["verdict_holm"] == ff.tables.UNRESOLVED).sum() == 4
    one = ff.tables.adjust(pd.DataFrame(rows[:1]))  # a family of one: the paired rule itself
    assert one["p_holm"].iloc[0] == pytest.approx(one["p"].iloc[0])
    assert (out["detectable"] > 0).all()


def test_mean_std_refuses_a_seed_twice_in_one_row():
    df = pd.DataFrame(dict(method=["a", "a", "b"], seed=[0, 0, 0], late_acc=[0.5, 0.6, 0.7]))
    with pytest.raises(ValueError, match=r"seed 0 appears 2 times in row \{'method': 'a'\}"):
        ff.tables.mean_std(df, ["method"], ["late_acc"])


def test_the_per_seed_table_reproduces_the_verdict_table():
    rng = np.random.default_rng(1)
    runs = pd.DataFrame([dict(key=f"{m}{a}{s}", method=m, alpha=a, seed=s,
                              late_acc=0.7 + 0.01 * (m == "fedfrozen") + 0.02 * rng.normal())
                         for m in ("fedavg", "fedfrozen") for a in (0.1, 0.5) for s in range(6)])
    table = ff.tables.mean_std(runs, ["alpha", "method"], ["late_acc"])
    rows = [("C1", f"FedFrozen − FedAvg, α={a}", ff.tables.compare(table, (a, "fedfrozen"), (a, "fedavg"), "late_acc"))
            for a in (0.1, 0.5)]
    verdicts = ff.tables.verdict_table(rows)
    again = ff.tables.recompute(verdicts, ff.tables.per_seed(runs))
    pd.testing.assert_frame_equal(again, verdicts)
    # through CSV, as committed
    import io

    def read(df):
        return (pd.read_csv(io.StringIO(df.to_csv(index=False))))
    pd.testing.assert_frame_equal(ff.tables.recompute(read(verdicts), read(runs)), read(verdicts), check_exact=False,
                                  rtol=1e-12)
    with pytest.raises(ValueError, match="seed 0 appears 2 times"):
        ff.tables.recompute(verdicts, ff.tables.per_seed(pd.concat([runs, runs.iloc[:1]])))
    with pytest.raises(ValueError, match="missing"):
        ff.tables.per_seed(runs.drop(columns="key"))


def test_oscillation_is_zero_for_a_trend_and_the_amplitude_of_a_swing():
    from fedfrozen.base.history import oscillation

    line = [0.5 + 0.01 * t for t in range(10)]
    bend = [0.8 - 0.05 * math.exp(-t / 5) for t in range(10)]  # a late window still settling by 4 points
    swing = [0.7 + 0.002 * t + (0.05 if t % 2 else -0.05) for t in range(10)]
    assert oscillation(line) == pytest.approx(0.0, abs=1e-12)
    assert oscillation(bend) < 0.1 * oscillation(swing)
    assert oscillation(swing) == pytest.approx(0.05, rel=0.05)
    assert math.isnan(oscillation([0.5, 0.6]))


def test_the_adjusted_interval_excludes_0_exactly_when_holm_resolves():
    from fedfrozen.studies.tables import adjust, adjusted_half_width

    table = pd.DataFrame({"d": [0.02, 0.01, -0.03, 0.004, 0.0], "half_width": [0.01, 0.009, 0.02, 0.01, 0.0],
                          "n": [5, 5, 15, 3, 5]})
    out = adjust(table)
    widths = [adjusted_half_width(*r) for r in zip(out["d"], out["half_width"], out["n"], out["p"], out["p_holm"])]
    for d, h, w, v in zip(out["d"], out["half_width"], widths, out["verdict_holm"]):
        assert (abs(d) > w) == (v != "no difference resolved")
        assert w >= h - 1e-12  # Holm's level is never looser than 95%
    assert widths[-1] == 0.0  # identical arms
    assert adjusted_half_width(0.1, math.inf, 1, 1.0, 1.0) == math.inf
    # a family of one: the 95% interval itself
    assert adjusted_half_width(0.02, 0.01, 5, 0.003, 0.003) == pytest.approx(0.01, rel=1e-9)


def test_format_verdicts_says_when_both_arms_give_the_same_values():
    from fedfrozen.studies.tables import adjust, format_verdicts

    row = dict(claim="C1", comparison="a − b", measure="late_acc", d=0.0, half_width=0.0, n=3,
               verdict="no difference resolved")
    text = format_verdicts(adjust(pd.DataFrame([row])))
    assert "the same value on every seed in both arms" in text and "detects" not in text


def test_arm_rows_selects_by_labels():
    from fedfrozen.studies.tables import arm_rows

    runs = pd.DataFrame({"regime": ["a", "a", "b"], "alpha": [0.1, 0.5, 0.1], "key": ["k1", "k2", "k3"]})
    assert list(arm_rows(runs, ["regime", "alpha"], ["a", 0.1])["key"]) == ["k1"]
    assert list(arm_rows(runs, ["alpha"], [0.1])["key"]) == ["k1", "k3"]


def test_the_spread_test_is_pitman_morgan():
    from scipy.stats import pearsonr

    from fedfrozen.studies.tables import compare_spread

    rng = np.random.default_rng(0)
    shared = rng.normal(0.7, 0.005, 15)  # the seed's own level, common to both arms
    a = shared + rng.normal(0, 0.001, 15)
    b = shared + rng.normal(0, 0.03, 15)  # b spreads more
    c = compare_spread(a, b)
    r, p = pearsonr(a + b, a - b)  # the closed form: the correlation of the sum and the difference
    assert c.r == pytest.approx(r) and c.p == pytest.approx(p, rel=1e-9)
    assert c.ratio == pytest.approx(np.std(a, ddof=1) / np.std(b, ddof=1)) and c.ratio < 1 and c.verdict == "lower"
    swapped = compare_spread(b, a)
    assert swapped.p == pytest.approx(c.p) and swapped.verdict == "higher"
    same = compare_spread(a, a)  # identical arms: nothing to resolve
    assert same.ratio == 1 and same.verdict == "no difference resolved"
    with pytest.raises(ValueError, match="at least 3 pairs"):
        compare_spread([0.1, 0.2], [0.2, 0.3])


def test_format_verdicts_prints_each_row_at_its_own_scale():
    """Oscillation under a cosine rate (~1e-4) gets the decimals its half-width needs; accuracy keeps three: no row
    reads "d = -0.000 ± 0.000 ... detects 0.000" as if it detected nothing (03's committed oscillation rows)."""
    from fedfrozen.studies.tables import decimals, format_verdicts

    assert [decimals(h) for h in (0.013, 0.002, 0.0006, 0.00004, 0.0, math.inf)] == [3, 3, 4, 5, 3, 3]
    table = pd.read_csv(Path(__file__).resolve().parents[1] / "figures" / "03_verdicts.csv", index_col=0)
    for line in format_verdicts(table).splitlines():
        assert not re.search(r"± 0\.0+ |detects 0\.0+ ", line), line
    first = table[table["measure"] == "late_acc"].iloc[0]  # accuracy rows print as before
    assert f"d = {first.d:+.3f} ± {first.half_width:.3f} ({int(first.n)})" in format_verdicts(table)
