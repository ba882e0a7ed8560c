"""The paper profile: its recipe, learning rates from the paper-scale selection, fake CIFAR, the dry run."""

import json
import math

import pytest
from conftest import TINY, tiny_config

import fedfrozen as ff
from fedfrozen import experiments, profiles, selection


def test_paper_profile_never_reads_digits_selected_rates(tmp_path):
    lrs = profiles.learning_rates(["fedavg", "fedfrozen", "scaffold"], profile="paper", dataset="cifar10",
                                  root=tmp_path)
    assert lrs == dict.fromkeys(["fedavg", "fedfrozen", "scaffold"], profiles.PAPER_DEFAULT_LR)
    assert all(lrs[m] != profiles.SELECTED_LR[m] for m in lrs)
    path = profiles.paper_lr_file("cifar10", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"lr": {"fedavg": 3e-4, "fedfrozen": 3e-3}}))
    lrs = profiles.learning_rates(["fedavg", "fedfrozen", "scaffold"], {"scaffold": 0.5}, profile="paper",
                                  dataset="cifar10", root=tmp_path)
    assert lrs == {"fedavg": 3e-4, "fedfrozen": 3e-3, "scaffold": 0.5}  # selection, then overrides
    assert profiles.learning_rates(["fedavg"], profile="cpu") == {"fedavg": profiles.CPU_LR["fedavg"]}
    path.write_text("{")
    with pytest.raises(ValueError, match="select-lr"):
        profiles.learning_rates(["fedavg"], profile="paper", dataset="cifar10", root=tmp_path)


def test_paper_recipe_is_in_the_profile_and_builds_a_config():
    base = profiles.federated("paper")
    for k, v in profiles.PAPER_RECIPE.items():
        if k != "lr":
            assert base[k] == v
    cfg = ff.Config(method="fedfrozen", **base)
    assert cfg.augment and cfg.grad_clip == 1.0 and cfg.lr_schedule == "cosine" and cfg.weight_decay == 0.05


def test_pick_takes_the_best_and_ties_and_divergence_to_the_smaller_rate():
    assert selection.pick({1e-3: 0.5, 3e-3: 0.6, 3e-4: 0.55}) == 3e-3
    assert selection.pick({1e-3: 0.6, 3e-3: 0.6}) == 1e-3
    assert selection.pick({1e-3: None, 3e-3: float("nan"), 3e-4: 0.1}) == 3e-4
    with pytest.raises(ValueError):
        selection.pick({})


def test_select_learning_rates_runs_the_grid_and_writes_what_the_profile_reads(tmp_path):
    base = dict(tiny_config().to_dict(), rounds=3)
    for k in ("method", "lr", "seed", "partition", "alpha", "warmup_rounds"):
        base.pop(k)
    out = selection.select_learning_rates(["fedavg", "fedfrozen"], grid=[1e-3, 1e-2], rounds=2, root=tmp_path,
                                          workers=1, base=base)
    assert set(out["lr"]) == {"fedavg", "fedfrozen"} and all(v in (1e-3, 1e-2) for v in out["lr"].values())
    for m in out["lr"]:
        accs = {float(k): v for k, v in out["val_acc"][m].items()}
        assert out["lr"][m] == selection.pick(accs)
    with pytest.raises(ValueError, match="rounds"):
        selection.select_learning_rates(["fedavg"], rounds=1, root=tmp_path, base=base)


def test_fake_cifar_is_read_like_the_real_one_and_is_learnable(tmp_path):
    ff.data.write_fake_cifar("cifar10", tmp_path, per_class=20, test_per_class=4)
    ff.data.write_fake_cifar("cifar100", tmp_path, per_class=2, test_per_class=1)
    train, test = ff.data.load("cifar10", root=str(tmp_path), download=True)  # present: read, never fetched
    assert train.x.shape == (200, 3, 32, 32) and len(test) == 40 and train.num_classes == 10
    assert ff.data.load("cifar10", root=str(tmp_path))[0] is train  # read once per process while unchanged
    assert ff.data.load("cifar100", root=str(tmp_path))[0].num_classes == 100
    # class prototypes plus noise: the nearest class mean of the training set labels the test set well
    means = [train.x[train.y == c].mean(0) for c in range(10)]
    d = [[(x - m).pow(2).sum().item() for m in means] for x in test.x]
    acc = sum(min(range(10), key=row.__getitem__) == y for row, y in zip(d, test.y.tolist())) / len(test)
    assert acc > 0.9
    with pytest.raises(ValueError, match="cifar10 or cifar100"):
        ff.data.write_fake_cifar("svhn", tmp_path)


def test_lr_warmup_then_cosine():
    from fedfrozen.engine.loop import lr_at as _lr_at

    cfg = tiny_config(rounds=10, lr=1.0, lr_schedule="cosine", lr_warmup_rounds=3)
    lrs = [_lr_at(cfg, r) for r in range(10)]
    assert lrs[:3] == [0.25, 0.5, 0.75] and lrs[3] == 1.0
    assert lrs[4] == pytest.approx(0.5 * (1 + math.cos(math.pi / 7)))
    assert all(a >= b for a, b in zip(lrs[3:], lrs[4:]))
    # no warm-up: as before
    assert _lr_at(tiny_config(rounds=10, lr=1.0, lr_schedule="cosine"), 5) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="lr_warmup_rounds"):
        tiny_config(rounds=3, lr_warmup_rounds=3)


def test_config_key_ignores_fields_at_their_default():
    cfg = tiny_config()
    assert experiments.config_key(cfg) == experiments.config_key(cfg.replace(augment=None, lr_warmup_rounds=0))
    assert experiments.config_key(cfg) != experiments.config_key(cfg.replace(augment=True))


def test_dry_run_shortens_each_run_and_logs_its_cost(tmp_path, monkeypatch):
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv(ff.io.DRY_RUN_ENV, json.dumps(dict(log=str(log), rounds=2, model_kwargs=TINY, one_seed=True,
                                                         notebook="nb")))
    cfg = tiny_config(rounds=50, warmup_rounds=20, seed=3, model_kwargs={})
    hists = ff.run_many([cfg, cfg.replace(method="fedfrozen")], root=tmp_path, experiment="x")
    assert [len(h) for h in hists] == [2, 2] and [r["stage"] for r in hists[1].rows] == [1, 2]
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["rounds"] for r in recs] == [50, 50] and all(r["sec_per_round"] > 0 for r in recs)
    assert recs[0]["key"] == experiments.config_key(cfg)
    # the full config of the run asked for (tools/configs.py rebuilds a notebook's committed configs from it)
    assert [experiments.config_key(ff.Config.from_dict(r["config"])) for r in recs] == [r["key"] for r in recs]
    assert recs[0]["experiment"] == "x"
    assert hists[0].config["seed"] == 0 and hists[0].config["rounds"] == 2  # one seed, two rounds
    # the tiny model comes from models.create, so a notebook's own models are tiny too
    assert sum(p.numel() for p in ff.models.create("vit_cifar", 10).parameters()) < 20_000


def test_dry_run_executes_every_paper_config_of_every_notebook():
    from fedfrozen.runs.dryrun import TRAINS, dry_run

    # 08 trains through Flower's runtime, not through run_or_load, and keeps digits at every profile: nbval runs it
    # (smoke) and tests/test_flower.py its launches; leaving it out here saves CI a Flower start (~40 s)
    # 14's paper profile is the release's 349 roles: offline (--tiny: the small text, 12 roles a play) its pre-training
    # and evaluation over ~900k windows take more than 20 minutes, beyond CI's budget; its smoke profile (nbval) runs
    # every path of it, and the next test that --tiny downloads nothing for it
    # 12's, 13's and 15's paper profiles (their studies: 152, 203 and more configs) take 22, 2 and over 25 minutes
    # here at --tiny, beyond CI's budget; their smoke profiles (nbval) run every path of them, and `fedfrozen dry-run`
    # checks them
    books = [nb for nb in ff.io.notebooks() if not nb.name.startswith(("08", "12", "13", "14", "15"))]
    # two at a time: the kernels are single-threaded, the machine has two cores (the projection is not checked here)
    rows = dry_run("paper", tiny=True, only=",".join(nb.name[:2] for nb in books), progress=lambda line: None,
                   workers=2)
    failed = [(r["notebook"], r["error"]) for r in rows if r["status"] != "ok"]
    assert not failed, failed
    names = {r["notebook"].split(" ")[0][:2] for r in rows}
    expected = {nb.name[:2] for nb in books if any(t in nb.read_text() for t in TRAINS)}
    assert names == expected and {"00", "03", "07"} <= names
    assert all(r["configs"] > 0 for r in rows)  # 02 trains too (FedAvg's level without the held-out images)


def test_dry_run_refuses_bad_workers_before_any_work():
    from fedfrozen.runs.dryrun import dry_run

    with pytest.raises(ValueError, match="paper profile .or the cpu one"):
        dry_run("smoke", tiny=True)

    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="workers must be an integer >= 1"):
            dry_run("paper", tiny=True, workers=bad)


def test_the_tiny_dry_run_gives_notebook_14_the_small_text_and_downloads_nothing(tmp_path, monkeypatch):
    """With the release absent, notebook 14's paper profile would fetch it (5 MB) and evaluate each of its configs on
    860,000 windows: minutes a config, hours in all. --tiny writes the small text instead, where `locate` finds it."""
    from fedfrozen.inputs import shakespeare
    from fedfrozen.runs.dryrun import write_data

    monkeypatch.setattr(shakespeare, "fetch", lambda *a, **k: pytest.fail("the tiny dry run downloaded the release"))
    write_data(tmp_path, "paper", tiny=True)
    assert shakespeare.locate(tmp_path) == tmp_path / shakespeare.TEXTS
    assert shakespeare.source_version(tmp_path) is not None  # not the release: its digest enters the runs' keys
    assert not list(tmp_path.rglob("*.tar.gz"))
    texts = ff.data.load("shakespeare", root=str(tmp_path), download=True)
    assert texts is not None
    write_data(tmp_path / "full", "paper", tiny=False)  # the projection's sizes: the CIFARs only, no text written
    assert not (tmp_path / "full" / shakespeare.TEXTS).exists()
    assert len(texts[0].roles) >= 349  # the paper profile's federation fits
