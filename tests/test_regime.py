"""The regime map (fedfrozen.studies.regime): its grids, its runs, and the verdict of each cell."""

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from conftest import tiny_config  # noqa: E402

import fedfrozen as ff  # noqa: E402
from fedfrozen import regime  # noqa: E402


def test_full_grid_is_the_product_of_the_issue_axes():
    cells = regime.grid("full")
    assert len(cells) == 4 * 2 * 3 * 2
    assert {c.alpha for c in cells} == {0.05, 0.1, 0.5, 1.0}
    assert {c.local_epochs for c in cells} == {1, 5}
    assert {c.fraction for c in cells} == {0.25, 0.5, 0.75}
    assert {c.start for c in cells} == {"scratch", "warm"}


def test_coarse_grid_is_a_subset_of_the_full_grid():
    assert set(regime.grid("coarse")) <= set(regime.grid("full"))


def test_grids_join_with_a_plus_and_the_regime_cells_are_notebooks_03_04s():
    joined = regime.grid("coarse+regimes")
    assert joined == regime.grid("coarse") + regime.grid("regimes")
    assert {(c.start, c.schedule, c.local_epochs) for c in regime.grid("regimes")} == {
        ("pretrained", None, 1), ("scratch", "constant", 1), ("pretrained", "constant", 1), ("scratch", None, 5),
        ("pretrained", None, 5)}  # notebook 03's regimes (five epochs: local5 and local5_pretrained)
    with pytest.raises(ValueError, match="grid must be one of"):
        regime.grid("coarse+huge")


@pytest.mark.parametrize("kw, name", [
    (dict(fractions=(0.5, 1.0)), "fractions"), (dict(fractions=(-0.1,)), "fractions"),
    (dict(alphas=(0.0,)), "alphas"), (dict(local_epochs=(0,)), "local_epochs"),
    (dict(local_epochs=(1.5,)), "local_epochs"),
    (dict(starts=("cold",)), "starts"), (dict(schedules=("linear",)), "schedules"), (dict(alphas=()), "alphas"),
])
def test_bad_axes_are_named(kw, name):
    with pytest.raises(ValueError, match=name):
        regime.grid(**kw)


def test_unknown_grid_name_is_named():
    with pytest.raises(ValueError, match="grid must be one of coarse, regimes, full"):
        regime.grid("huge")


def test_plan_has_one_baseline_per_setting_and_t0_from_the_fraction():
    cells = regime.grid(alphas=(0.1, 1.0), local_epochs=(1,), fractions=(0.25, 0.5), starts=("scratch",)) + \
        [regime.Cell(0.1, 1, "warm", 0.5)]
    base = dict(dataset="digits", rounds=40, eval_every=5)
    runs = regime.build_runs(cells, base, seeds=[0, 1], lrs={"fedavg": 3e-2, "fedfrozen": 1e-2})
    fedavg = [r for r in runs if r.arm == "fedavg"]
    frozen = [r for r in runs if r.arm == "fedfrozen"]
    assert len(fedavg) == 3 * 2 and len(frozen) == 5 * 2
    assert {(r.alpha, r.start) for r in fedavg} == {(0.1, "scratch"), (1.0, "scratch"), (0.1, "warm")}
    assert sorted({r.cfg.warmup_rounds for r in frozen}) == [10, 20]
    assert all(r.cfg.method == "fedavg" and r.cfg.lr == 3e-2 for r in fedavg)
    assert all(r.cfg.method == "fedfrozen" and r.cfg.lr == 1e-2 for r in frozen)
    warm = [r.cfg for r in runs if r.start == "warm"]
    assert all(c.init == "public" and c.public_fraction > 0 and c.server_pretrain_epochs >= 1 for c in warm)
    assert all(c.init == "random" for c in (r.cfg for r in runs if r.start == "scratch"))
    # the arms of one cell differ only in method, lr and T0
    a = next(r.cfg for r in fedavg if r.alpha == 0.1 and r.start == "warm" and r.cfg.seed == 0)
    b = next(r.cfg for r in frozen if r.alpha == 0.1 and r.start == "warm" and r.cfg.seed == 0)
    diff = {k for k, v in a.to_dict().items() if b.to_dict()[k] != v}
    assert diff <= {"method", "lr", "warmup_rounds"}


def _runs(values_frozen, values_avg, measure="final_acc", fraction=0.5):
    rows = [dict(arm="fedfrozen", alpha=0.1, local_epochs=1, start="scratch", fraction=fraction, seed=s, **{measure: v})
            for s, v in enumerate(values_frozen)]
    rows += [dict(arm="fedavg", alpha=0.1, local_epochs=1, start="scratch", fraction=1.0, seed=s, **{measure: v})
             for s, v in enumerate(values_avg)]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("frozen, avg, verdict", [
    ([0.80, 0.82, 0.84], [0.70, 0.71, 0.72], "better"),
    ([0.60, 0.62, 0.64], [0.70, 0.71, 0.72], "worse"),
    ([0.70, 0.75, 0.80], [0.70, 0.71, 0.72], "no difference resolved"),
])
def test_cell_verdict_follows_the_one_rule(frozen, avg, verdict):
    row = regime.regime_map(_runs(frozen, avg)).iloc[0]
    c = ff.tables.compare_runs(frozen, avg)
    assert row["gap"] == pytest.approx(sum(frozen) / 3 - sum(avg) / 3)
    assert row["half_width"] == pytest.approx(c.half_width)
    assert row["verdict"] == verdict and row["seeds"] == 3


def test_lower_is_better_for_stability():
    table = regime.regime_map(_runs([0.001, 0.002, 0.003], [0.05, 0.06, 0.07], "stability"), "stability")
    assert table.iloc[0]["gap"] < 0 and table.iloc[0]["verdict"] == "better"


def test_missing_baseline_and_unknown_measure_are_named():
    df = _runs([0.8], [0.7])
    with pytest.raises(ValueError, match="no FedAvg runs for alpha=0.1, local_epochs=1, start='scratch'"):
        regime.regime_map(df[df["arm"] == "fedfrozen"])
    with pytest.raises(ValueError, match="measure must be one of"):
        regime.regime_map(df, "accuracy")


def test_map_end_to_end_on_a_tiny_federation(tmp_path):
    """plan -> run_many -> summarise -> map: every cell has a row, FedFrozen's T0 is the cell's, and the heat
    map writes one label per cell."""
    import matplotlib.pyplot as plt

    base = tiny_config(rounds=4, n_clients=4).to_dict()
    cells = regime.grid(alphas=(0.5,), local_epochs=(1,), fractions=(0.5,), starts=("scratch", "warm"))
    runs = regime.build_runs(cells, base, seeds=[0])
    hists = ff.run_many([r.cfg for r in runs], root=tmp_path, progress=False, workers=1)
    df = regime.summarise(runs, hists)
    assert list(df["T0"]) == [4, 2, 4, 2]
    stages = [[row["stage"] for row in h.rows] for h in hists]
    assert stages == [[1, 1, 1, 1], [1, 1, 2, 2]] * 2
    table = regime.regime_map(df, "final_acc")
    assert len(table) == 2 and set(table["start"]) == {"scratch", "warm"}
    ax = ff.plots.plot_regime_map(table, 0.5)
    assert len(ax.texts) == 2
    plt.close("all")


def test_map_cells_are_judged_as_one_family_by_holm():
    """Two cells, each resolved alone at p < 0.05 but one not after Holm over both: the map says which."""
    frozen_a, avg = [0.80, 0.82, 0.84, 0.83], [0.70, 0.71, 0.72, 0.71]
    frozen_b = [0.72, 0.70, 0.74, 0.73]
    df = pd.concat([_runs(frozen_a, avg, fraction=0.25), _runs(frozen_b, avg, fraction=0.5)])
    df = df.drop_duplicates(subset=["arm", "fraction", "seed"])
    table = regime.regime_map(df).set_index("fraction")
    p = [ff.tables.paired_p(c.gap, c.half_width, c.n) for c in
         (ff.tables.compare_runs(frozen_a, avg), ff.tables.compare_runs(frozen_b, avg))]
    assert table["p"].tolist() == pytest.approx(p)
    assert table["p_holm"].tolist() == pytest.approx(ff.tables.holm(p))
    for fraction, p_holm in zip((0.25, 0.5), ff.tables.holm(p)):
        assert table.loc[fraction, "verdict_holm"] == ("better" if p_holm < 0.05 else "no difference resolved")
    assert (table["detectable"] > 0).all()


def test_holm_verdict_follows_the_measure_direction():
    table = regime.regime_map(_runs([0.001, 0.002, 0.003, 0.002], [0.05, 0.06, 0.07, 0.06], "oscillation"),
                              "oscillation")
    assert table.iloc[0]["verdict"] == "better" and table.iloc[0]["verdict_holm"] == "better"


def test_schedule_axis_gives_its_own_baseline_and_lr_per_cell():
    cells = regime.grid(alphas=(0.1,), local_epochs=(1,), fractions=(0.25,), starts=("scratch", "pretrained"),
                        schedules=(None, "constant"))
    base = dict(dataset="fashion_mnist", rounds=40, train_subset=12000, lr_schedule="cosine")
    def lrs(method, cell):
        return {("scratch", None): 1e-2, ("scratch", "constant"): 3e-3}.get((cell.start, cell.schedule), 1e-3)

    runs = regime.build_runs(cells, base, seeds=[0], lrs=lrs)
    assert len(runs) == 4 * 2  # a FedAvg baseline and a FedFrozen arm per (start, schedule)
    got = {(r.start, r.cfg.lr_schedule, r.arm): (r.cfg.init, r.cfg.lr) for r in runs}
    assert got[("scratch", "cosine", "fedavg")] == ("random", 1e-2)  # None keeps the profile's schedule
    assert got[("scratch", "constant", "fedfrozen")] == ("random", 3e-3)
    assert got[("pretrained", "constant", "fedavg")] == ("pretrained", 1e-3)
    assert {r.schedule for r in runs} == {"cosine", "constant"}


def test_regimes_are_config_fields_and_their_rates_come_from_the_selection():
    for fields in ff.profiles.REGIMES.values():
        ff.Config(**{**ff.profiles.CPU_SCALE, **fields})  # every regime is a valid Config over the cpu profile
    assert ff.profiles.regime_fields("constant_pretrained") == dict(init="pretrained", lr_schedule="constant")
    rates = ff.profiles.regime_learning_rates("local5_pretrained", ["fedavg", "fedprox"])
    assert rates["fedavg"] == ff.profiles.REGIME_LR["pretrained"]["fedavg"]  # more local work: its start's rate
    assert rates["fedprox"] == ff.profiles.CPU_LR["fedprox"]  # not selected for the regime: the profile's
    assert ff.profiles.regime_learning_rates("scratch", ["fedavg"]) == {"fedavg": ff.profiles.CPU_LR["fedavg"]}
    assert ff.profiles.regime_learning_rates("pretrained", ["fedavg"], {"fedavg": 0.5}) == {"fedavg": 0.5}
    with pytest.raises(ValueError, match="regime must be one of"):
        ff.profiles.regime_fields("warm")
    with pytest.raises(ValueError, match="regime must be one of"):
        ff.profiles.regime_learning_rates("cold", ["fedavg"])


def test_a_regime_over_each_profile_or_none_where_it_cannot_run():
    cpu = ff.profiles.federated("cpu")
    assert ff.profiles.regime_setup("cpu", cpu, "constant_pretrained") == {**cpu, "init": "pretrained",
                                                                          "lr_schedule": "constant"}
    smoke = ff.profiles.regime_setup("smoke", ff.profiles.federated("smoke"), "pretrained")
    assert (smoke["train_subset"], smoke["pretrain_epochs"]) == (1000, 1)  # digits: images no client holds
    paper = ff.profiles.federated("paper")
    assert ff.profiles.regime_setup("paper", paper, "pretrained") is None  # every image is a client's
    assert ff.profiles.regime_setup("paper", paper, "constant")["lr_schedule"] == "constant"
    with pytest.raises(ValueError, match="regime must be one of"):
        ff.profiles.regime_setup("cpu", cpu, "frozen")


def test_each_cell_takes_the_rates_selected_for_its_regime():
    lr = regime.selected_lrs("cpu")
    assert lr("fedavg", regime.Cell(0.1, 1, "scratch", 0.25)) == ff.profiles.CPU_LR["fedavg"]
    assert lr("fedavg", regime.Cell(0.1, 5, "warm", 0.5)) == ff.profiles.CPU_LR["fedavg"]
    for cell, name in [(regime.Cell(0.1, 1, "pretrained", 0.25), "pretrained"),
                       (regime.Cell(0.1, 1, "scratch", 0.25, "constant"), "constant"),
                       (regime.Cell(0.1, 5, "pretrained", 0.5, "constant"), "constant_pretrained")]:
        assert regime.regime_name(cell) == name
        assert lr("fedfrozen", cell) == ff.profiles.REGIME_LR[name]["fedfrozen"]


def test_the_map_and_notebooks_03_04_build_the_same_runs():
    """A regime cell of the map is the very config of notebooks 03-04's sections 2 (same cache key: no retraining)."""
    from fedfrozen.runs.experiments import config_key

    base = ff.profiles.federated("cpu")
    runs = regime.build_runs(regime.grid("regimes"), base, seeds=[3], lrs=regime.selected_lrs("cpu"))
    keys = {config_key(r.cfg) for r in runs}
    for name in ("pretrained", "constant", "constant_pretrained", "local5", "local5_pretrained"):
        lrs = ff.profiles.regime_learning_rates(name, ["fedavg", "fedfrozen"])
        for m in ("fedavg", "fedfrozen"):
            nb03 = ff.Config(method=m, seed=3, partition="dirichlet", alpha=0.1,
                             **{**base, **ff.profiles.regime_fields(name), "lr": lrs[m]})
            assert config_key(nb03) in keys, name
    # notebook 04's section 2: FedFrozen at T0 = 0 and T/2 from the pretrained start (T0 = round(fraction * T))
    lr = ff.profiles.regime_learning_rates("pretrained", ["fedfrozen"])["fedfrozen"]
    for fraction in (0.0, 0.5):
        nb04 = ff.Config(method="fedfrozen", seed=3, partition="dirichlet", alpha=0.1,
                         **{**base, **ff.profiles.regime_fields("pretrained"), "lr": lr,
                            "warmup_rounds": int(round(fraction * base["rounds"]))})
        assert config_key(nb04) in keys, fraction
    # and at a constant rate at alpha 0.05, drawn with one image per client at least (profiles.dirichlet_fields)
    for name in ("constant", "constant_pretrained"):
        lrs = ff.profiles.regime_learning_rates(name, ["fedavg", "fedfrozen"])
        for m, t0 in (("fedavg", base["warmup_rounds"]), ("fedfrozen", 30), ("fedfrozen", 60)):
            nb04 = ff.Config(method=m, seed=3, **ff.profiles.dirichlet_fields(0.05),
                             **{**base, **ff.profiles.regime_fields(name), "lr": lrs[m], "warmup_rounds": t0})
            assert nb04.min_client_samples == 1 and config_key(nb04) in keys, (name, m, t0)


def test_dirichlet_fields_allow_one_image_only_below_alpha_0_1():
    assert ff.profiles.dirichlet_fields(0.1) == {"partition": "dirichlet", "alpha": 0.1}
    assert ff.profiles.dirichlet_fields(0.05) == {"partition": "dirichlet", "alpha": 0.05, "min_client_samples": 1}
