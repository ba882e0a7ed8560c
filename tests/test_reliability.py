"""Nothing lost, nothing trusted blindly: bad values refused early and by name, damaged cache entries and
checkpoints recovered, concurrent runs safe, and the command line's errors one line each."""

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import TINY, tiny_config

import fedfrozen as ff
from fedfrozen import cli, experiments, io
from fedfrozen.engine.config import field_type, settings

# --- validation: generated from the field list, so a new field is covered without a new test ------------


def _bad_values(name):
    base, elem, optional = field_type(name)
    bad = {bool: ["false", 1, 0.0], int: [1.5, "3", True, math.nan],
           float: [math.nan, math.inf, -math.inf, "0.1", True],
           str: [3, b"x"], dict: [[1], "a=1"], tuple: [5, [object()]]}[base]
    if not optional:
        bad = [*bad, None]
    return bad


CASES = [(name, v) for name, _, _ in settings() for v in _bad_values(name)]  # fields and component settings


def _case_id(name, value) -> str:
    """A stable test id (pytest-xdist requires every worker to collect the same ids: no object addresses)."""
    text = repr(value)
    return f"{name}={'[object]' if ' object at 0x' in text else text}"


@pytest.mark.parametrize("name, value", CASES, ids=[_case_id(n, v) for n, v in CASES])
def test_every_field_refuses_a_bad_value_by_name(name, value):
    if value == math.inf and name in ("freeze_tau", "freeze_rho"):  # the thresholds' documented limits
        assert getattr(ff.Config(**{name: value}), name) == math.inf
        return
    with pytest.raises(ValueError, match=rf"^{name} must"):
        ff.Config(**{name: value})


def test_every_field_is_declared_with_its_help_and_its_check():
    """Config's fields and the components' settings are declared once (methods/settings.setting): a help text (the
    CLI's --help) and, beyond the type, a range for every number and choices for every string but the free-text
    ones."""
    from fedfrozen.engine.config import FREE_TEXT

    for name, meta, _ in settings():
        base, elem, _ = field_type(name)
        assert meta.get("help"), f"{name} has no help text"
        if base in (int, float):
            assert meta["lo"] is not None or meta["hi"] is not None, f"{name} has no range"
        if base is str or elem is str:
            assert meta["choices"] is not None or name in FREE_TEXT, f"{name} has no choices"
    assert set(FREE_TEXT) <= {f.name for f in dataclasses.fields(ff.Config)}
    run_help = cli.build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    assert "bfloat16 autocast (GPU only)" in run_help  # --amp's help is its declared text


def test_a_config_is_a_value():
    """Once made, a Config does not change (it would run under its old cache key): an assignment, a field's or a
    component setting's, is refused and names cfg.replace; copies (replace, deepcopy, pickle) are values too."""
    import copy
    import pickle

    cfg = ff.Config(method="fedprox", rounds=2, n_clients=4)
    for name, value in (("lr", 0.5), ("prox_mu", 50.0), ("components", {}), ("anything_new", 1)):
        with pytest.raises(AttributeError, match=rf"cfg\.replace\({name}="):
            setattr(cfg, name, value)
    with pytest.raises(AttributeError, match="replace"):
        del cfg.lr
    assert cfg == ff.Config(method="fedprox", rounds=2, n_clients=4) and cfg.prox_mu == 0.01
    changed = cfg.replace(prox_mu=50.0)
    assert changed.prox_mu == 50.0 and experiments.config_key(changed) != experiments.config_key(cfg)
    for twin in (copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg)), dataclasses.replace(cfg)):
        assert twin == cfg
        with pytest.raises(AttributeError, match="replace"):
            twin.lr = 1.0


def test_a_config_changed_behind_its_back_is_checked_again_before_any_work(monkeypatch):
    cfg = tiny_config()
    object.__setattr__(cfg, "lr", math.nan)  # past the refusal: run still validates before any work
    monkeypatch.setattr(ff.data, "load", lambda *a, **k: pytest.fail("data loaded before validation"))
    with pytest.raises(ValueError, match="lr must be a finite number"):
        ff.run(cfg, progress=False)


def _other_values(name, default, meta):
    """Values of setting `name` other than its default, to try in turn (the first valid one is used)."""
    from fedfrozen.engine.config import field_type

    base, elem, optional = field_type(name)
    choices = meta.get("choices")
    choices = choices() if callable(choices) else choices
    special = {"dataset": ["fashion_mnist", "cifar10"], "model": ["linear_vit", "vit_fmnist"],
               "init": ["pretrained", "public"], "model_kwargs": [{"depth": 2}], "method": ["fedfrozen", "fedprox"],
               "freeze": [("qk", "v"), ("v",)], "method_args": [], "local_steps": [3], "local_epochs": [2],
               "data_root": ["elsewhere"]}
    if name in special:
        return special[name]
    if base is bool:
        return [not default] if default is not None else [True, False]
    if choices:
        return [c for c in choices if c != default]
    lo, hi = meta.get("lo"), meta.get("hi")
    if base is int:
        start = default if default is not None else (lo or 1)
        return [v for v in (start + 1, start + 2, 5, 50) if (lo is None or v >= lo) and v != default]
    if base is float:
        start = default if default is not None else 0.5
        vals = [start * 0.5 if start else 0.05, start * 2 if start else 0.2, 0.3]
        return [v for v in vals if (lo is None or v > lo) and (hi is None or v <= hi) and v != default]
    return []


# settings that need another to change with them (their own value alone is refused or means nothing): the other
ALONG = {"clients_per_round": {"n_clients": 20}, "classes_per_client": {"partition": "shards"},
         "min_samples_by": {"alpha": 0.5}, "init": {"train_subset": 500, "public_fraction": 0.2,
                                                     "server_pretrain_epochs": 1},
         "server_pretrain_epochs": {"init": "public", "public_fraction": 0.2, "server_pretrain_epochs": 1},
         "participation_rate": {"participation": "skewed"},
         "participation_skew": {"participation": "skewed"}, "public_fraction": {}, "amp": {"device": "cuda"},
         "pretrain_task": {"init": "pretrained", "train_subset": 500},
         "pretrain_epochs": {"init": "pretrained", "train_subset": 500},
         "pretrain_seed": {"init": "pretrained", "train_subset": 500},
         "shift_groups": {"shift": "rotation", "n_clients": 20}}


def test_two_configs_that_run_differently_never_share_a_key():
    """Every setting, fields and components alike: a Config that differs from the default in it alone (or with what it
    needs beside it) has another cache key; only where the data is found (WHERE_FIELDS) leaves the key as it is."""
    from fedfrozen.engine.config import WHERE_FIELDS, settings

    key = experiments.config_key
    untried = []
    for name, meta, default in settings():
        along = ALONG.get(name, {})
        base = ff.Config().replace(**along)
        made = None
        for value in _other_values(name, default, meta):
            try:  # (local_steps replaces local_epochs: the two are given together)
                made = base.replace(**{name: value}, **({"local_epochs": None} if name == "local_steps" else {}))
            except ValueError:
                continue
            if getattr(made, name) != getattr(base, name):
                break
            made = None
        if made is None:
            untried.append(name)
            continue
        if name in WHERE_FIELDS:
            assert key(made) == key(base), name
        else:
            assert key(made) != key(base), f"{name}={getattr(made, name)!r} runs differently under the same key"
    assert untried == ["method_args"], untried  # a method's own settings: test_settings, by method


def test_one_run_has_one_key():
    key = experiments.config_key
    assert key(ff.Config(lr=1)) == key(ff.Config(lr=1.0))
    assert key(ff.Config(n_clients=20, clients_per_round=20)) == key(ff.Config(n_clients=20))
    assert ff.Config(freeze="qk").freeze == ("qk",) == ff.Config(freeze=["qk"]).freeze
    assert ff.Config(method="fedslm", method_args={"ranks": [4, 8]}).method_args == {"ranks": (4, 8)}


def test_values_that_change_the_run_silently_are_said_or_refused():
    with pytest.warns(UserWarning, match=r"warmup_rounds \(3\) >= rounds \(3\).*'fedfrozen'"):
        ff.run(tiny_config(method="fedfrozen", warmup_rounds=3, rounds=3), progress=False)
    assert tiny_config(method="fedavg", warmup_rounds=3, rounds=3).warnings() == []
    with pytest.raises(ValueError, match="patch_size 3 does not divide the 8-pixel images"):
        ff.run(tiny_config(model_kwargs={**TINY, "patch_size": 3}), progress=False)


def test_an_init_file_that_is_not_a_checkpoint_is_named(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_text("not a checkpoint")
    with pytest.raises(ValueError, match="init: .*junk.pt.* is not a torch state_dict"):
        ff.run(tiny_config(init=str(junk)), progress=False)
    wrong = tmp_path / "wrong.pt"
    torch.save({"head.weight": torch.zeros(3, 3)}, wrong)
    with pytest.raises(ValueError, match="init: .*wrong.pt.* does not fit the model"):
        ff.run(tiny_config(init=str(wrong)), progress=False)


def test_run_many_refuses_bad_workers(tmp_path):
    with pytest.raises(ValueError, match="workers must be an integer >= 1"):
        ff.run_many([tiny_config()], root=tmp_path, workers=-1)


def test_an_unwritable_results_root_is_found_before_training(tmp_path, monkeypatch):
    monkeypatch.setattr(experiments, "run", lambda *a, **k: pytest.fail("trained before the root was checked"))
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(ValueError, match="results root .* is not a writable folder"):
        ff.run_or_load(tiny_config(), root=afile, progress=False)


# --- the cache verifies what it serves -----------------------------------------------------------------


def _entry(tmp_path, cfg):
    return tmp_path / "t" / experiments.config_key(cfg)


def _redigest(folder):
    digest = experiments._digest(folder)
    (folder / "digest.json").write_text(json.dumps(digest))


def _short(folder):  # a consistent-looking entry with 2 of 3 rows (digest rewritten to match)
    d = json.loads((folder / "history.json").read_text())
    d["rows"] = d["rows"][:2]
    (folder / "history.json").write_text(json.dumps(d))
    _redigest(folder)


def _malformed_rows(folder):
    d = json.loads((folder / "history.json").read_text())
    d["rows"] = ["a", 1, None]
    (folder / "history.json").write_text(json.dumps(d))
    _redigest(folder)


def _history_is_a_folder(folder):
    (folder / "history.json").unlink()
    (folder / "history.json").mkdir()


def _edited_env(folder):
    (folder / "env.json").write_text("{}")


def _no_digest(folder):
    (folder / "digest.json").unlink()


def _entry_is_a_file(folder):
    import shutil

    shutil.rmtree(folder)
    folder.write_text("x")


DAMAGE = [_short, _malformed_rows, _history_is_a_folder, _edited_env, _no_digest, _entry_is_a_file]


@pytest.mark.parametrize("damage", DAMAGE, ids=[d.__name__.strip("_") for d in DAMAGE])
def test_a_damaged_entry_is_moved_aside_and_trained_again(tmp_path, damage):
    cfg = tiny_config(rounds=3)
    first = ff.run_or_load(cfg, root=tmp_path, experiment="t", progress=False)
    folder = _entry(tmp_path, cfg)
    damage(folder)
    with pytest.warns(RuntimeWarning, match=f"cached result {folder}: .*moved it to"):
        again = ff.run_or_load(cfg, root=tmp_path, experiment="t", progress=False)
    assert not again.cached and again.same_as(first)
    assert len([p for p in folder.parent.iterdir() if ".corrupt-" in p.name]) == 1
    assert ff.run_or_load(cfg, root=tmp_path, experiment="t", progress=False).cached


def _truncate(ckpt):
    ckpt.write_bytes(ckpt.read_bytes()[:100])


def _empty(ckpt):
    ckpt.write_bytes(b"")


def _missing_keys(ckpt):
    state = torch.load(ckpt, weights_only=True)
    del state["method"]
    torch.save(state, ckpt)


def _cut_short(ckpt):
    state = torch.load(ckpt, weights_only=True)
    state["rows"] = state["rows"][:1]
    torch.save(state, ckpt)


CKPT_DAMAGE = [_truncate, _empty, _missing_keys, _cut_short]


@pytest.mark.parametrize("damage", CKPT_DAMAGE, ids=[d.__name__.strip("_") for d in CKPT_DAMAGE])
def test_a_damaged_checkpoint_is_moved_aside_and_the_run_starts_over(tmp_path, damage):
    cfg = tiny_config(rounds=3)
    reference = ff.run(cfg, progress=False)
    ckpt = experiments.partial_checkpoint(cfg, tmp_path, "t")
    ff.run(cfg, callbacks=[lambda r, row, h: r == 1], checkpoint=ckpt, progress=False)  # stopped after round 1
    damage(ckpt)
    with pytest.warns(RuntimeWarning, match=f"checkpoint {ckpt.parent}: .*starting this run from scratch"):
        hist = ff.run_or_load(cfg, root=tmp_path, experiment="t", progress=False)
    assert hist.same_as(reference) and hist.resumed_from is None
    assert not ckpt.parent.exists()


def test_leftovers_of_a_killed_write_are_cleared(tmp_path):
    cfg = tiny_config(rounds=1)
    stale = tmp_path / "t" / f".{experiments.config_key(cfg)}.x1y2z3"
    stale.mkdir(parents=True)
    (stale / "history.json").write_text("{")
    ff.run_or_load(cfg, root=tmp_path, experiment="t", progress=False)
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == [experiments.config_key(cfg)]


def test_entries_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        ff.run_or_load(tiny_config(rounds=1), root=tmp_path, experiment="t", progress=False)
    finally:
        os.umask(old)
    entry = next((tmp_path / "t").iterdir())
    assert entry.stat().st_mode & 0o777 == 0o755
    assert all(f.stat().st_mode & 0o777 == 0o644 for f in entry.iterdir())


# --- concurrency ---------------------------------------------------------------------------------------

_RUN = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    from conftest import tiny_config
    import fedfrozen as ff
    h = ff.run_or_load(tiny_config(rounds=3), root={root!r}, experiment="t", progress=False)
    print(json.dumps({{"cached": h.cached, "rows": h.without_wall_clock()}}))
""")


def test_two_processes_with_one_config_train_it_once(tmp_path):
    code = _RUN.format(tests=str(Path(__file__).parent), root=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    results = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    assert sorted(r["cached"] for r in results) == [False, True]  # one trained, the other waited and loaded
    assert results[0]["rows"] == results[1]["rows"]


_WRITES = textwrap.dedent("""
    import sys
    from pathlib import Path
    from fedfrozen.base.io import atomic_dir
    for i in range(300):
        atomic_dir(Path({folder!r}), lambda tmp: (tmp / "history.json").write_text("x" * 1000 + str(i)))
""")


def test_concurrent_final_writes_never_fail(tmp_path):
    folder = tmp_path / "entry"
    code = _WRITES.format(folder=str(folder))
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for e in errs]
    assert (folder / "history.json").read_text().startswith("x" * 1000)
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]  # no temporary folder outlives the writes


def test_a_second_process_can_refuse_to_wait(tmp_path):
    cfg = tiny_config(rounds=1)
    lock = tmp_path / "t" / f".{experiments.config_key(cfg)}.lock"
    with io.file_lock(lock):
        with pytest.raises(experiments.RunningElsewhere, match="another process is training this config"):
            ff.run_or_load(cfg, root=tmp_path, experiment="t", progress=False, wait=False)


# --- the command line ----------------------------------------------------------------------------------


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert cli.main(["run", "--config", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"fedfrozen: error: --config {str(tmp_path)!r}: is a directory, not a file"]
    bad = tmp_path / "c.json"
    bad.write_text("{nope")
    assert cli.main(["run", "--config", str(bad), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "c.json" in err[0] and "not valid JSON" in err[0]
    bad.write_text(json.dumps({"download": "false"}))
    assert cli.main(["run", "--config", str(bad), "--out", str(tmp_path)]) == 2
    assert "download must be True or False; got 'false'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["run", "--out", ""])
    assert "must name a folder" in capsys.readouterr().err


def test_every_config_field_has_a_flag_tuples_included():
    parser = cli.build_parser()
    args = parser.parse_args(["run", "--method", "fedslm", "--fedslm-ranks", "4", "8", "--freeze", "qk", "v",
                              "--lr", "0.1"])
    cfg = cli.config_from_args(args)
    assert cfg.method_args == {"ranks": (4, 8)} and cfg.freeze == ("qk", "v") and cfg.lr == 0.1
    run = parser._subparsers._group_actions[0].choices["run"]
    flags = {o for a in run._actions for o in a.option_strings}
    assert all("--" + f.name.replace("_", "-") in flags for f in dataclasses.fields(ff.Config)
               if f.name != "_components")
    assert all("--" + flat.replace("_", "-") in flags for flat in ff.methods.component_settings())


def test_reproduce_with_an_unknown_notebook_creates_nothing(tmp_path, monkeypatch, capsys):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["reproduce", "--profile", "smoke", "--only", "99"]) == 2
    assert "no notebook numbered" in capsys.readouterr().err and not (tmp_path / "runs").exists()


def test_select_lr_end_to_end(tmp_path, capsys):
    data = tmp_path / "data"
    ff.data.write_fake_cifar("cifar10", data, per_class=10, test_per_class=2)
    settings = tmp_path / "small.json"
    settings.write_text(json.dumps(dict(data_root=str(data), download=False, model_kwargs=TINY, n_clients=4,
                                        clients_per_round=2, batch_size=8, local_steps=1, local_epochs=None,
                                        eval_every=1, augment=False)))
    out = tmp_path / "results"
    assert cli.main(["select-lr", "--methods", "fedavg", "--rounds", "2", "--grid", "1e-3", "1e-2",
                     "--out", str(out), "--config", str(settings)]) == 0
    written = json.loads((out / "cifar10" / "paper_lr.json").read_text())
    assert written["lr"]["fedavg"] in (1e-3, 1e-2) and set(written["val_acc"]["fedavg"]) == {"0.001", "0.01"}
    assert "written to" in capsys.readouterr().out


def test_threads_are_set_by_flag_or_environment(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setenv(io.THREADS_ENV, "1")
    try:
        ff.run(tiny_config(rounds=1), progress=False)
        assert torch.get_num_threads() == 1
        monkeypatch.setenv(io.THREADS_ENV, "many")
        with pytest.raises(ValueError, match="FEDFROZEN_THREADS must be an integer >= 1; got 'many'"):
            ff.run(tiny_config(rounds=1), progress=False)
        monkeypatch.delenv(io.THREADS_ENV)
        assert cli.main(["methods"]) == 0 and os.environ[io.THREADS_ENV] == "1"  # the command line's default
        assert cli.main(["--threads", "2", "methods"]) == 0 and os.environ[io.THREADS_ENV] == "2"
    finally:
        torch.set_num_threads(before)
        os.environ.pop(io.THREADS_ENV, None)


def test_a_notebooks_thread_count_reaches_the_processes_it_starts(monkeypatch):
    """use_threads (every notebook's first cell) puts its count in FEDFROZEN_THREADS, and follow_threads (fedfrozen.run,
    the Flower apps) takes it: a Flower deployment started from a notebook sums as the notebook's own loop does, so
    notebook 08's Flower run equals its fedfrozen.run (its floating-point sums depend on the thread count)."""
    before = torch.get_num_threads()
    monkeypatch.delenv(io.THREADS_ENV, raising=False)
    try:
        assert io.use_threads() == 1 and os.environ[io.THREADS_ENV] == "1" and torch.get_num_threads() == 1
        monkeypatch.setenv(io.THREADS_ENV, "2")  # what a started process finds in its environment
        io.follow_threads()
        assert torch.get_num_threads() == 2
        monkeypatch.delenv(io.THREADS_ENV)
        io.follow_threads()  # unset: left as it is
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
        os.environ.pop(io.THREADS_ENV, None)


def test_a_failed_download_is_one_clear_error(tmp_path, monkeypatch):
    from fedfrozen import data

    def offline(*a, **k):
        raise OSError("Name or service not known")

    monkeypatch.setattr(data, "_open_torchvision", offline)
    with pytest.raises(ValueError, match=r"dataset 'cifar10' at .*: download failed \(OSError: Name or service"):
        data.load("cifar10", root=str(tmp_path), download=True)


def test_select_lr_at_the_cpu_profile_prints_each_arm_and_writes_nothing(tmp_path, capsys):
    """`fedfrozen select-lr --profile cpu` (was tools/select_cpu_lr.py): AdamW arms and `<method>:sgd` arms, each
    by the one rule; the cpu profile's rates live in profiles.CPU_LR, so nothing is written but the runs' cache."""
    small = tmp_path / "small.json"
    small.write_text(json.dumps(dict(dataset="digits", model="vit_digits", model_kwargs=TINY, n_clients=4,
                                     clients_per_round=2, batch_size=8, local_steps=1, local_epochs=None,
                                     eval_every=1, eval_window=0)))
    out = tmp_path / "results"
    assert cli.main(["select-lr", "--profile", "cpu", "--methods", "fedavg", "fedavg:sgd", "--rounds", "2",
                     "--grid", "1e-3", "1e-2", "--out", str(out), "--config", str(small)]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"^cpu fedavg +-> (0\.001|0\.01) ", printed, re.M)
    assert re.search(r"^cpu fedavg:sgd +-> (0\.001|0\.01) ", printed, re.M)
    assert not list(out.rglob("paper_lr.json")) and list(out.rglob("history.json"))
    assert cli.main(["select-lr", "--regime", "constant"]) == 2  # a cpu setting asked of the paper profile
    assert "--regime is a setting of the cpu profile" in capsys.readouterr().err
