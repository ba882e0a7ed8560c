"""`fedfrozen budget` (fedfrozen.runs.timing): how long the notebooks take from an empty cache, each run counted for
the first notebook that uses it, as recorded and at the idle machine's rates."""

from __future__ import annotations

import json

import nbformat
import pytest

from fedfrozen import cli
from fedfrozen.runs import timing


def test_a_run_logged_twice_counts_once_at_its_longer_time(tmp_path):
    log = tmp_path / "log.jsonl"
    lines = [dict(experiment="e", key="a" * 12, cached=False, seconds=10.0),  # the worker that trained it
             dict(experiment="e", key="a" * 12, cached=True, seconds=9.5),   # its parent, which loaded it
             dict(experiment="e", key="b" * 12, cached=True, seconds=4.0)]
    log.write_text("\n".join(json.dumps(x) for x in lines))
    runs, trained = timing.runs_of(log)
    assert runs == {("e", "a" * 12): 10.0, ("e", "b" * 12): 4.0} and trained == 1
    assert timing.runs_of(tmp_path / "none.jsonl") == ({}, 0)


def test_the_idle_estimate_is_rounds_times_the_round_and_epoch_rates(tmp_path, monkeypatch):
    monkeypatch.setattr(timing, "results_root", lambda root=None: tmp_path)
    for key, cfg in (("a" * 12, dict(rounds=120, local_epochs=5, model="vit_fmnist_w48")),
                     ("b" * 12, dict(rounds=100, local_steps=12, local_epochs=None, model="cait_xxs24_224"))):
        (tmp_path / "e" / key).mkdir(parents=True)
        (tmp_path / "e" / key / "config.json").write_text(json.dumps({"config": cfg}))
    assert timing.idle_seconds("e", "a" * 12) == pytest.approx(120 * (timing.IDLE_ROUND + 5 * timing.IDLE_EPOCH))
    train, evaluate = timing.MODEL_COST["cait_xxs24_224"]
    assert timing.idle_seconds("e", "b" * 12) == pytest.approx(
        100 * (timing.IDLE_ROUND * evaluate + timing.IDLE_EPOCH * 2 * train))  # 12 steps: two of the profile's epochs


def _notebook(path, seed):
    code = ("import fedfrozen as ff\n"
            "cfg = ff.Config(dataset='digits', model='vit_digits', model_kwargs=dict(embed_dim=16, depth=1, "
            "num_heads=2), n_clients=4, clients_per_round=2, rounds=2, local_steps=1, local_epochs=None, "
            f"batch_size=8, eval_every=1, seed={seed})\n"
            "ff.run_or_load(cfg, experiment='t', progress=False)")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)]), path)


def test_each_run_counts_for_the_first_notebook_that_uses_it(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "notebooks").mkdir()
    first, second = tmp_path / "notebooks" / "01_a.ipynb", tmp_path / "notebooks" / "02_b.ipynb"
    _notebook(first, 0)
    _notebook(second, 0)  # the same run: loaded from the cache, already counted
    monkeypatch.chdir(tmp_path)
    rows = []
    got = timing.measure([first, second], workers=1, print_row=rows.append)
    one, two = (r.split() for r in rows[1:3])
    assert one[:4] == ["01_a", "1", "1", "1"] and two[:4] == ["02_b", "1", "0", "0"]  # runs, new, trained now
    assert got["all"][0] > 0 and got["paper"] == (0.0, 0.0)  # neither is a paper notebook
    assert not (tmp_path / "figures").exists()  # a timing writes no figures/


def test_bad_input_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    with pytest.raises(ValueError, match="workers must be an integer >= 1; got 0"):
        timing.measure([], workers=0)
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path)
    assert cli.main(["budget", "--only", "99"]) == 2
    assert "no notebook numbered" in capsys.readouterr().err
