"""`fedfrozen verify`: committed runs retrained on this machine, each sampled comparison re-judged on the same seeds.

The committed tables here are a tiny notebook's ("99") written by this process: on this machine they must come back
bit-identical and every comparison agree; tables edited after the fact must be caught."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pandas as pd
import pytest

import fedfrozen as ff
from fedfrozen.studies.verification import agrees

TINY = dict(dataset="digits", model="vit_digits", model_kwargs=dict(embed_dim=16, depth=2, num_heads=2), n_clients=4,
            clients_per_round=2, rounds=3, local_steps=2, batch_size=16, partition="dirichlet", alpha=0.5,
            warmup_rounds=1, eval_every=1, eval_window=2, device="cpu", engine="sequential")
SEEDS = (0, 1, 2)


def write_notebook_tables(folder, root, cfgs, machine=None):
    """figures/99_{per_seed.csv,verdicts.csv,configs.jsonl} as a notebook writes them (save_per_seed's format)."""
    hists = ff.run_many(cfgs, root=root, experiment="tiny", workers=1, progress=False)
    runs = ff.tables.summarise(cfgs, hists)
    if machine is not None:
        runs["machine"] = machine
    stats = ff.tables.mean_std(runs, ["method"], ["late_acc", "final_acc"])
    verdicts = ff.tables.verdict_table([
        ("C1", "FedFrozen − FedAvg", ff.tables.compare(stats, "fedfrozen", "fedavg", "late_acc")),
        ("C1", "FedFrozen − FedAvg, final", ff.tables.compare(stats, "fedfrozen", "fedavg", "final_acc"), "final_acc")])
    folder.mkdir(parents=True, exist_ok=True)
    verdicts.to_csv(folder / "99_verdicts.csv", float_format=ff.plots.TABLE_FLOAT_FORMAT)
    ff.tables.per_seed(runs).to_csv(folder / "99_per_seed.csv", float_format=ff.plots.PRECISE_FLOAT_FORMAT)
    lines = [json.dumps({"key": k, "experiment": ff.experiments.asked(k)[0],
                         "config": ff.experiments.asked(k)[1].to_dict()}) for k in dict.fromkeys(runs["key"])]
    (folder / "99_configs.jsonl").write_text("\n".join(lines) + "\n")
    return runs


def copy_tables(folder, dest):
    """A copy of the committed tables in `dest` (a test edits its copy, never the fixture's)."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in (folder / "figures").iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    return dest


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("project")
    cfgs = [ff.Config(method=m, seed=s, **TINY) for m in ("fedavg", "fedfrozen") for s in SEEDS]
    runs = write_notebook_tables(folder / "figures", folder / "committed-results", cfgs)
    return folder, runs


def test_agreement_rule():
    assert agrees(-0.010, 0.003, -0.004, 0.006)  # same sign, 0.006 apart within hypot(0.003, 0.006) = 0.0067
    assert not agrees(-0.010, 0.003, -0.001, 0.006)  # 0.009 apart: beyond 0.0067
    assert not agrees(-0.010, 0.003, +0.002, 0.020)  # resolved lower there, the other sign here
    assert agrees(-0.002, 0.010, +0.003, 0.010)  # neither resolved: the sign is noise; 0.005 apart within 0.014
    assert math.isclose(math.hypot(0.003, 0.004), 0.005)


def test_the_sample_takes_comparisons_by_priority_within_the_budget(committed):
    folder, _ = committed
    p = ff.verification.plan("99", runs=1, seeds=3, figures=folder / "figures")
    assert p.seeds == list(SEEDS) and len(p.configs) == 6  # both arms on three seeds; the second row's runs are free
    assert list(p.verdicts["measure"]) == ["late_acc", "final_acc"]
    assert p.cost == pytest.approx(6 * 3 * 2 / 6 / 120)  # two local steps a round over a nominal six, 3 of 120 rounds
    with pytest.raises(ValueError, match="no comparison with 4 shared seeds"):
        ff.verification.plan("99", seeds=4, figures=folder / "figures")


def test_runs_of_this_machine_come_back_bit_identical_and_every_comparison_agrees(committed, tmp_path):
    folder, runs = committed
    assert runs["machine"].nunique() == 1 and runs["machine"].iloc[0] == ff.io.machine_id()
    report = ff.verify("99", root=tmp_path, workers=1, progress=False, figures=folder / "figures")
    assert report.ok and report.comparisons["agrees"].all()
    assert report.runs["same_machine"].all() and report.runs["identical"].all()
    c = report.comparisons.iloc[0]
    assert c.d_here == c.d_committed and c.half_here == c.half_committed  # same machine: the same digits
    text = str(report)
    assert "6 runs were committed by a machine with this signature: all bit-identical" in text
    assert "verify 99: ok (2 of 2 comparisons agree)" in text
    assert list(tmp_path.glob("tiny/*/history.json"))  # retrained into the root it was given, not the committed one


def test_an_edited_table_is_caught(committed, tmp_path):
    edited = copy_tables(committed[0], tmp_path / "figures")
    runs = pd.read_csv(edited / "99_per_seed.csv", index_col=0)
    runs.loc[runs["method"] == "fedfrozen", "late_acc"] += 0.3  # FedFrozen "wins" by 30 points on paper
    runs.to_csv(edited / "99_per_seed.csv", float_format=ff.plots.PRECISE_FLOAT_FORMAT)
    report = ff.verify("99", root=tmp_path / "results", workers=1, progress=False, figures=edited)
    assert not report.ok
    late = report.comparisons.set_index("measure").loc["late_acc"]
    assert not late.agrees and late.d_committed > 0.2
    assert report.comparisons.set_index("measure").loc["final_acc", "agrees"]  # the untouched measure still agrees
    assert not report.runs.loc[report.runs["method"] == "fedfrozen", "identical"].any()
    text = str(report)
    assert "DISAGREES" in text and "3 DIFFER" in text and "verify 99: FAILED" in text


def test_rows_of_an_unrecorded_machine_are_judged_by_verdict_only(committed, tmp_path):
    other = copy_tables(committed[0], tmp_path / "figures")
    runs = pd.read_csv(other / "99_per_seed.csv", index_col=0).assign(machine=ff.tables.UNRECORDED)
    runs.to_csv(other / "99_per_seed.csv", float_format=ff.plots.PRECISE_FLOAT_FORMAT)
    report = ff.verify("99", root=tmp_path / "results", workers=1, progress=False, figures=other)
    assert report.ok and not report.runs["same_machine"].any()
    assert "compared by verdict, not digits" in str(report)


def test_bad_arguments_are_refused_before_any_training(committed, tmp_path):
    folder, _ = committed
    for bad in ("4", "03-controls", "03_Controls"):
        with pytest.raises(ValueError, match="only: a notebook number"):
            ff.verify(bad, figures=folder / "figures", root=tmp_path)
    with pytest.raises(ValueError, match=r"notebook 98_controls has no 98_controls_verdicts.csv"):
        ff.verify("98_controls", figures=folder / "figures", root=tmp_path)
    with pytest.raises(ValueError, match=r"notebook 98 has no 98_verdicts.csv, 98_per_seed.csv, 98_configs.jsonl"):
        ff.verify("98", figures=folder / "figures", root=tmp_path)
    for name, kwargs in (("runs", dict(runs=0)), ("seeds", dict(seeds=1)), ("runs", dict(runs=True)),
                         ("seeds", dict(seeds=2.5))):
        with pytest.raises(ValueError, match=f"{name} must be"):
            ff.verify("99", figures=folder / "figures", root=tmp_path, **kwargs)
    assert not (tmp_path / "tiny").exists()


def test_the_command_exits_0_when_every_comparison_agrees(committed, tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    copy_tables(committed[0], tmp_path / "figures")
    # the committed rows were computed in this process on its thread count: verify on the same count
    env = {**os.environ, "FEDFROZEN_THREADS": str(__import__("torch").get_num_threads())}
    done = subprocess.run([sys.executable, "-m", "fedfrozen", "verify", "--only", "99", "--workers", "1", "--quiet"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "retraining 6 committed runs" in done.stdout and "verify 99: ok" in done.stdout
    assert "all bit-identical" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "fedfrozen", "verify", "--only", "7"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "only: a notebook number" in bad.stderr
