"""Tables: per-run rows, mean ± std over seeds, and honest formatting of missing values."""

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
    assert lrs == {"fedavg": ff.profiles.SELECTED_LR["fedavg"], "fedprox": 0.5}
    with pytest.raises(ValueError, match="my_method"):
        ff.profiles.learning_rates(["my_method"])


def test_selected_lr_covers_every_builtin_method():
    assert set(ff.profiles.SELECTED_LR) == set(ff.methods.names())


def test_federated_profiles_build_valid_configs():
    for profile in ("smoke", "cpu", "paper"):
        ff.Config(method="fedfrozen", **ff.profiles.federated(profile))  # validated on construction
    assert ff.profiles.federated("cpu", rounds=30, warmup_rounds=7)["warmup_rounds"] == 7
    assert ff.profiles.federated("cpu")["dataset"] == "digits"  # the notebooks' results folder
    assert ff.profiles.federated("paper", paper_dataset="cifar100")["dataset"] == "cifar100"
    with pytest.raises(ValueError, match="paper_dataset"):
        ff.profiles.federated("paper", paper_dataset="svhn")
    with pytest.raises(ValueError, match="profile"):
        ff.profiles.federated("gpu")


def test_one_spread_rule_closed_forms():
    # a: mean 0.5, sample std 0.1; b: mean 0.3, sample std 0.05 -> spread 0.1, gap 0.2 > 0.1 -> holds
    c = ff.tables.compare_runs([0.4, 0.5, 0.6], [0.25, 0.3, 0.35])
    assert c.mean_a == pytest.approx(0.5) and c.spread == pytest.approx(0.1) and c.beyond and c.verdict == "higher"
    assert ff.tables.compare_runs([0.25, 0.3, 0.35], [0.4, 0.5, 0.6]).verdict == "lower"
    # gap 0.05 <= spread 0.1: within
    c = ff.tables.compare_runs([0.4, 0.5, 0.6], [0.45, 0.45, 0.45])
    assert not c.beyond and c.verdict == "within the spread"
    # a gap exactly equal to the spread does not hold; one run per side has no spread
    assert not ff.tables.Comparison(0.6, 0.5, 0.1 + 1e-12).beyond
    assert ff.tables.compare_runs([0.51], [0.5]).beyond
    with pytest.raises(ValueError, match="at least one value"):
        ff.tables.compare_runs([], [0.5])


def test_compare_reads_a_mean_std_table_and_agrees_with_compare_runs():
    df = pd.DataFrame({"method": ["a"] * 3 + ["b"] * 3, "seed": [0, 1, 2] * 2,
                       "final_acc": [0.4, 0.5, 0.6, 0.25, 0.3, 0.35]})
    stats = ff.tables.mean_std(df, "method", ["final_acc"])
    assert ff.tables.compare(stats, "a", "b") == ff.tables.compare_runs([0.4, 0.5, 0.6], [0.25, 0.3, 0.35])


def test_paper_data_root_is_the_projects_data_from_notebooks_and_local_data_elsewhere(tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    monkeypatch.chdir(tmp_path / "notebooks")
    assert ff.profiles.data_root() == "../data"
    elsewhere = tmp_path / "colab" / "content"  # e.g. Colab's /content, no repository around it
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    assert ff.profiles.data_root() == "data"
