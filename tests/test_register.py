"""A user's own dataset in one call: `ff.data.register(name, loader, version=...)`, then `Config(dataset=name)` trains,
caches and keys it like the built-ins; a loader's bad output is refused, by name, before any training."""

import pytest
import torch
from conftest import tiny_config

import fedfrozen as ff


@pytest.fixture
def registered():
    """Names registered by the test, unregistered after it."""
    names = []

    def register(name, loader, **kw):
        ff.data.register(name, loader, **kw)
        names.append(name)

    yield register
    for name in names:
        if name in ff.data.names():
            ff.data.unregister(name)


def digits_as_user_data():
    train, test = ff.data.load("digits")
    return (train.x.clone(), train.y.clone()), (test.x.clone(), test.y.clone())


def test_a_registered_dataset_trains_as_the_same_tensors_given_to_run(registered):
    """The digits' tensors, registered under a name of the user's, give the History that run(train=, test=) gives
    on them (same partition, batches, model): registering changes the name, nothing else."""
    registered("my_digits", digits_as_user_data, version=1)
    mine = ff.run(tiny_config(dataset="my_digits"), progress=False)
    train, test = (ff.data.from_tensors(*xy) for xy in digits_as_user_data())
    given = ff.run(tiny_config(), train=train, test=test, progress=False)
    assert [r["test_acc"] for r in mine.rows] == [r["test_acc"] for r in given.rows]
    assert [r["train_loss"] for r in mine.rows] == [r["train_loss"] for r in given.rows]
    assert mine.config["dataset"] == "my_digits"


def test_the_cache_key_holds_the_name_and_the_loader_version(registered, tmp_path):
    registered("blobs", digits_as_user_data, version="a")
    cfg = tiny_config(dataset="blobs", rounds=1)
    key_a = ff.experiments.config_key(cfg)
    first = ff.run_or_load(cfg, root=tmp_path, progress=False)
    assert not first.cached and ff.run_or_load(cfg, root=tmp_path, progress=False).cached
    ff.data.register("blobs", digits_as_user_data, version="b", replace=True)  # the loader changed
    assert ff.experiments.config_key(cfg) != key_a
    assert not ff.run_or_load(cfg, root=tmp_path, progress=False).cached  # no stale run served
    ff.data.register("blobs", digits_as_user_data, version="a", replace=True)
    assert ff.experiments.config_key(cfg) == key_a  # (the built-ins' keys: tests/test_verdicts.py, every committed run)
    ff.data.unregister("blobs")
    assert not any(name == "blobs" for name, _ in ff.data._LOADED)  # its splits are let go
    ff.data.register("blobs", digits_as_user_data, version="a")


def test_run_many_hands_the_loaded_splits_to_its_workers(registered, tmp_path):
    """Spawned workers start with nothing registered (a loader defined in a notebook cannot be sent): they get the
    loaded splits, and train what this process trains."""
    registered("spawned_digits", lambda: digits_as_user_data(), version=1)
    cfgs = [tiny_config(dataset="spawned_digits", rounds=2, seed=s) for s in (0, 1)]
    pooled = ff.run_many(cfgs, root=tmp_path / "pool", workers=2, progress=False)
    here = [ff.run(c, progress=False) for c in cfgs]
    assert [[r["test_acc"] for r in h.rows] for h in pooled] == [[r["test_acc"] for r in h.rows] for h in here]


def test_an_unknown_dataset_names_the_registered_ones(registered):
    registered("mine", digits_as_user_data, version=1)
    with pytest.raises(ValueError, match="dataset must be one of .*mine"):
        tiny_config(dataset="not_registered")


@pytest.mark.parametrize("name, loader, kw, error", [
    ("digits", digits_as_user_data, dict(version=1), "built-in"),
    ("my data", digits_as_user_data, dict(version=1), "identifier"),
    ("mine", "not a function", dict(version=1), "loader must be a function"),
    ("mine", digits_as_user_data, dict(version=""), "version must be"),
    ("mine", digits_as_user_data, dict(version=None), "version must be"),
])
def test_bad_registrations_are_refused(name, loader, kw, error):
    with pytest.raises((ValueError, TypeError), match=error):
        ff.data.register(name, loader, **kw)
    assert name not in ff.data.names() or name == "digits"


def _images(n, shape=(1, 8, 8)):
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(0))


BAD = {
    "not a pair": (lambda: _images(10), "the loader must return \\(train, test\\)"),
    "3-D images": (lambda: ((_images(40)[:, 0], torch.arange(40) % 3), (_images(9), torch.arange(9) % 3)),
                   "train: x must be images of shape"),
    "float labels": (lambda: ((_images(40), torch.rand(40)), (_images(9), torch.arange(9) % 3)),
                     "train: y must be a 1-D integer tensor"),
    "test labels out of range": (lambda: ((_images(40), torch.arange(40) % 3), (_images(9), torch.arange(9) % 5)),
                                 "test labels run from 0 to 4; they must lie in 0..2"),
    "negative labels": (lambda: ((_images(40), torch.arange(40) % 3 - 1), (_images(9), torch.arange(9) % 2)),
                        "train labels run from -1"),
    "image sizes differ": (lambda: ((_images(40), torch.arange(40) % 3), (_images(9, (1, 6, 6)), torch.arange(9) % 3)),
                           "train samples are \\(1, 8, 8\\) but test samples \\(1, 6, 6\\)"),
    "one class": (lambda: ((_images(40), torch.zeros(40, dtype=torch.long)), (_images(9), torch.zeros(9).long())),
                  "one class only"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_loaders_bad_output_is_refused_by_name_before_any_training(case, registered, monkeypatch):
    loader, error = BAD[case]
    registered("broken", loader, version=1)
    trained = []
    monkeypatch.setattr(ff.local, "train", lambda *a, **k: trained.append(1))
    with pytest.raises(ValueError, match=r"dataset 'broken' \(ff.data.register\): " + error):
        ff.run(tiny_config(dataset="broken", model_kwargs=dict(embed_dim=16, depth=1, num_heads=2)), progress=False)
    assert trained == []


def test_too_few_images_for_the_federation_is_refused_before_any_training(registered, monkeypatch):
    registered("small", lambda: ((_images(30), torch.arange(30) % 3), (_images(9), torch.arange(9) % 3)), version=1)
    trained = []
    monkeypatch.setattr(ff.local, "train", lambda *a, **k: trained.append(1))
    with pytest.raises(ValueError, match="n_clients \\(100\\) exceeds the .* training samples left for clients"):
        ff.run(tiny_config(dataset="small", n_clients=100), progress=False)
    assert trained == []


def test_the_flower_apps_refuse_a_registered_dataset_before_any_node_starts(registered):
    """Flower's nodes are other processes, where a dataset registered here does not exist: refused by name."""
    fl = pytest.importorskip("fedfrozen.flower")
    registered("mine_only", digits_as_user_data, version=1)
    with pytest.raises(ValueError, match="dataset 'mine_only' is registered in this process only"):
        fl.check_supported(tiny_config(dataset="mine_only"))
    fl.check_supported(tiny_config())  # a built-in is fine
