"""A plain FedAvg, in torch and timm alone, of the cpu profile's setting: the level `fedfrozen run` is checked against.

It imports nothing from fedfrozen: its own IDX reader, its own stratified subset, its own Dirichlet split, the
model built by timm from the keyword arguments written here, one `torch.optim.AdamW` (or `SGD`) made fresh for
each client in each round. What it shares with the project is only the setting (docs/cpu_profile.md):

    Fashion-MNIST, a stratified 12,000-image subset, Dirichlet 0.1 over 100 clients, 10 a round, one local epoch of
    batch 16, AdamW at 3e-3 (weight decay 0.01) under a cosine over 120 rounds, FedAvg weighted by client size.

    python tools/reference_fedavg.py --seeds 0 1 2 3 4 --jobs 2           # ~4 min a seed on one core
    python tools/reference_fedavg.py --val-fraction 0.1 --client-holdout 0.1 ...   # the project's hold-outs

Late accuracy is printed two ways: `late3`, the mean of the evaluations at rounds 100, 110, 120 (the reviewer's
window), and `late10`, the mean over every one of the last 10 rounds (the project's `late_acc` at the cpu profile).
The switches below each add one of the project's choices, so a gap can be closed one difference at a time
(docs/claims.md, "FedAvg's level").

Each seed's run is seeded from (seed, purpose) alone: the same command gives the same numbers on one machine and
thread count.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import math
import os
import struct
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F

FMNIST_DIRS = ("data/FashionMNIST/raw", "/usr/share/datasets/fashion-mnist")
MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST's training mean and std of pixels in [0, 1]
MODEL = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=48, depth=3, num_heads=4, mlp_ratio=2.0,
             qkv_bias=True, global_pool="avg", num_classes=10)


# --- data -----------------------------------------------------------------------------------

def _read_idx(path: str) -> np.ndarray:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    shape = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _find(folder: str, stem: str) -> str | None:
    for name in (stem, stem + ".gz"):
        if os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return None


def load_fashion_mnist(folders=FMNIST_DIRS):
    """(train images, train labels, test images, test labels): images float32 (N, 1, 28, 28), normalised."""
    for folder in folders:
        paths = [_find(folder, f"{s}-{k}-idx{d}-ubyte") for s in ("train", "t10k") for k, d in (("images", 3),
                                                                                                  ("labels", 1))]
        if all(paths):
            xs, ys, xt, yt = (_read_idx(p) for p in paths)
            norm = lambda a: ((torch.from_numpy(a.astype(np.float32) / 255.0) - MEAN) / STD)[:, None]  # noqa: E731
            return norm(xs), torch.from_numpy(ys.astype(np.int64)), norm(xt), torch.from_numpy(yt.astype(np.int64))
    raise SystemExit(f"Fashion-MNIST's four IDX files are in none of {', '.join(folders)} "
                     f"(apt-get install dataset-fashion-mnist)")


def stratified_subset(labels: np.ndarray, n: int, rng) -> np.ndarray:
    """n indices, n/10 of each class (Fashion-MNIST is balanced), sorted."""
    classes = np.unique(labels)
    per = n // classes.size
    return np.sort(np.concatenate([rng.choice(np.flatnonzero(labels == c), per, replace=False) for c in classes]))


def dirichlet_split(labels: np.ndarray, n_clients: int, alpha: float, rng, min_size: int = 2, cap: bool = False):
    """Label-Dirichlet skew, per class proportions over clients ~ Dir(alpha), redrawn until every client holds
    min_size samples (the usual way, Hsu et al. 2019). cap: a client already holding more than an equal share gets
    no more of the next classes (NIID-Bench's balancing, Li et al. 2022)."""
    while True:
        parts = [[] for _ in range(n_clients)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(n_clients, alpha))
            if cap:
                p = p * (np.array([len(q) for q in parts]) < labels.size / n_clients)
                p = p / p.sum()
            for i, chunk in enumerate(np.split(idx, (np.cumsum(p) * idx.size).astype(int)[:-1])):
                parts[i].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [np.array(sorted(p), dtype=np.int64) for p in parts]


def holdout(idx: np.ndarray, fraction: float, rng):
    """(kept, held out): `fraction` of `idx` at random, at least one kept."""
    idx = rng.permutation(idx)
    k = min(int(round(fraction * idx.size)), idx.size - 1) if fraction > 0 else 0
    return np.sort(idx[k:]), np.sort(idx[:k])


# --- one run ----------------------------------------------------------------------------------

def make_model(seed: int):
    import timm  # noqa: F401  (timm's VisionTransformer is the cpu profile's model)
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    return VisionTransformer(**MODEL)


@torch.no_grad()
def accuracy(model, x, y, batch: int = 1000) -> float:
    model.eval()
    hits = sum((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item() for i in range(0, len(y), batch))
    return hits / len(y)


def lr_at(base: float, r: int, rounds: int, schedule: str) -> float:
    return base * 0.5 * (1 + math.cos(math.pi * r / rounds)) if schedule == "cosine" else base


def run(seed: int, a) -> dict:
    torch.set_num_threads(a.threads)
    xs, ys, xt, yt = load_fashion_mnist([a.data] if a.data else FMNIST_DIRS)
    rng = np.random.default_rng([seed, 1])
    if a.split_file:  # another program's subset and clients (e.g. fedfrozen's, tools/export_split.py)
        given = np.load(a.split_file.format(seed=seed))
        keep = given["subset"]
        parts = [given[f"client_{i}"] for i in range(a.clients)]
    else:
        keep = stratified_subset(ys.numpy(), a.subset, np.random.default_rng(12345))  # one subset for every seed
    x, y = xs[keep], ys[keep]
    if not a.split_file:
        pool = np.arange(len(y))
        if a.val_fraction:
            pool, _ = holdout(pool, a.val_fraction, rng)
        parts = [pool[p] for p in dirichlet_split(y.numpy()[pool], a.clients, a.alpha, rng, cap=a.cap)]
        parts = [holdout(p, a.client_holdout, rng)[0] for p in parts]
    sizes = np.array([len(p) for p in parts], dtype=np.float64)

    model = make_model(seed)
    if a.init_file:
        model.load_state_dict(torch.load(a.init_file.format(seed=seed), weights_only=True))
    global_state = [p.detach().clone() for p in model.parameters()]
    sample = np.random.default_rng([seed, 2])
    gen = torch.Generator().manual_seed(seed)
    evals = {}
    for r in range(a.rounds):
        lr = lr_at(a.lr, r, a.rounds, a.schedule)
        chosen = np.sort(sample.choice(a.clients, a.per_round, replace=False))
        w = sizes[chosen] / sizes[chosen].sum()
        acc = [torch.zeros_like(g) for g in global_state]
        for wi, cid in zip(w, chosen):
            with torch.no_grad():
                for p, g in zip(model.parameters(), global_state):
                    p.copy_(g)
            if a.optimizer == "adamw":
                opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=a.weight_decay)
            else:
                opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=a.momentum, weight_decay=a.weight_decay)
            model.train()
            idx = torch.from_numpy(parts[cid])
            for _ in range(a.local_epochs):
                order = idx[torch.randperm(len(idx), generator=gen)]
                for b in order.split(a.batch):
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(model(x[b]), y[b]).backward()
                    opt.step()
            with torch.no_grad():
                for s, p, g in zip(acc, model.parameters(), global_state):
                    s.add_(p - g, alpha=float(wi))
        with torch.no_grad():
            for g, s in zip(global_state, acc):
                g.add_(s)
            for p, g in zip(model.parameters(), global_state):
                p.copy_(g)
        if (r + 1) % 10 == 0 or r >= a.rounds - 10:
            evals[r + 1] = accuracy(model, xt, yt)
    late3 = float(np.mean([evals[a.rounds - k] for k in (20, 10, 0)]))
    late10 = float(np.mean([evals[r] for r in range(a.rounds - 9, a.rounds + 1)]))
    return {"seed": seed, "late3": late3, "late10": late10, **{f"acc_{r}": v for r, v in sorted(evals.items())}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--rounds", type=int, default=120)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--subset", type=int, default=12000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--local-epochs", type=int, default=1)
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=None, help="default: 0.01 for AdamW, 0 for SGD")
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--schedule", choices=("cosine", "constant"), default="cosine")
    p.add_argument("--val-fraction", type=float, default=0.0, help="held out of the subset (the project: 0.1)")
    p.add_argument("--client-holdout", type=float, default=0.0, help="of each client's share (the project: 0.1)")
    p.add_argument("--cap", action="store_true", help="NIID-Bench's balancing in the Dirichlet split (the project's)")
    p.add_argument("--split-file", help="an .npz of `subset` (indices into the 60,000 training images) and "
                   "client_0.. (indices into the subset), {seed} filled in; replaces the subset, hold-outs and split")
    p.add_argument("--init-file", help="a torch state_dict to start from ({seed} filled in); default timm's init")
    p.add_argument("--data", help=f"the folder of the four IDX files (default: the first of {', '.join(FMNIST_DIRS)})")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1, help="seeds run side by side, one process each")
    p.add_argument("--out", help="write one row per seed to this CSV")
    a = p.parse_args(argv)
    if a.weight_decay is None:
        a.weight_decay = 0.01 if a.optimizer == "adamw" else 0.0
    if a.rounds < 30 or a.rounds % 10:
        p.error("--rounds must be a multiple of 10 and at least 30 (late3 reads the last three tens)")
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(run, a.seeds, [a] * len(a.seeds)))
    for row in rows:
        print(f"seed {row['seed']}: late3 {row['late3']:.4f}  late10 {row['late10']:.4f}", flush=True)
    for key in ("late3", "late10"):
        v = np.array([row[key] for row in rows])
        sd = v.std(ddof=1) if v.size > 1 else float("nan")
        print(f"{key}: mean {v.mean():.4f}  sd {sd:.4f}  (n={v.size})")
    print(f"{time.perf_counter() - t0:.0f} s")
    if a.out:
        tmp = a.out + ".tmp"
        with open(tmp, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows[0]))
            wr.writeheader()
            wr.writerows(rows)
        os.replace(tmp, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
