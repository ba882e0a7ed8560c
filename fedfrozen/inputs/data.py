"""Datasets as in-memory tensors.

`load(name)` returns a `(train, test)` pair of `Split`s: `.x` a normalised float32 tensor
(N, C, H, W), `.y` an int64 tensor (N,), `.classes` and `.name`. The embedded default is
scikit-learn's bundled 8x8 digits (nothing to download); CIFAR-10/100, SVHN and Fashion-MNIST
are read from torchvision's on-disk formats under `root` and downloaded only when asked.
Fashion-MNIST (the cpu profile's dataset) is also found where Debian's `dataset-fashion-mnist`
package puts it (`FASHION_MNIST_SYSTEM_DIR`), so it needs no network on such a machine.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Split", "load", "require", "from_tensors", "register", "unregister", "names", "version", "source_version",
           "write_fake_cifar", "write_idx", "read_idx", "DATASETS",
           "FASHION_MNIST_SYSTEM_DIR", "FASHION_MNIST_CLASSES", "fashion_mnist_locations", "subset", "subset_indices",
           "SUBSET_SEED"]


@dataclass
class Split:
    """One split of a dataset, held as tensors."""

    x: torch.Tensor
    y: torch.Tensor
    classes: list
    name: str
    owner: torch.Tensor | None = None  # each sample's natural client (partition "natural"), where the data has them
    roles: list | None = None          # the natural clients' names, by owner (Shakespeare's "play/ROLE")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def from_tensors(x, y, name: str = "custom", classes=None, owner=None) -> Split:
    """Wrap user tensors as a Split, with checks: images (x: N,C,H,W floats) or token windows (x: N,L integers,
    e.g. character codes; `y` the token that follows), y: N ints; `owner` (N ints, optional): each sample's natural
    client (partition "natural": client c holds the samples owned by c)."""
    x = torch.as_tensor(x)
    text = not x.is_floating_point() and x.dtype != torch.bool and x.ndim == 2
    x = x.to(torch.long) if text else x.to(torch.float32)
    y = torch.as_tensor(y)
    if x.ndim != 4 and not text:
        raise ValueError(f"x must be images of shape (N, C, H, W) or integer token windows (N, L); got "
                         f"{x.dtype} {tuple(x.shape)}")
    if y.ndim != 1 or y.dtype.is_floating_point or y.dtype == torch.bool:
        raise ValueError("y must be a 1-D integer tensor of class labels")
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length: {len(x)} vs {len(y)}")
    y = y.to(torch.long)
    if classes is None:
        classes = [str(c) for c in range(int(y.max()) + 1)]
    if owner is not None:
        owner = torch.as_tensor(owner)
        if owner.shape != y.shape or owner.is_floating_point() or int(owner.min()) < 0:
            raise ValueError("owner must be N non-negative integers: each sample's natural client")
        owner = owner.to(torch.long)
    return Split(x.contiguous(), y, list(classes), name, owner)


SUBSET_SEED = 0  # the seed of every train_subset: a fixed property of the dataset, not of a run


def subset_indices(split: Split, n: int) -> np.ndarray:
    """The sorted indices of `subset(split, n)`: a fixed, stratified choice of `n` images (each class's share kept,
    to within one image; chosen by SUBSET_SEED). n >= len: every index."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"train_subset must be a positive number of images; got {n!r}")
    if n >= len(split):
        return np.arange(len(split))
    rng = np.random.default_rng(SUBSET_SEED)
    labels = split.y.numpy()
    classes, counts = np.unique(labels, return_counts=True)
    quota = np.floor(counts * n / labels.size).astype(int)
    for i in np.argsort(-(counts * n / labels.size - quota), kind="stable")[: n - quota.sum()]:
        quota[i] += 1  # largest remainders first: the quotas sum to n
    keep = np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:q] for c, q in zip(classes, quota)])
    return np.sort(keep)


def subset(split: Split, n: int) -> Split:
    """A fixed, stratified subset of `n` images of `split` (each class's share kept, to within one image; chosen
    by SUBSET_SEED, so every run and seed sees the same images, in their original order). n >= len: the split."""
    keep = subset_indices(split, n)
    if len(keep) == len(split):
        return split
    keep = torch.from_numpy(keep)
    owner = None if split.owner is None else split.owner[keep]
    return Split(split.x[keep], split.y[keep], split.classes, split.name, owner, split.roles)


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
}  # fashion_mnist has its own reader (_load_fashion_mnist)


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
    return Split(_normalised(images, name), torch.from_numpy(labels.astype(np.int64)), classes, name)


def _normalised(images: np.ndarray, name: str) -> torch.Tensor:
    """uint8 images (N, C, H, W) as float32 in [0, 1], standardised by `name`'s published channel statistics."""
    mean, std = _STATS[name]
    x = torch.from_numpy(np.ascontiguousarray(images)).float().div_(255.0)
    return x.sub_(torch.tensor(mean).view(1, -1, 1, 1)).div_(torch.tensor(std).view(1, -1, 1, 1))


def _memoised(paths, read):
    """`read()`, kept in _MEMO while the files at `paths` keep their sizes and modification times."""
    stamp = tuple((os.path.abspath(p), os.path.getsize(p), os.path.getmtime(p)) for p in paths)
    if stamp not in _MEMO:
        _MEMO.clear()
        _MEMO[stamp] = read()
    return _MEMO[stamp]


_MEMO: dict = {}  # (file paths, sizes, mtimes) -> (train, test) of the last dataset read from files


def _load_torchvision(name: str, root: str, download: bool) -> tuple[Split, Split]:
    """Read (or fetch) a torchvision dataset. The last one read is kept in memory while its files are
    unchanged, so the many runs of a notebook in one process parse it once (treat its tensors as read-only)."""
    paths = [os.path.join(root, f) for f in _FILES[name]]
    if all(os.path.isfile(p) for p in paths):
        return _memoised(paths, lambda: _read_torchvision(name, root, download=False))
    return _read_torchvision(name, root, download)


def _read_torchvision(name: str, root: str, download: bool) -> tuple[Split, Split]:
    missing = [f for f in _FILES[name] if not os.path.isfile(os.path.join(root, f))]
    if missing and not download:
        raise FileNotFoundError(
            f"dataset {name!r} is not under {root!r} (missing: {', '.join(missing)}). "
            f"Fetch it with fedfrozen.inputs.data.load({name!r}, root={root!r}, download=True) "
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


# --- Fashion-MNIST: IDX files, from data/, the Debian package, or a download ---------------

FASHION_MNIST_SYSTEM_DIR = "/usr/share/datasets/fashion-mnist"  # Debian: apt-get install dataset-fashion-mnist
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                         "Bag", "Ankle boot"]
_FMNIST_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte")
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str) -> np.ndarray:
    """Read one IDX file (LeCun's MNIST format: magic 0x0000TTDD, DD dimensions of big-endian uint32,
    then the data), plain or gzip-compressed (by its `.gz` name); a clear error for anything else."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4].hex() or 'empty'})")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    start, count = 4 + 4 * ndim, int(np.prod(shape)) if shape else 0
    if len(raw) - start != count * dtype.itemsize:
        raise ValueError(f"{path}: header says {shape} ({count * dtype.itemsize} bytes of data), "
                         f"the file holds {len(raw) - start}")
    return np.frombuffer(bytearray(raw), dtype=dtype, offset=start).reshape(shape)  # writable (torch needs it)


def write_idx(path, arr: np.ndarray) -> str:
    """Write `arr` (uint8) as an IDX file, gzip-compressed when `path` ends in `.gz` (for tests and stand-ins)."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + arr.tobytes())
    return str(path)


def _idx_files(folder: str) -> list[str] | None:
    """The four Fashion-MNIST files in `folder` (each plain or .gz), or None if any is missing."""
    found = []
    for stem in _FMNIST_STEMS:
        path = next((os.path.join(folder, stem + ext) for ext in ("", ".gz")
                     if os.path.isfile(os.path.join(folder, stem + ext))), None)
        if path is None:
            return None
        found.append(path)
    return found


def fashion_mnist_locations(root: str) -> list[str]:
    """Where `load("fashion_mnist", root)` looks, in order: torchvision's layout under `root`, then Debian's."""
    return [os.path.join(root, "FashionMNIST", "raw"), FASHION_MNIST_SYSTEM_DIR]


def _fashion_mnist_missing(root: str) -> FileNotFoundError:
    places = fashion_mnist_locations(root)
    return FileNotFoundError(
        f"dataset 'fashion_mnist' was found in none of its three sources: (1) torchvision's files under "
        f"{places[0]!r}; (2) Debian's package at {places[1]!r} (`apt-get install dataset-fashion-mnist`); "
        f"(3) a download: fedfrozen.inputs.data.load('fashion_mnist', root={root!r}, download=True) "
        f"or `fedfrozen run --dataset fashion_mnist --download`")


def require(name: str, root: str = "data", download: bool = False) -> None:
    """Raise `load`'s FileNotFoundError now when the files of `name` are not under `root` and `download` is False
    (fashion_mnist, shakespeare: a run checks this before it takes its cache lock, so a refused run leaves nothing
    on disk); nothing for the other datasets (embedded, registered, or checked by torchvision when loaded)."""
    if download:
        return
    if name == "fashion_mnist" and not any(map(_idx_files, fashion_mnist_locations(root))):
        raise _fashion_mnist_missing(root)
    if name == "shakespeare":
        from . import shakespeare

        shakespeare.locate(root)


def _load_fashion_mnist(root: str, download: bool) -> tuple[Split, Split]:
    places = fashion_mnist_locations(root)
    files = next((f for f in map(_idx_files, places) if f), None)
    if files is None:
        if not download:
            raise _fashion_mnist_missing(root)
        try:
            _open_torchvision("fashion_mnist", root, True, True)
            _open_torchvision("fashion_mnist", root, False, True)
        except (OSError, RuntimeError) as e:
            raise ValueError(f"dataset 'fashion_mnist': the download to {root!r} failed ({type(e).__name__}: "
                             f"{str(e)[:200]}); the three ways to the data: (1) put the four IDX files in "
                             f"{places[0]!r}; (2) `apt-get install dataset-fashion-mnist` (Debian, to {places[1]!r}); "
                             f"(3) the same download again where the network reaches its mirrors") from None
        files = _idx_files(places[0])
    return _memoised(files, lambda: _read_fashion_mnist(files))


def _read_fashion_mnist(files) -> tuple[Split, Split]:
    arrays = [read_idx(p) for p in files]
    splits = []
    for (img, lab), split, path in ((arrays[:2], "train", files[0]), (arrays[2:], "test", files[2])):
        if img.ndim != 3 or lab.ndim != 1 or len(img) != len(lab):
            raise ValueError(f"fashion_mnist {split} files disagree: images {img.shape}, labels {lab.shape} ({path})")
        splits.append(Split(_normalised(img[:, None], "fashion_mnist").contiguous(),
                            torch.from_numpy(lab.astype(np.int64)), list(FASHION_MNIST_CLASSES), "fashion_mnist"))
    return tuple(splits)


DATASETS = ("digits", "cifar10", "cifar100", "svhn", "fashion_mnist", "shakespeare")
_REGISTERED: dict = {}  # name -> (loader, version): a user's own datasets (register)
_LOADED: dict = {}      # (name, version) -> (train, test), each registered dataset read once per process


def register(name: str, loader, *, version, replace: bool = False) -> None:
    """Make a user's own data a dataset: `Config(dataset=name)` then partitions, trains, caches and keys it like the
    built-ins (docs/extending.md).

    `loader()` (no arguments) returns `(train, test)`, each a `Split` (`from_tensors`) or an `(x, y)` pair: images
    (N, C, H, W) as floats, normalised as the model should see them, and integer labels 0..K-1 (K from the train
    split's `classes`, else its largest label + 1). It is called once per process, when a run first needs it, and
    checked then (shapes, labels, both splits alike) before any training. `version` (a string or an int) enters the
    cache key of every run on the dataset: change it whenever the loader's output changes, so that no stale run is
    served. `fedfrozen.run_many` hands the loaded splits to its worker processes; a Flower node is another process,
    where the dataset is not registered (`fedfrozen.flower.check_supported` refuses it by name)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"register: name must be a Python identifier (a Config.dataset value); got {name!r}")
    if name in DATASETS:
        raise ValueError(f"register: {name!r} is a built-in dataset; choose another name")
    if name in _REGISTERED and not replace:
        raise ValueError(f"register: dataset {name!r} is registered already (replace=True to change it)")
    if not callable(loader):
        raise TypeError(f"register: loader must be a function returning (train, test); got {type(loader).__name__}")
    if isinstance(version, bool) or not isinstance(version, (str, int)) or str(version) == "":
        raise ValueError(f"register: version must be a non-empty string or an int (it enters the cache key); "
                         f"got {version!r}")
    _REGISTERED[name] = (loader, str(version))


def unregister(name: str) -> None:
    """Forget a registered dataset (a built-in cannot be)."""
    if name not in _REGISTERED:
        raise ValueError(f"unregister: no registered dataset {name!r}; registered: {', '.join(_REGISTERED) or 'none'}")
    _REGISTERED.pop(name)
    for key in [k for k in _LOADED if k[0] == name]:  # its splits, read while it was registered
        del _LOADED[key]


def names() -> tuple:
    """Every dataset name a Config accepts: the built-ins, then the registered ones."""
    return DATASETS + tuple(_REGISTERED)


def version(name: str) -> str | None:
    """The version a registered dataset was given (None for a built-in)."""
    return _REGISTERED[name][1] if name in _REGISTERED else None


def source_version(cfg) -> str | None:
    """What identifies the data a run of `cfg` reads beyond its dataset's name, where that can vary: for
    "shakespeare", None for the verified release and "texts-<digest>" for other texts under cfg.data_root
    (shakespeare.source_version); None for every other dataset."""
    if cfg.dataset != "shakespeare":
        return None
    from . import shakespeare

    return shakespeare.source_version(cfg.data_root)


def _load_registered(name: str) -> tuple[Split, Split]:
    loader, v = _REGISTERED[name]
    if (name, v) not in _LOADED:
        _LOADED[name, v] = _checked(name, loader())
    return _LOADED[name, v]


def _checked(name: str, out) -> tuple[Split, Split]:
    """The loader's (train, test) as Splits, or a ValueError naming what is wrong."""
    where = f"dataset {name!r} (ff.data.register)"
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise ValueError(f"{where}: the loader must return (train, test); got {type(out).__name__}")
    splits = []
    for part, got in zip(("train", "test"), out):
        if not isinstance(got, Split):
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                raise ValueError(f"{where}: {part} must be a Split or an (x, y) pair; got {type(got).__name__}")
            try:
                got = from_tensors(*got, name=name, classes=splits[0].classes if splits else None)
            except (ValueError, TypeError, RuntimeError) as e:
                raise ValueError(f"{where}: {part}: {e}") from None
        splits.append(got)
    train, test = splits
    for part, split in (("train", train), ("test", test)):
        if len(split) == 0:
            raise ValueError(f"{where}: the {part} split is empty")
        text = split.x.ndim == 2 and not split.x.is_floating_point()
        if not text and (split.x.ndim != 4 or not split.x.is_floating_point()):
            raise ValueError(f"{where}: {part} images must be floats of shape (N, C, H, W) (or token windows: "
                             f"integers (N, L)); got {split.x.dtype} {tuple(split.x.shape)}")
        if split.y.dtype != torch.long or split.y.ndim != 1 or len(split.y) != len(split.x):
            raise ValueError(f"{where}: {part} labels must be N int64 class indices")
        low, high = int(split.y.min()), int(split.y.max())
        if low < 0 or high >= len(train.classes):
            raise ValueError(f"{where}: {part} labels run from {low} to {high}; they must lie in "
                             f"0..{len(train.classes) - 1} (the train split's {len(train.classes)} classes)")
    if tuple(train.x.shape[1:]) != tuple(test.x.shape[1:]):
        raise ValueError(f"{where}: train samples are {tuple(train.x.shape[1:])} but test samples "
                         f"{tuple(test.x.shape[1:])}")
    if (train.owner is None) != (test.owner is None):
        raise ValueError(f"{where}: give owner (natural clients) for both splits or neither")
    if len(train.classes) < 2:
        raise ValueError(f"{where}: one class only; a classifier needs two or more")
    return (Split(train.x, train.y, list(train.classes), name, train.owner),
            Split(test.x, test.y, list(train.classes), name, test.owner))


def load(name: str, root: str = "data", download: bool = False) -> tuple[Split, Split]:
    """Load dataset `name` as `(train, test)` Splits of normalised tensors.

    `digits` is embedded (scikit-learn); the others are read from `root` in torchvision's
    format and fetched only with `download=True`. `fashion_mnist` is looked for, in order, in
    `root`/FashionMNIST/raw (plain or .gz IDX files), at FASHION_MNIST_SYSTEM_DIR (Debian's
    package), then downloaded if `download=True`; the loaded tensors are kept while the files are
    unchanged (treat them as read-only). A name given to `register` is its loader's output, read once.
    """
    if name in _REGISTERED:
        return _load_registered(name)
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(names())} (or ff.data.register your own)")
    if name == "digits":
        return _load_digits()
    if name == "fashion_mnist":
        return _load_fashion_mnist(root, download)
    if name == "shakespeare":
        return _load_shakespeare(root, download)
    return _load_torchvision(name, root, download)


# --- Shakespeare: each role of each play a client, next-character prediction (LEAF) ------------------------------

SHAKESPEARE_WINDOW = 80        # characters a sample sees (LEAF's)
SHAKESPEARE_TEST_SHARE = 0.2   # each role's last 20% is its test text
SHAKESPEARE_MIN_CHARS = 2000   # roles shorter than this are not clients (424 of the 1,314 roles are kept)
UNKNOWN = "\x00"               # the vocabulary's unknown symbol: a test character no training text holds
# plays whose roles are never clients: the server's text for a pretrained start (pretrain_task="plays")
SHAKESPEARE_PRETRAIN_PLAYS = ("comedy_of_errors", "henry_vi_part_1", "john", "merry_wives_of_windsor", "pericles",
                              "two_gentlemen_of_verona")


def text_windows(text: str, index: dict, window: int = SHAKESPEARE_WINDOW):
    """(x, y) of a text: every window of `window` characters (uint8 codes of `index`, unknown characters to the
    unknown symbol's) and the character that follows it (LEAF's samples); none for a text of `window` or fewer."""
    codes = torch.tensor([index.get(c, index[UNKNOWN]) for c in text], dtype=torch.uint8)
    if len(codes) <= window:
        return torch.zeros(0, window, dtype=torch.uint8), torch.zeros(0, dtype=torch.long)
    return codes.unfold(0, window, 1)[:-1].clone(), codes[window:].to(torch.long)


def shakespeare_splits(roles: dict, name: str = "shakespeare", min_chars: int = SHAKESPEARE_MIN_CHARS,
                       window: int = SHAKESPEARE_WINDOW, held_out=SHAKESPEARE_PRETRAIN_PLAYS):
    """(train, test) Splits of `roles` ({"play/ROLE": text}): the roles of at least `min_chars` characters, each
    split into its first 80% (training) and last 20% (test) text; the vocabulary is every character of the training
    text plus the unknown symbol (its classes). `owner` is a role's rank among the clients' roles, largest first
    (ties by name): the natural client (partition "natural": n_clients takes the n largest roles); the roles of the
    `held_out` plays are owned by no client (owner -1): their training text is the server's, for a pretrained start
    (pretrain_task "plays"), and their test text is left out."""
    kept = sorted((r for r, t in roles.items() if len(t) >= min_chars), key=lambda r: (-len(roles[r]), r))
    if not kept:
        raise ValueError(f"no role has {min_chars} characters or more")
    server = [r for r in kept if r.split("/")[0] in held_out]
    kept = [r for r in kept if r not in server] + server
    cut = {r: int(round(len(roles[r]) * (1 - SHAKESPEARE_TEST_SHARE))) for r in kept}
    vocab = sorted(set("".join(roles[r][:cut[r]] for r in kept))) + [UNKNOWN]
    if len(vocab) > 256:
        raise ValueError(f"a vocabulary of {len(vocab)} characters does not fit uint8 codes")
    index = {c: i for i, c in enumerate(vocab)}
    parts = {"train": [], "test": []}
    for rank, r in enumerate(kept):
        for part, text in (("train", roles[r][:cut[r]]), ("test", roles[r][cut[r]:])):
            if part == "test" and r in server:
                continue
            x, y = text_windows(text, index, window)
            parts[part].append((x, y, torch.full((len(y),), -1 if r in server else rank, dtype=torch.long)))
    clients = [r for r in kept if r not in server]  # the clients' roles, by owner
    return tuple(Split(torch.cat([p[0] for p in ps]), torch.cat([p[1] for p in ps]), vocab, name,
                       torch.cat([p[2] for p in ps]), clients) for ps in (parts["train"], parts["test"]))


def _load_shakespeare(root: str, download: bool) -> tuple[Split, Split]:
    from . import shakespeare

    try:
        source = shakespeare.locate(root)
    except FileNotFoundError:
        if not download:
            raise
        source = shakespeare.fetch(root)
    return _memoised([source] if source.is_file() else sorted(source.iterdir()),
                     lambda: shakespeare_splits(shakespeare.roles(shakespeare.read_plays(source))))


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
