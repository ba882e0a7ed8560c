"""The run cache: corrupt entries, and resuming a run killed mid-way."""

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import TINY, tiny_config

import fedfrozen as ff
from fedfrozen import experiments, io


def test_a_truncated_cached_history_is_moved_aside_and_trained_again(tmp_path):
    cfg = tiny_config(rounds=2)
    first = ff.run_or_load(cfg, root=tmp_path, experiment="t", progress=False)
    hist_file = tmp_path / "t" / experiments.config_key(cfg) / "history.json"
    text = hist_file.read_text()
    hist_file.write_text(text[: len(text) // 2])  # a crash mid-write by some other tool, a bad sync
    with pytest.warns(RuntimeWarning, match=f"{hist_file.parent}: history.json changed since the digest.*moved it to"):
        again = ff.run_or_load(cfg, root=tmp_path, experiment="t", progress=False)
    assert not again.cached and again.same_as(first)
    aside = [p for p in (tmp_path / "t").iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1 and (aside[0] / "history.json").read_text() == text[: len(text) // 2]
    assert ff.run_or_load(cfg, root=tmp_path, experiment="t").cached  # the new entry is good


def test_history_load_names_the_file(tmp_path):
    bad = tmp_path / "history.json"
    bad.write_text('{"rows": [1, 2')
    with pytest.raises(ValueError, match="history.json is not a readable History"):
        ff.History.load(bad)


def _record_starts(monkeypatch, field: str) -> list:
    """A list that gets `field` of each config run_or_load is called with, in order (run_many's workers=1 path)."""
    started = []
    real = experiments.run_or_load

    def spy(cfg, *a, **k):
        started.append(getattr(cfg, field))
        return real(cfg, *a, **k)

    monkeypatch.setattr(experiments, "run_or_load", spy)
    return started


def test_run_many_starts_one_run_per_body_to_be_made_then_the_runs_that_need_none(tmp_path, monkeypatch):
    """Two workers never wait on one pre-trained body: the first run of each body not yet cached starts first, then
    the runs without one, then the other runs of each body (pretrained_state's lock makes them wait)."""
    from fedfrozen import pretrain

    monkeypatch.setattr(pretrain, "cache_dir", lambda: tmp_path / "pretrained")
    pre = dict(init="pretrained", train_subset=1000, pretrain_epochs=1, rounds=1)
    a0, a1 = tiny_config(**pre, seed=0, pretrain_seed=0), tiny_config(**pre, seed=1, pretrain_seed=0)
    b0 = tiny_config(**pre, seed=2, pretrain_seed=1)
    s0, s1 = tiny_config(rounds=1, seed=3), tiny_config(rounds=1, seed=4)
    cfgs = [a0, a1, s0, b0, s1]
    assert experiments._bodies_first(cfgs) == [a0, b0, s0, s1, a1]
    started = _record_starts(monkeypatch, "seed")
    ff.run_many(cfgs, root=tmp_path, experiment="t", workers=1, progress=False)
    assert started[:5] == [0, 2, 3, 4, 1]
    # a body already cached makes nothing: its runs are ordinary runs, in their order
    assert experiments._bodies_first([a1, s0, a0]) == [a1, s0, a0]


def test_run_many_retrains_a_corrupt_entry(tmp_path):
    cfgs = [tiny_config(rounds=1, seed=s) for s in (0, 1)]
    ff.run_many(cfgs, root=tmp_path, experiment="t", workers=1, progress=False)
    (tmp_path / "t" / experiments.config_key(cfgs[1]) / "history.json").write_text("{")
    with pytest.warns(RuntimeWarning, match="history.json changed since the digest"):
        hists = ff.run_many(cfgs, root=tmp_path, experiment="t", workers=1, progress=False)
    assert hists[0].cached and len(hists[1]) == 1


def test_run_many_trains_the_longest_first_and_returns_in_the_given_order(tmp_path, monkeypatch):
    """The missing runs start longest first (a long run left for last would run alone on one core); the Histories
    come back in the order of the configs, each the one run alone gives."""
    cfgs = [tiny_config(rounds=1, seed=0), tiny_config(rounds=3, seed=1), tiny_config(rounds=2, seed=2)]
    started = _record_starts(monkeypatch, "rounds")
    hists = ff.run_many(cfgs, root=tmp_path, experiment="t", workers=1, progress=False)
    assert started[:3] == [3, 2, 1]  # trained longest first (then the three loaded back, in the given order)
    assert [len(h) for h in hists] == [1, 3, 2] and hists[1].same_as(ff.run(cfgs[1], progress=False))


def test_an_interrupted_run_or_load_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    cfg = tiny_config(method="fedfrozen", rounds=4, warmup_rounds=2)
    full = ff.run(cfg, progress=False)
    ckpt = experiments.partial_checkpoint(cfg, tmp_path, "t")
    ff.run(cfg, callbacks=[lambda r, row, h: r == 2], checkpoint=ckpt, progress=False)  # "killed" after round 2
    hist = ff.run_or_load(cfg, root=tmp_path, experiment="t", progress=False)
    assert hist.resumed_from == str(ckpt) and hist.same_as(full)
    assert not ckpt.parent.exists()  # the partial run is cleaned up once the result is stored


def _cli_args(out):
    import json

    return [sys.executable, "-m", "fedfrozen", "run", "--quiet", "--out", str(out), "--checkpoint-seconds", "0",
            "--dataset", "digits", "--model", "vit_digits", "--model-kwargs", json.dumps(TINY), "--n-clients", "4",
            "--rounds", "60", "--local-steps", "2", "--batch-size", "16", "--partition", "dirichlet",
            "--alpha", "0.5", "--method", "fedfrozen", "--warmup-rounds", "30", "--eval-every", "1", "--seed", "0",
            "--device", "cpu"]


def test_fedfrozen_run_killed_with_sigkill_continues_on_rerun_and_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    cfg = tiny_config(method="fedfrozen", rounds=60, warmup_rounds=30)
    ckpt = experiments.partial_checkpoint(cfg, tmp_path, "cli")
    env = {**os.environ, "FEDFROZEN_PROGRESS": "0"}
    proc = subprocess.Popen(_cli_args(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # wait on the event (the first checkpoint written), not on a clock a loaded machine would trip; the deadline
    # only keeps a hung run from hanging the suite
    deadline = time.time() + 1800
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.communicate()}"
    time.sleep(0.3)  # a few rounds further in
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    folder = tmp_path / "cli" / experiments.config_key(cfg)
    assert not folder.exists() and ckpt.exists()  # nothing half-written, the checkpoint kept
    import torch

    done = torch.load(ckpt, weights_only=True)["round"]
    assert 0 < done < cfg.rounds
    out = subprocess.run(_cli_args(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "(resumed)" in out.stdout
    resumed = ff.History.load(folder / "history.json")
    monkeypatch.setenv(io.THREADS_ENV, "1")  # the command line's thread count (float sums differ across counts)
    assert resumed.same_as(ff.run(cfg, progress=False))
