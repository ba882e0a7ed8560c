"""Client partitioners: which training samples each client holds.

Every partitioner returns `list[np.ndarray]`, one sorted array of sample indices per client,
covering every sample exactly once. Each takes a `seed` and draws from its own
`np.random.Generator`; global random state is never touched.
"""

from __future__ import annotations

import numpy as np

__all__ = ["iid", "dirichlet", "shards", "quantity_skew", "label_counts", "summary", "parse_spec", "make", "PARTITIONS",
           "MIN_SIZE_RULES"]

PARTITIONS = ("iid", "dirichlet", "shards", "quantity", "natural")
# how a Dirichlet draw gives every client its `min_size` samples: "redraw" repeats the whole draw until it does
# (NIID-Bench's way: bounded, then an error); "deal" deals every client `min_size` samples drawn at random first and
# the Dirichlet draw deals the rest, once (for federations where no draw would do, e.g. 1,000 clients at alpha 0.1)
MIN_SIZE_RULES = ("redraw", "deal")


# --- validation -------------------------------------------------------------------------

def _check_labels(labels) -> np.ndarray:
    if hasattr(labels, "numpy"):  # torch tensor
        labels = labels.detach().cpu().numpy()
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array; got dtype {labels.dtype}, "
                         f"shape {labels.shape}")
    if labels.size and labels.min() < 0:
        raise ValueError("labels must be non-negative class indices")
    return labels


def _check_clients(n_clients, n_samples: int) -> int:
    if isinstance(n_clients, bool) or not isinstance(n_clients, (int, np.integer)):
        raise ValueError(f"n_clients must be an integer; got {n_clients!r}")
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1; got {n_clients}")
    if n_clients > n_samples:
        raise ValueError(f"n_clients ({n_clients}) must not exceed the number of samples "
                         f"({n_samples}): some client would be empty")
    return int(n_clients)


def _check_positive(value, name: str) -> float:
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be > 0; got {value}")
    return float(value)


def _check_min_size(min_size: int, n_clients: int, n_samples: int) -> None:
    if min_size < 0 or min_size * n_clients > n_samples:
        raise ValueError(f"min_size ({min_size}) times n_clients ({n_clients}) must not exceed "
                         f"the number of samples ({n_samples})")


def _from_owner(owner: np.ndarray, n_clients: int) -> list[np.ndarray]:
    """Turn an owner-per-sample array into one sorted index array per client."""
    order = np.argsort(owner, kind="stable")
    bounds = np.cumsum(np.bincount(owner, minlength=n_clients))[:-1]
    return np.split(order, bounds)


# --- partitioners -----------------------------------------------------------------------

def iid(n_samples: int, n_clients: int, seed: int = 0) -> list[np.ndarray]:
    """Uniformly random split into `n_clients` parts of (almost) equal size."""
    n_samples = int(n_samples)
    n_clients = _check_clients(n_clients, n_samples)
    rng = np.random.default_rng(seed)
    return [np.sort(p) for p in np.array_split(rng.permutation(n_samples), n_clients)]


def dirichlet(labels, n_clients: int, alpha: float, seed: int = 0, min_size: int = 2,
              max_redraws: int = 1000, min_size_by: str = "redraw", balance: bool = True) -> list[np.ndarray]:
    """Label-Dirichlet skew (the NIID-Bench scheme, Li et al. 2022).

    For every class, proportions over clients are drawn from Dir(alpha) and the class's
    samples are dealt out accordingly; with `balance` (the default), clients already holding more than an
    equal share get no more (NIID-Bench's balancing; Flower Datasets' `self_balancing`). Balancing leaves a more
    skewed federation, not a milder one: the classes dealt last go only to the clients still below their share (at
    alpha 0.1 over the cpu profile's 100 clients, 18% of them hold one class against 10% on the plain draw, and
    FedAvg ends ~5 points lower: docs/claims.md, "FedAvg's level"). The whole draw is repeated until every client has at
    least `min_size` samples, at most `max_redraws` times; then a ValueError says what to
    change, instead of looping for ever at small alpha with many clients. With `min_size_by="deal"`
    every client is first dealt `min_size` samples drawn uniformly at random (whatever their class),
    and one draw deals the rest (MIN_SIZE_RULES).
    """
    labels = _check_labels(labels)
    n = labels.size
    n_clients = _check_clients(n_clients, n)
    alpha = _check_positive(alpha, "alpha")
    _check_min_size(min_size, n_clients, n)
    if min_size_by not in MIN_SIZE_RULES:
        raise ValueError(f"min_size_by must be one of {', '.join(MIN_SIZE_RULES)}; got {min_size_by!r}")
    rng = np.random.default_rng(seed)
    owner0 = np.full(n, -1, dtype=np.int64)
    sizes0 = np.zeros(n_clients, dtype=np.int64)
    if min_size_by == "deal":  # min_size samples each, at random, before the draw; then one draw deals the rest
        dealt = rng.permutation(n)[:min_size * n_clients]
        owner0[dealt] = np.repeat(np.arange(n_clients), min_size)
        sizes0 += min_size
        max_redraws = 1
    by_class = [np.flatnonzero((labels == c) & (owner0 < 0)) for c in range(int(labels.max()) + 1)]
    by_class = [idx for idx in by_class if idx.size]
    fair_share = n / n_clients
    for _ in range(max_redraws):
        owner = owner0.copy()
        sizes = sizes0.copy()
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(n_clients, alpha))
            if balance:
                p = p * (sizes < fair_share)
            total = p.sum()
            p = p / total if total > 0 else np.full(n_clients, 1.0 / n_clients)
            cuts = (np.cumsum(p) * idx.size).astype(np.int64)[:-1]
            counts = np.diff(np.concatenate(([0], cuts, [idx.size])))
            owner[idx] = np.repeat(np.arange(n_clients), counts)
            sizes += counts
        if sizes.min() >= min_size:
            return _from_owner(owner, n_clients)
    raise ValueError(
        f"dirichlet: no draw in {max_redraws} gave every one of {n_clients} clients at least "
        f"min_size={min_size} samples (alpha={alpha}, {n} samples). Raise alpha, use fewer "
        f"clients, or lower min_size.")


def shards(labels, n_clients: int, classes_per_client: int, seed: int = 0) -> list[np.ndarray]:
    """Pathological label skew: every client holds exactly `classes_per_client` classes.

    Classes are laid on a random cycle; client i takes the `classes_per_client` consecutive
    classes starting at position i * classes_per_client, so every class is used about
    equally often, and each class's samples are split evenly among its holders.
    """
    labels = _check_labels(labels)
    n_clients = _check_clients(n_clients, labels.size)
    classes = np.unique(labels)
    n_classes = classes.size
    if (isinstance(classes_per_client, bool) or not isinstance(classes_per_client, (int, np.integer))
            or not 1 <= classes_per_client <= n_classes):
        raise ValueError(f"classes_per_client must be an integer in [1, {n_classes}]; "
                         f"got {classes_per_client!r}")
    if n_clients * classes_per_client < n_classes:
        raise ValueError(f"classes_per_client ({classes_per_client}) x n_clients ({n_clients}) must "
                         f"be >= the number of classes ({n_classes}) so that every sample is held")
    rng = np.random.default_rng(seed)
    cycle = rng.permutation(classes)
    holders = {int(c): [] for c in classes}
    for client in range(n_clients):
        for j in range(classes_per_client):
            holders[int(cycle[(client * classes_per_client + j) % n_classes])].append(client)
    owner = np.empty(labels.size, dtype=np.int64)
    for c, clients in holders.items():
        idx = rng.permutation(np.flatnonzero(labels == c))
        if idx.size < len(clients):
            raise ValueError(f"class {c} has {idx.size} samples for {len(clients)} clients; "
                             f"lower n_clients or classes_per_client")
        for client, part in zip(clients, np.array_split(idx, len(clients))):
            owner[part] = client
    return _from_owner(owner, n_clients)


def quantity_skew(n_samples: int, n_clients: int, beta: float, seed: int = 0, min_size: int = 2,
                  max_redraws: int = 1000) -> list[np.ndarray]:
    """Quantity skew: client sizes from Dir(beta), labels IID (NIID-Bench)."""
    n_samples = int(n_samples)
    n_clients = _check_clients(n_clients, n_samples)
    beta = _check_positive(beta, "beta")
    _check_min_size(min_size, n_clients, n_samples)
    rng = np.random.default_rng(seed)
    for _ in range(max_redraws):
        p = rng.dirichlet(np.full(n_clients, beta))
        cuts = (np.cumsum(p) * n_samples).astype(np.int64)[:-1]
        sizes = np.diff(np.concatenate(([0], cuts, [n_samples])))
        if sizes.min() >= min_size:
            perm = rng.permutation(n_samples)
            return [np.sort(part) for part in np.split(perm, cuts)]
    raise ValueError(f"quantity_skew: no draw in {max_redraws} gave every client at least "
                     f"min_size={min_size} samples (beta={beta}); raise beta or lower min_size")


# --- statistics -------------------------------------------------------------------------

def label_counts(labels, parts, n_classes: int | None = None) -> np.ndarray:
    """Array (n_clients, n_classes): how many samples of each class each client holds."""
    labels = _check_labels(labels)
    n_classes = int(labels.max()) + 1 if n_classes is None else int(n_classes)
    return np.stack([np.bincount(labels[p], minlength=n_classes) for p in parts])


def summary(labels, parts):
    """DataFrame, one row per client: size, classes held, label entropy (bits) and the
    total-variation distance of its label distribution to the global one."""
    import pandas as pd

    counts = label_counts(labels, parts).astype(float)
    sizes = counts.sum(1)
    dist = counts / np.maximum(sizes[:, None], 1)
    glob = counts.sum(0) / counts.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = -np.nansum(np.where(dist > 0, dist * np.log2(dist), 0.0), axis=1)
    return pd.DataFrame({
        "client": np.arange(len(parts)),
        "size": sizes.astype(int),
        "classes_held": (counts > 0).sum(1),
        "label_entropy_bits": entropy,
        "tv_to_global": 0.5 * np.abs(dist - glob).sum(1),
    }).set_index("client")


def parse_spec(spec: str) -> dict:
    """Config fields of a partition spec: "iid", "dirichlet:0.1", "shards:2", "quantity:0.5"."""
    name, _, arg = spec.partition(":")
    error = ValueError(f"partition spec must be iid, dirichlet:ALPHA, shards:K or quantity:BETA; got {spec!r}")
    if name == "iid" and not arg:
        return {"partition": "iid"}
    try:
        if name in ("dirichlet", "quantity") and arg:
            return {"partition": name, "alpha": float(arg)}
        if name == "shards" and arg:
            return {"partition": "shards", "classes_per_client": int(arg)}
    except ValueError:
        raise error from None
    raise error


def natural(owner, n_clients: int) -> list[np.ndarray]:
    """The clients the dataset defines: client c holds the samples whose owner is c (a dataset orders its natural
    clients, largest first: Shakespeare's roles); owners >= n_clients are in no client."""
    owner = np.asarray(owner)  # (negative: no client's, e.g. the server's own text)
    n_clients = _check_clients(n_clients, owner.size)
    if owner.size == 0 or owner.max() < n_clients - 1:
        raise ValueError(f"n_clients ({n_clients}) exceeds the dataset's {int(owner.max()) + 1 if owner.size else 0} "
                         f"natural clients")
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], np.arange(n_clients + 1))
    return [np.sort(order[bounds[c]:bounds[c + 1]]) for c in range(n_clients)]


def make(name: str, labels, n_clients: int, seed: int = 0, *, alpha: float = 0.5,
         classes_per_client: int = 2, min_size: int = 2, min_size_by: str = "redraw",
         balance: bool = True, owner=None) -> list[np.ndarray]:
    """Dispatch by name (`iid|dirichlet|shards|quantity|natural`); `alpha` is beta for quantity skew; `min_size_by`
    (MIN_SIZE_RULES) and `balance` are for dirichlet only; `owner` (each sample's natural client) for natural only."""
    if name == "natural":
        if owner is None:
            raise ValueError("partition 'natural' takes the clients a dataset defines; this dataset defines none "
                             "(Shakespeare's roles do)")
        return natural(owner, n_clients)
    labels = _check_labels(labels)
    if min_size_by != "redraw" and name != "dirichlet":
        raise ValueError(f"min_size_by={min_size_by!r} is a rule of partition 'dirichlet'; got partition {name!r}")
    if not balance and name != "dirichlet":
        raise ValueError(f"balance=False (Config.dirichlet_balance) is a rule of partition 'dirichlet'; got partition "
                         f"{name!r}")
    if name == "iid":
        return iid(labels.size, n_clients, seed)
    if name == "dirichlet":
        return dirichlet(labels, n_clients, alpha, seed, min_size=min_size, min_size_by=min_size_by, balance=balance)
    if name == "shards":
        return shards(labels, n_clients, classes_per_client, seed)
    if name == "quantity":
        return quantity_skew(labels.size, n_clients, alpha, seed, min_size=min_size)
    raise ValueError(f"unknown partition {name!r}; available: {', '.join(PARTITIONS)}")
