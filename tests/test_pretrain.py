"""The pretrained start (issue: test the claims where they could hold): weights made once on images no client
holds, cached, bit-identical for one seed, and FedFrozen with T0 = 0 freezes exactly that kernel."""

import numpy as np
import pytest
import torch
from conftest import tiny_config

import fedfrozen as ff
from fedfrozen import pretrain

# digits has 1,437 training images: the federation takes 1,000 of them, the server pre-trains on the other 437
PRE = dict(init="pretrained", train_subset=1000, pretrain_epochs=1)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(pretrain, "cache_dir", lambda: tmp_path / "pretrained")


def _qk(model):
    groups = ff.qkv.param_groups(model)
    return {n: p.detach().clone() for n, p in model.named_parameters() if n in groups["qk"]}


def test_the_clients_never_hold_a_pre_training_image(digits):
    train, _ = digits
    outside = pretrain.outside_indices(train, 1000)
    inside = ff.data.subset_indices(train, 1000)
    assert len(outside) == len(train) - 1000 and np.intersect1d(outside, inside).size == 0
    cfg = tiny_config(**PRE)
    s = ff.loop.prepare(cfg)
    # the run's training images are the subset, and the subset is disjoint from the pre-training images
    assert torch.equal(s.x.cpu(), ff.data.subset(train, 1000).x)
    with pytest.raises(ValueError, match="train_subset must leave some out"):
        pretrain.outside_indices(train, None)


def test_same_seed_same_weights_and_the_second_run_loads_them(monkeypatch):
    cfg = tiny_config(**PRE)
    first = ff.loop.prepare(cfg).model.state_dict()
    path = pretrain.cache_dir() / f"{pretrain.weights_key(cfg)}.pt"
    assert path.is_file()
    trained = []
    monkeypatch.setattr(pretrain, "_train", lambda *a, **k: trained.append(1))
    second = ff.loop.prepare(cfg).model.state_dict()
    assert not trained  # loaded from the cache
    assert all(torch.equal(first[k], second[k]) for k in first)
    # a fresh cache: trained again, bit-identical
    path.unlink()
    monkeypatch.undo()
    monkeypatch.setattr(pretrain, "cache_dir", lambda: path.parent)
    third = ff.loop.prepare(cfg).model.state_dict()
    assert all(torch.equal(first[k], third[k]) for k in first)
    # another pre-training seed is another key and other weights
    other = tiny_config(**PRE, pretrain_seed=1)
    assert pretrain.weights_key(other) != pretrain.weights_key(cfg)
    assert not all(torch.equal(first[k], v) for k, v in ff.loop.prepare(other).model.state_dict().items())


def test_a_second_process_waits_for_the_weights_another_is_making_and_loads_them(monkeypatch):
    """Two workers of a grid that need one body train it once: the second waits on the key's lock and loads."""
    import threading
    import time

    from fedfrozen.base.io import file_lock

    cfg = tiny_config(**PRE)
    train, _ = ff.data.load(cfg.dataset, cfg.data_root)
    path = pretrain.cache_dir() / f"{pretrain.weights_key(cfg)}.pt"
    path.parent.mkdir(parents=True)
    trained, got = [], []
    monkeypatch.setattr(pretrain, "_train", lambda *a, **k: trained.append(1) or {"w": torch.zeros(1)})
    made = {"w": torch.ones(3)}
    with file_lock(path.parent / f".{path.stem}.lock"):  # the first process, training
        waiter = threading.Thread(target=lambda: got.append(pretrain.pretrained_state(cfg, train, 10, {})))
        waiter.start()
        time.sleep(0.5)
        assert not got  # still waiting
        torch.save(made, path)  # the first process's weights land
    waiter.join(timeout=30)
    assert not trained and torch.equal(got[0]["w"], made["w"])
    assert not (path.parent / f".{path.stem}.lock").exists()


def test_rotation_keeps_the_body_and_gives_the_run_its_own_head():
    cfg = tiny_config(**PRE)
    state = ff.loop.prepare(cfg).model.state_dict()
    random = ff.loop.prepare(tiny_config()).model.state_dict()  # same seed, random start
    body = [k for k in state if not k.startswith("head.")]
    assert all(torch.equal(state[k], random[k]) for k in state if k.startswith("head."))
    assert not all(torch.equal(state[k], random[k]) for k in body)


def test_fedfrozen_with_t0_zero_freezes_the_pretrained_kernel_from_round_0_and_equals_freeze_at_init(setups):
    cfg = tiny_config(**PRE, method="fedfrozen", warmup_rounds=0, rounds=2)
    start = _qk(ff.loop.prepare(cfg).model)
    hist = ff.run(cfg, progress=False)
    assert all(row["stage"] == 2 for row in hist.rows) and all(row["kernel_change"] == 0 for row in hist.rows)
    end = _qk(setups[-1].model)  # the resident model after the run: the pretrained kernel, bit for bit
    assert all(torch.equal(start[k], end[k]) for k in start)
    at_init = ff.run(cfg.replace(method="freeze_kernel_at_init"), progress=False)
    assert hist.same_as(at_init)


def test_bad_pretraining_settings_are_named_before_any_work():
    with pytest.raises(ValueError, match="train_subset"):
        tiny_config(init="pretrained")
    with pytest.raises(ValueError, match="pretrain_task"):
        tiny_config(**PRE, pretrain_task="jigsaw")
    with pytest.raises(ValueError, match="pretrain_epochs"):
        tiny_config(**{**PRE, "pretrain_epochs": 0})


def test_the_classes_task_trains_on_half_the_classes_and_keeps_the_head():
    cfg = tiny_config(**PRE, pretrain_task="classes")
    x, y = pretrain.task_data("classes", torch.zeros(20, 1, 8, 8), torch.arange(20) % 10, 10)
    batches = list(pretrain.task_batches("classes", x, y, torch.Generator().manual_seed(0), 4))
    assert sum(len(y) for _, y in batches) == 10 and all((y < 5).all() for _, y in batches)
    state = ff.loop.prepare(cfg).model.state_dict()
    random = ff.loop.prepare(tiny_config()).model.state_dict()
    assert not torch.equal(state["head.weight"], random["head.weight"])
