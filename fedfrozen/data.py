"""Datasets as in-memory tensors.

`load(name)` returns a `(train, test)` pair of `Split`s: `.x` a normalised float32 tensor
(N, C, H, W), `.y` an int64 tensor (N,), `.classes` and `.name`. The embedded default is
scikit-learn's bundled 8x8 digits (nothing to download); CIFAR-10/100, SVHN and Fashion-MNIST
are read from torchvision's on-disk formats under `root` and downloaded only when asked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Split", "load", "from_tensors", "write_fake_cifar", "DATASETS"]


@dataclass
class Split:
    """One split of a dataset, held as tensors."""

    x: torch.Tensor
    y: torch.Tensor
    classes: list
    name: str

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def from_tensors(x, y, name: str = "custom", classes=None) -> Split:
    """Wrap user tensors (x: N,C,H,W floats, y: N ints) as a Split, with checks."""
    x = torch.as_tensor(x, dtype=torch.float32)
    y = torch.as_tensor(y)
    if x.ndim != 4:
        raise ValueError(f"x must have shape (N, C, H, W); got {tuple(x.shape)}")
    if y.ndim != 1 or y.dtype.is_floating_point or y.dtype == torch.bool:
        raise ValueError("y must be a 1-D integer tensor of class labels")
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length: {len(x)} vs {len(y)}")
    y = y.to(torch.long)
    if classes is None:
        classes = [str(c) for c in range(int(y.max()) + 1)]
    return Split(x.contiguous(), y, list(classes), name)


# --- the embedded default: scikit-learn's 8x8 digits ------------------------------------

DIGITS_TEST_FRACTION = 0.2  # fixed stratified split: 1,437 train / 360 test
DIGITS_SPLIT_SEED = 0


def _load_digits() -> tuple[Split, Split]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = bunch.images.astype(np.float32) / 16.0  # (1797, 8, 8) in [0, 1]
    labels = bunch.target.astype(np.int64)
    idx_train, idx_test = train_test_split(
        np.arange(len(labels)), test_size=DIGITS_TEST_FRACTION,
        stratify=labels, random_state=DIGITS_SPLIT_SEED)
    mean, std = images[idx_train].mean(), images[idx_train].std()
    x = torch.from_numpy((images - mean) / std).unsqueeze(1)  # (N, 1, 8, 8)
    y = torch.from_numpy(labels)
    classes = [str(c) for c in range(10)]
    return (Split(x[idx_train], y[idx_train], classes, "digits"),
            Split(x[idx_test], y[idx_test], classes, "digits"))


# --- torchvision datasets ----------------------------------------------------------------

# Channel statistics of each training set (the usual published values).
_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "svhn": ((0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
}

# Files each torchvision dataset needs under `root`, as torchvision lays them out.
_FILES = {
    "cifar10": [f"cifar-10-batches-py/{f}" for f in
                ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5",
                 "test_batch", "batches.meta"]],
    "cifar100": [f"cifar-100-python/{f}" for f in ["train", "test", "meta"]],
    "svhn": ["train_32x32.mat", "test_32x32.mat"],
    "fashion_mnist": [f"FashionMNIST/raw/{f}" for f in
                      ["train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                       "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]],
}


def _torchvision_class(name: str):
    from torchvision import datasets

    return {"cifar10": datasets.CIFAR10, "cifar100": datasets.CIFAR100,
            "svhn": datasets.SVHN, "fashion_mnist": datasets.FashionMNIST}[name]


def _present_only(cls):
    """The torchvision class with its checksum test replaced by a presence test.

    `load` has already checked that every file is there; skipping the md5 pass avoids
    re-hashing 170 MB on every load. Downloads (download=True) still verify checksums.
    """
    overrides = {"_check_integrity": lambda self: True, "_check_exists": lambda self: True}
    if hasattr(cls, "_load_meta"):  # CIFAR: read the class names without the md5 test
        overrides["_load_meta"] = _load_cifar_meta
    return type(cls.__name__, (cls,), overrides)


def _load_cifar_meta(self) -> None:
    import pickle

    with open(os.path.join(self.root, self.base_folder, self.meta["filename"]), "rb") as f:
        meta = pickle.load(f, encoding="latin1")
    self.classes = meta[self.meta["key"]]
    self.class_to_idx = {c: i for i, c in enumerate(self.classes)}


def _open_torchvision(name: str, root: str, train: bool, download: bool):
    cls = _torchvision_class(name)
    if not download:
        cls = _present_only(cls)
    if name == "svhn":
        return cls(root, split="train" if train else "test", download=download)
    return cls(root, train=train, download=download)


def _to_split(ds, name: str) -> Split:
    if name == "svhn":
        images = np.asarray(ds.data)  # (N, 3, 32, 32) uint8
        labels = np.asarray(ds.labels)
        classes = [str(c) for c in range(10)]
    else:
        images = np.asarray(ds.data)
        labels = np.asarray(ds.targets)
        classes = list(ds.classes)
        if images.ndim == 3:  # (N, H, W) grey
            images = images[:, None]
        else:  # (N, H, W, C)
            images = images.transpose(0, 3, 1, 2)
    mean, std = _STATS[name]
    x = torch.from_numpy(np.ascontiguousarray(images)).float().div_(255.0)
    x.sub_(torch.tensor(mean).view(1, -1, 1, 1)).div_(torch.tensor(std).view(1, -1, 1, 1))
    return Split(x, torch.from_numpy(labels.astype(np.int64)), classes, name)


_MEMO: dict = {}  # (name, root, file sizes and mtimes) -> (train, test) of the last torchvision load


def _load_torchvision(name: str, root: str, download: bool) -> tuple[Split, Split]:
    """Read (or fetch) a torchvision dataset. The last one read is kept in memory while its files are
    unchanged, so the many runs of a notebook in one process parse it once (treat its tensors as read-only)."""
    paths = [os.path.join(root, f) for f in _FILES[name]]
    if all(os.path.isfile(p) for p in paths):
        stamp = (name, os.path.abspath(root), tuple((os.path.getsize(p), os.path.getmtime(p)) for p in paths))
        if stamp not in _MEMO:
            _MEMO.clear()
            _MEMO[stamp] = _read_torchvision(name, root, download=False)
        return _MEMO[stamp]
    return _read_torchvision(name, root, download)


def _read_torchvision(name: str, root: str, download: bool) -> tuple[Split, Split]:
    missing = [f for f in _FILES[name] if not os.path.isfile(os.path.join(root, f))]
    if missing and not download:
        raise FileNotFoundError(
            f"dataset {name!r} is not under {root!r} (missing: {', '.join(missing)}). "
            f"Fetch it with fedfrozen.data.load({name!r}, root={root!r}, download=True) "
            f"or on the command line with `fedfrozen run --dataset {name} --download`.")
    download = download and bool(missing)  # files already there are read, never fetched again
    try:
        train = _open_torchvision(name, root, True, download)
        test = _open_torchvision(name, root, False, download)
    except (OSError, RuntimeError) as e:  # no network, a refused or broken download, a damaged file
        raise ValueError(f"dataset {name!r} at {root!r}: {'download' if download else 'reading'} failed "
                         f"({type(e).__name__}: {str(e)[:200]}); put torchvision's files for {name} in {root!r} "
                         f"and run again") from None
    return _to_split(train, name), _to_split(test, name)


DATASETS = ("digits", "cifar10", "cifar100", "svhn", "fashion_mnist")


def load(name: str, root: str = "data", download: bool = False) -> tuple[Split, Split]:
    """Load dataset `name` as `(train, test)` Splits of normalised tensors.

    `digits` is embedded (scikit-learn); the others are read from `root` in torchvision's
    format and fetched only with `download=True`.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(DATASETS)}")
    if name == "digits":
        return _load_digits()
    return _load_torchvision(name, root, download)


def write_fake_cifar(name: str, root, per_class: int = 50, test_per_class: int = 10, seed: int = 0) -> str:
    """Write a small, learnable stand-in for CIFAR-10 or CIFAR-100 in torchvision's on-disk format.

    Each class is a random 32x32x3 prototype; its images are the prototype plus noise, so a
    model can learn it in a few rounds. `load(name, root)` reads it like the real dataset. Used
    by the paper profile's dry run and the tests; nothing is downloaded. Returns `root`.
    """
    import pickle

    if name not in ("cifar10", "cifar100"):
        raise ValueError(f"write_fake_cifar writes cifar10 or cifar100; got {name!r}")
    n_classes = 10 if name == "cifar10" else 100
    rng = np.random.default_rng(seed)
    protos = rng.integers(40, 216, size=(n_classes, 3072)).astype(np.float32)

    def images(n):
        labels = np.repeat(np.arange(n_classes), n)
        rng.shuffle(labels)
        data = np.empty((labels.size, 3072), dtype=np.uint8)
        for i in range(0, labels.size, 5000):  # in chunks: 50,000 images need no 600 MB of float noise at once
            part = labels[i:i + 5000]
            data[i:i + 5000] = np.clip(protos[part] + rng.normal(0, 40, size=(part.size, 3072)), 0, 255)
        return data, labels.tolist()

    def dump(path, obj):
        with open(path, "wb") as f:
            pickle.dump(obj, f)

    train, test = images(per_class), images(test_per_class)
    if name == "cifar10":
        folder = os.path.join(root, "cifar-10-batches-py")
        os.makedirs(folder, exist_ok=True)
        parts = np.array_split(np.arange(len(train[1])), 5)
        for i, part in enumerate(parts, 1):
            dump(os.path.join(folder, f"data_batch_{i}"),
                 {"data": train[0][part], "labels": [train[1][j] for j in part]})
        dump(os.path.join(folder, "test_batch"), {"data": test[0], "labels": test[1]})
        dump(os.path.join(folder, "batches.meta"), {"label_names": [f"class{i}" for i in range(n_classes)]})
    else:
        folder = os.path.join(root, "cifar-100-python")
        os.makedirs(folder, exist_ok=True)
        dump(os.path.join(folder, "train"), {"data": train[0], "fine_labels": train[1]})
        dump(os.path.join(folder, "test"), {"data": test[0], "fine_labels": test[1]})
        dump(os.path.join(folder, "meta"), {"fine_label_names": [f"class{i}" for i in range(n_classes)]})
    return str(root)
