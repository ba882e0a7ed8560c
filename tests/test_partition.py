import numpy as np
import pytest

from fedfrozen import partition as P

LABELS = np.random.default_rng(0).integers(0, 10, 2000)


def _all_parts():
    return {
        "iid": P.iid(LABELS.size, 20, seed=1),
        "dirichlet": P.dirichlet(LABELS, 20, 0.3, seed=1),
        "shards": P.shards(LABELS, 20, 2, seed=1),
        "quantity": P.quantity_skew(LABELS.size, 20, 1.0, seed=1),
    }


@pytest.mark.parametrize("name", ["iid", "dirichlet", "shards", "quantity"])
def test_every_sample_in_exactly_one_client_and_none_empty(name):
    parts = _all_parts()[name]
    assert len(parts) == 20
    allidx = np.concatenate(parts)
    assert np.array_equal(np.sort(allidx), np.arange(LABELS.size))
    assert min(len(p) for p in parts) >= 1


def test_deterministic_for_a_seed_and_seeds_differ():
    for name, fn in {"iid": lambda s: P.iid(2000, 20, s), "dir": lambda s: P.dirichlet(LABELS, 20, 0.3, s),
                     "shards": lambda s: P.shards(LABELS, 20, 2, s),
                     "quantity": lambda s: P.quantity_skew(2000, 20, 1.0, s)}.items():
        a, b, c = fn(5), fn(5), fn(6)
        assert all(np.array_equal(x, y) for x, y in zip(a, b)), name
        assert not all(np.array_equal(x, y) for x, y in zip(a, c)), name


def test_global_random_state_untouched():
    np.random.seed(123)
    before = np.random.random()
    np.random.seed(123)
    P.dirichlet(LABELS, 10, 0.5, seed=0)
    assert np.random.random() == before


def test_lower_alpha_lower_label_entropy():
    ent = [P.summary(LABELS, P.dirichlet(LABELS, 20, a, seed=0))["label_entropy_bits"].mean()
           for a in (0.05, 0.5, 10.0)]
    assert ent[0] < ent[1] < ent[2]


def test_shards_hold_exactly_k_classes():
    for k in (1, 2, 3):
        counts = P.label_counts(LABELS, P.shards(LABELS, 20, k, seed=0))
        assert ((counts > 0).sum(1) == k).all()


def test_quantity_skew_keeps_labels_iid_but_sizes_vary():
    parts = P.quantity_skew(LABELS.size, 10, 0.5, seed=0)
    sizes = np.array([len(p) for p in parts])
    assert sizes.max() > 2 * sizes.min()


def test_label_counts_and_summary():
    parts = [np.array([0, 1]), np.array([2])]
    labels = np.array([0, 0, 1])
    assert P.label_counts(labels, parts).tolist() == [[2, 0], [0, 1]]
    s = P.summary(labels, parts)
    assert s["size"].tolist() == [2, 1] and s["classes_held"].tolist() == [1, 1]
    assert s["label_entropy_bits"].tolist() == [0.0, 0.0]
    assert np.allclose(s["tv_to_global"], [1 / 3, 2 / 3])


def test_dirichlet_gives_up_with_a_clear_error():
    labels = np.repeat(np.arange(2), 50)
    with pytest.raises(ValueError, match="min_size"):
        P.dirichlet(labels, 40, 0.01, seed=0, min_size=2, max_redraws=20)


@pytest.mark.parametrize("call, param", [
    (lambda: P.dirichlet(LABELS, 10, 0.0), "alpha"),
    (lambda: P.dirichlet(LABELS, 10, -1.0), "alpha"),
    (lambda: P.iid(100, 0), "n_clients"),
    (lambda: P.iid(10, 11), "n_clients"),
    (lambda: P.dirichlet(LABELS[:5], 6, 1.0), "n_clients"),
    (lambda: P.shards(LABELS, 10, 0), "classes_per_client"),
    (lambda: P.shards(LABELS, 10, 11), "classes_per_client"),
    (lambda: P.dirichlet(LABELS.astype(float), 10, 1.0), "labels"),
    (lambda: P.dirichlet(LABELS.reshape(2, -1), 10, 1.0), "labels"),
    (lambda: P.quantity_skew(100, 10, 0.0), "beta"),
    (lambda: P.make("zipf", LABELS, 10), "partition"),
])
def test_bad_input_names_the_parameter(call, param):
    with pytest.raises(ValueError, match=param):
        call()



def test_parse_spec():
    assert P.parse_spec("iid") == {"partition": "iid"}
    assert P.parse_spec("dirichlet:0.1") == {"partition": "dirichlet", "alpha": 0.1}
    assert P.parse_spec("shards:2") == {"partition": "shards", "classes_per_client": 2}
    with pytest.raises(ValueError, match="partition spec"):
        P.parse_spec("dirichlet")


def test_parse_spec_rejects_bad_numbers():
    with pytest.raises(ValueError, match="partition spec"):
        P.parse_spec("shards:two")


def _plain_dirichlet(labels, n_clients, alpha, seed):
    """The per-class Dirichlet draw with no balancing, written out: each class's samples, in a random order, cut at
    the cumulative Dir(alpha) proportions (the draw a plain FedAvg reference uses; tools/reference_fedavg.py)."""
    rng = np.random.default_rng(seed)
    owner = np.empty(labels.size, dtype=np.int64)
    for c in range(labels.max() + 1):
        idx = rng.permutation(np.flatnonzero(labels == c))
        p = rng.dirichlet(np.full(n_clients, alpha))
        cuts = (np.cumsum(p) * idx.size).astype(np.int64)[:-1]
        owner[idx] = np.repeat(np.arange(n_clients), np.diff(np.concatenate(([0], cuts, [idx.size]))))
    return [np.flatnonzero(owner == i) for i in range(n_clients)]


def test_dirichlet_without_balance_is_the_plain_per_class_draw():
    labels = np.random.default_rng(3).integers(0, 10, 5000)
    got = P.dirichlet(labels, 20, 0.5, seed=7, min_size=1, balance=False)
    want = _plain_dirichlet(labels, 20, 0.5, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    # NIID-Bench's balancing (the default) deals a client nothing more once it holds an equal share: a different split
    balanced = P.dirichlet(labels, 20, 0.5, seed=7, min_size=1)
    assert not all(np.array_equal(a, b) for a, b in zip(balanced, want))


def test_balance_caps_what_a_full_client_is_dealt():
    """With balancing, a client is dealt a class only while it holds less than an equal share: its size before its
    last class is below n / n_clients; without it, some client at alpha 0.1 is dealt past that."""
    labels = np.repeat(np.arange(10), 300)
    share = labels.size / 30
    for balance, capped in ((True, True), (False, False)):
        parts = P.dirichlet(labels, 30, 0.1, seed=1, min_size=1, balance=balance)
        counts = P.label_counts(labels, parts)
        before_last = [row.sum() - row[np.flatnonzero(row)[-1]] for row in counts]
        assert (max(before_last) < share) == capped


def test_balance_is_a_rule_of_the_dirichlet_partition():
    with pytest.raises(ValueError, match="balance"):
        P.make("iid", np.zeros(10, dtype=int), 2, balance=False)


def test_config_dirichlet_balance_default_keeps_keys_and_refuses_other_partitions():
    import fedfrozen as ff
    from fedfrozen.runs.experiments import config_key

    base = ff.Config(partition="dirichlet", alpha=0.1)
    assert config_key(base) == config_key(base.replace(dirichlet_balance=True))  # the default: cached runs stay
    assert config_key(base) != config_key(base.replace(dirichlet_balance=False))
    with pytest.raises(ValueError, match="dirichlet_balance"):
        ff.Config(partition="iid", dirichlet_balance=False)
