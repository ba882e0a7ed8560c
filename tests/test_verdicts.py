"""The committed verdicts follow from the committed per-seed data (issue: verdicts a reviewer accepts): every
verdict table of the claim notebooks is recomputed from its per-seed table, and each is judged as its own family."""

from pathlib import Path

import pandas as pd
import pytest

import fedfrozen as ff

FIGURES = Path(__file__).resolve().parents[1] / "figures"




def _runs_of(table: str) -> str:
    """The per-seed table a verdict table follows from: its own name's, or for NN_secondary (a notebook's secondary
    measures, judged apart: docs/claims.md) and NN_sensitivity (its comparisons at a rate the rule did not choose)
    the notebook's."""
    return table.removesuffix("_secondary").removesuffix("_sensitivity")


TABLES = sorted(p.name[: -len("_verdicts.csv")] for p in FIGURES.glob("*_verdicts.csv")
                if (FIGURES / f"{_runs_of(p.name[: -len('_verdicts.csv')])}_per_seed.csv").exists())
# every per-seed table with its configs (notebook 03's controlled cells have their own: 03_controls)
RUNS = sorted(p.name[: -len("_configs.jsonl")] for p in FIGURES.glob("[0-9][0-9]*_configs.jsonl"))


def test_every_claim_notebook_commits_its_tables():
    assert {"03", "03_controls", "04", "05", "06", "06_drift", "09", "10", "11", "14", "14_drift",
            "14_secondary"} <= set(TABLES)
    assert {"02", "03", "03_controls", "04", "05", "06", "09", "10", "11"} <= set(RUNS)


@pytest.mark.parametrize("nb", TABLES)
def test_the_per_seed_table_reproduces_the_committed_verdict_table(nb):
    verdicts = pd.read_csv(FIGURES / f"{nb}_verdicts.csv", index_col=0)
    runs = pd.read_csv(FIGURES / f"{_runs_of(nb)}_per_seed.csv", index_col=0)
    assert runs["key"].str.fullmatch(r"[0-9a-f]{12}").all()  # every row is a run of the cache
    again = ff.tables.recompute(verdicts, runs)
    numeric = ["mean_a", "mean_b", "d", "half_width", "n", "p", "p_holm", "detectable"]
    pd.testing.assert_frame_equal(again[numeric], verdicts[numeric].reset_index(drop=True), rtol=1e-5, atol=1e-9)
    assert again["verdict"].tolist() == verdicts["verdict"].tolist()
    assert again["verdict_holm"].tolist() == verdicts["verdict_holm"].tolist()


@pytest.mark.parametrize("nb", RUNS)
def test_every_committed_run_has_its_config_and_machine(nb):
    """figures/NN_configs.jsonl holds the full Config of every row of NN_per_seed.csv (so any row can be retrained
    exactly: `fedfrozen verify`), each hashing to its row's cache key; every row names its machine."""
    import json

    runs = pd.read_csv(FIGURES / f"{nb}_per_seed.csv", index_col=0)
    lines = [json.loads(line) for line in (FIGURES / f"{nb}_configs.jsonl").read_text().splitlines() if line]
    configs = {e["key"]: ff.Config.from_dict(e["config"]) for e in lines}
    assert len(configs) == len(lines), "one line per run"
    assert set(runs["key"]) == set(configs), "the configs are exactly the table's runs"
    for key, cfg in configs.items():
        assert ff.experiments.config_key(cfg) == key
    assert runs["machine"].str.fullmatch(r"[0-9a-f]{8}|" + ff.tables.UNRECORDED).all()
    # every setting two rows may differ in is a column, and it is the config's
    for row in runs.itertuples(index=False):
        want = ff.tables.settings_of(configs[row.key])
        for name in ("lr", "lr_schedule", "init", "local_epochs", "pretrain_task", "pretrain_seed", "seed"):
            got = getattr(row, name)
            assert (pd.isna(got) and want[name] is None) or got == want[name], (nb, row.key, name, got, want[name])


@pytest.mark.parametrize("name, nb", [("03_spread", "03"), ("03_controls_spread", "03_controls")])
def test_the_spread_family_follows_from_the_per_seed_table(name, nb):
    """C1's stability over seeds (figures/03_spread.csv and, for the controlled cells, 03_controls_spread.csv:
    Pitman–Morgan, each its own Holm family) is recomputed from the committed runs, every cell with 15 seeds."""
    table = pd.read_csv(FIGURES / f"{name}.csv", index_col=0)
    runs = pd.read_csv(FIGURES / f"{nb}_per_seed.csv", index_col=0)
    assert len(table) >= 3 and (table["n"] >= 15).all()
    again = ff.tables.recompute_spread(table, runs)
    numeric = ["sd_a", "sd_b", "ratio", "r", "p", "n", "p_holm"]
    pd.testing.assert_frame_equal(again[numeric], table[numeric].reset_index(drop=True), rtol=1e-5, atol=1e-9,
                                  check_dtype=False)
    assert again["verdict_holm"].tolist() == table["verdict_holm"].tolist()


def test_the_rate_sensitivity_follows_from_the_controlled_runs():
    """figures/03_rate_sensitivity_verdicts.csv (C1 pretrained, a body per seed, both arms at each rate: its own family)
    is recomputed from notebook 03's controlled runs; every rate of the cell is there, on the same seeds."""
    table = pd.read_csv(FIGURES / "03_rate_sensitivity_verdicts.csv", index_col=0)
    runs = pd.read_csv(FIGURES / "03_controls_per_seed.csv", index_col=0)
    assert len(table) == len(ff.controls.RATES) and table["n"].nunique() == 1
    again = ff.tables.recompute(table, runs)
    numeric = ["mean_a", "mean_b", "d", "half_width", "n", "p", "p_holm", "detectable"]
    pd.testing.assert_frame_equal(again[numeric], table[numeric].reset_index(drop=True), rtol=1e-5, atol=1e-9)
    assert again["verdict_holm"].tolist() == table["verdict_holm"].tolist()
