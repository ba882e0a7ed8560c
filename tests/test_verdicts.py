"""The committed verdicts follow from the committed per-seed data (issue: verdicts a reviewer accepts): every
verdict table of the claim notebooks is recomputed from its per-seed table, and each is judged as its own family."""

from pathlib import Path

import pandas as pd
import pytest

import fedfrozen as ff

FIGURES = Path(__file__).resolve().parents[1] / "figures"


@pytest.mark.parametrize("nb", ["03", "04", "05", "06", "09", "10", "11"])
def test_the_per_seed_table_reproduces_the_committed_verdict_table(nb):
    verdicts = pd.read_csv(FIGURES / f"{nb}_verdicts.csv", index_col=0)
    runs = pd.read_csv(FIGURES / f"{nb}_per_seed.csv", index_col=0)
    assert runs["key"].str.fullmatch(r"[0-9a-f]{12}").all()  # every row is a run of the cache
    again = ff.tables.recompute(verdicts, runs)
    numeric = ["mean_a", "mean_b", "d", "half_width", "n", "p", "p_holm", "detectable"]
    pd.testing.assert_frame_equal(again[numeric], verdicts[numeric].reset_index(drop=True), rtol=1e-5, atol=1e-9)
    assert again["verdict"].tolist() == verdicts["verdict"].tolist()
    assert again["verdict_holm"].tolist() == verdicts["verdict_holm"].tolist()
