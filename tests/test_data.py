import os
import pickle
import struct

import numpy as np
import pytest
import torch

import fedfrozen as ff


def test_digits_split_is_fixed_stratified_and_normalised(digits):
    train, test = digits
    assert len(train) + len(test) == 1797
    assert train.x.shape[1:] == (1, 8, 8) and train.x.dtype == torch.float32
    assert train.y.dtype == torch.int64 and train.classes == [str(c) for c in range(10)]
    assert abs(train.x.mean().item()) < 1e-4 and abs(train.x.std().item() - 1) < 1e-3
    # stratified: every class's share in test within one sample of its share overall
    full = torch.cat([train.y, test.y])
    for c in range(10):
        expected = (full == c).sum().item() * len(test) / 1797
        assert abs((test.y == c).sum().item() - expected) <= 1
    again, _ = ff.data.load("digits")
    assert torch.equal(again.x, train.x) and torch.equal(again.y, train.y)


def test_unknown_dataset_lists_names():
    with pytest.raises(ValueError, match="available: digits, cifar10"):
        ff.data.load("mnist3d")


def test_missing_files_say_how_to_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="download=True"):
        ff.data.load("cifar10", root=str(tmp_path))


def _write_cifar10(root, n=20):
    rng = np.random.default_rng(0)
    folder = root / "cifar-10-batches-py"
    folder.mkdir()
    batches = {}
    for name in ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"]:
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n).tolist()
        with open(folder / name, "wb") as f:
            pickle.dump({"data": data, "labels": labels}, f)
        batches[name] = (data, labels)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    return batches


def test_cifar10_reads_torchvision_pickles(tmp_path):
    batches = _write_cifar10(tmp_path)
    train, test = ff.data.load("cifar10", root=str(tmp_path))
    assert train.x.shape == (100, 3, 32, 32) and test.x.shape == (20, 3, 32, 32)
    assert train.classes == [f"c{i}" for i in range(10)]
    data, labels = batches["test_batch"]
    assert test.y.tolist() == labels
    # pixel (0, channel 1, row 0, col 0) de-normalised back to its byte
    mean, std = 0.4822, 0.2435
    assert round((test.x[0, 1, 0, 0].item() * std + mean) * 255) == data[0, 1024]


def test_cifar100_reads_torchvision_pickles(tmp_path):
    rng = np.random.default_rng(1)
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for name, n in [("train", 30), ("test", 10)]:
        with open(folder / name, "wb") as f:
            pickle.dump({"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                         "fine_labels": rng.integers(0, 100, n).tolist()}, f)
    with open(folder / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"k{i}" for i in range(100)]}, f)
    train, test = ff.data.load("cifar100", root=str(tmp_path))
    assert len(train) == 30 and len(test) == 10 and train.num_classes == 100


def test_svhn_reads_mat_files(tmp_path):
    from scipy.io import savemat

    rng = np.random.default_rng(2)
    for split, n in [("train", 12), ("test", 6)]:
        savemat(tmp_path / f"{split}_32x32.mat",
                {"X": rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8),
                 "y": rng.integers(1, 11, (n, 1)).astype(np.uint8)})
    train, test = ff.data.load("svhn", root=str(tmp_path))
    assert train.x.shape == (12, 3, 32, 32) and len(test) == 6
    assert train.y.min() >= 0 and train.y.max() <= 9  # torchvision maps label 10 to 0


def _idx(path, arr, magic):
    with open(path, "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in arr.shape))
        f.write(arr.tobytes())


def _write_fmnist(folder, n_train=15, n_test=5, gz=False, seed=3):
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    arrays = {}
    for prefix, n in [("train", n_train), ("t10k", n_test)]:
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n).astype(np.uint8)
        ext = ".gz" if gz else ""
        ff.data.write_idx(os.path.join(folder, f"{prefix}-images-idx3-ubyte{ext}"), images)
        ff.data.write_idx(os.path.join(folder, f"{prefix}-labels-idx1-ubyte{ext}"), labels)
        arrays[prefix] = (images, labels)
    return arrays


def test_fashion_mnist_reads_idx_files(tmp_path):
    rng = np.random.default_rng(3)
    raw = tmp_path / "FashionMNIST" / "raw"
    os.makedirs(raw)
    for prefix, n in [("train", 15), ("t10k", 5)]:
        _idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), 2051)
        _idx(raw / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n).astype(np.uint8), 2049)
    train, test = ff.data.load("fashion_mnist", root=str(tmp_path))
    assert train.x.shape == (15, 1, 28, 28) and len(test) == 5
    assert train.classes == ff.data.FASHION_MNIST_CLASSES


def test_idx_reader_round_trips_plain_and_gzip_and_names_a_bad_file(tmp_path):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    for name in ("a.idx", "a.idx.gz"):
        ff.data.write_idx(tmp_path / name, arr)
        assert np.array_equal(ff.data.read_idx(str(tmp_path / name)), arr)
    (tmp_path / "bad").write_bytes(b"PK\x03\x04 not idx")
    with pytest.raises(ValueError, match="is not an IDX file"):
        ff.data.read_idx(str(tmp_path / "bad"))
    (tmp_path / "short").write_bytes(bytes([0, 0, 8, 1]) + (10).to_bytes(4, "big") + b"abc")
    with pytest.raises(ValueError, match="header says"):
        ff.data.read_idx(str(tmp_path / "short"))


def test_fashion_mnist_looks_in_data_then_the_system_package(tmp_path, monkeypatch):
    system = tmp_path / "usr-share"
    monkeypatch.setattr(ff.data, "FASHION_MNIST_SYSTEM_DIR", str(system))
    sys_arrays = _write_fmnist(system, n_train=12, gz=True, seed=1)
    train, test = ff.data.load("fashion_mnist", root=str(tmp_path / "data"))  # nothing under data/: the system copy
    assert len(train) == 12 and train.y.tolist() == sys_arrays["train"][1].tolist()
    # normalised with the published Fashion-MNIST statistics
    mean, std = 0.2860, 0.3530
    assert round((test.x[0, 0, 0, 0].item() * std + mean) * 255) == sys_arrays["t10k"][0][0, 0, 0]
    _write_fmnist(tmp_path / "data" / "FashionMNIST" / "raw", n_train=9, seed=2)  # data/ first, once it is there
    train, _ = ff.data.load("fashion_mnist", root=str(tmp_path / "data"))
    assert len(train) == 9


def test_missing_fashion_mnist_names_all_three_ways(tmp_path, monkeypatch):
    monkeypatch.setattr(ff.data, "FASHION_MNIST_SYSTEM_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError) as e:
        ff.data.load("fashion_mnist", root=str(tmp_path / "data"))
    text = str(e.value)
    assert "FashionMNIST/raw" in text and "apt-get install dataset-fashion-mnist" in text and "download=True" in text


def test_a_broken_download_of_fashion_mnist_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(ff.data, "FASHION_MNIST_SYSTEM_DIR", str(tmp_path / "nowhere"))

    def refuse(*a, **k):
        raise RuntimeError("no network")

    monkeypatch.setattr(ff.data, "_open_torchvision", refuse)
    with pytest.raises(ValueError, match="download to .* failed .*no network") as e:
        ff.data.load("fashion_mnist", root=str(tmp_path / "data"), download=True)
    assert "FashionMNIST/raw" in str(e.value) and "apt-get install dataset-fashion-mnist" in str(e.value)


def test_the_cpu_profile_downloads_fashion_mnist_when_no_copy_is_found():
    """The main job works on a machine without Debian's package: the cpu profile asks for the download, which
    happens only when neither data/ nor Debian's copy holds the files."""
    cpu = ff.Config(**ff.profiles.federated("cpu"))
    assert cpu.dataset == "fashion_mnist" and cpu.download is True
    assert cpu.data_root == ff.profiles.data_root()


@pytest.mark.skipif(not os.path.isfile(os.path.join(ff.data.FASHION_MNIST_SYSTEM_DIR, "train-labels-idx1-ubyte.gz")),
                    reason="Debian's dataset-fashion-mnist is not installed (apt-get install dataset-fashion-mnist)")
def test_the_real_fashion_mnist_files(tmp_path):
    train, test = ff.data.load("fashion_mnist", root=str(tmp_path))
    assert train.x.shape == (60000, 1, 28, 28) and test.x.shape == (10000, 1, 28, 28)
    assert torch.bincount(train.y).tolist() == [6000] * 10 and torch.bincount(test.y).tolist() == [1000] * 10
    assert abs(train.x.mean().item()) < 1e-3 and abs(train.x.std().item() - 1) < 1e-3


def test_from_tensors_checks_shapes():
    s = ff.data.from_tensors(torch.zeros(4, 1, 8, 8), torch.tensor([0, 1, 2, 1]))
    assert s.num_classes == 3 and s.y.dtype == torch.int64
    with pytest.raises(ValueError, match=r"x must be images of shape \(N, C, H, W\) or integer token windows"):
        ff.data.from_tensors(torch.zeros(4, 8, 8), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="x must be images"):  # float windows are neither
        ff.data.from_tensors(torch.zeros(4, 8), torch.zeros(4, dtype=torch.long))
    text = ff.data.from_tensors(torch.zeros(4, 8, dtype=torch.uint8), torch.tensor([0, 1, 2, 1]), owner=[0, 0, 1, 1])
    assert text.x.dtype == torch.long and text.owner.tolist() == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="owner must be N non-negative integers"):
        ff.data.from_tensors(torch.zeros(4, 8, dtype=torch.long), torch.tensor([0, 1, 2, 1]), owner=[0, 1])
    with pytest.raises(ValueError, match="integer"):
        ff.data.from_tensors(torch.zeros(4, 1, 8, 8), torch.zeros(4))
