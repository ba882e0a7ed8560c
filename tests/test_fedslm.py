"""FedSLM [recon] (fedfrozen.methods.fedslm): clients hold SVD-truncated models of different ranks."""

import pytest
import torch
from conftest import resumed, tiny_config

import fedfrozen as ff
from fedfrozen.methods import fedslm

# the tiny model's body linears are 16 x 16 (q, k, v, proj) and 32 x 16 / 16 x 32 (MLP): full rank is 16
BASE = dict(n_clients=6, rounds=3, optimizer="sgd", lr=0.05)


def test_full_rank_without_adapters_is_fedavg(setups):
    ff.run(tiny_config(**BASE, method="fedavg"), progress=False)
    ff.run(tiny_config(**BASE, method="fedslm", method_args={"ranks": (16,)}), progress=False)
    a, b = setups[-2].flat.data, setups[-1].flat.data
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


def _method(**kw):
    cfg = tiny_config(**BASE, method="fedslm", **kw)
    s = ff.loop.prepare(cfg)
    m = ff.methods.build(cfg)
    m.setup(s)
    return cfg, s, m


def test_clients_start_from_their_groups_truncation_and_keep_its_rank():
    cfg, s, m = _method(method_args={"ranks": (2, 4, 8)})
    assert sorted(m.group.tolist()) == [0, 0, 1, 1, 2, 2]      # round-robin over a seeded permutation
    x = s.flat.data.clone()
    for cid in range(6):
        s.flat.data.copy_(x)
        m.from_server(0, cid, {})  # the clients' half decomposes the round's global weights once
        m.init_client(0, cid, None, torch.ones_like(x))
        r = m.ranks[m.group_of(cid)]
        for layer in m.layers:
            w = m._view(s.flat.data, layer)
            assert torch.linalg.matrix_rank(w).item() == r
            assert torch.allclose(w, fedslm.truncate(m._view(x, layer), r), atol=1e-5)
        # after "training" (a random change) the upload keeps the client's layers at rank r
        s.flat.data.add_(torch.randn_like(x) * 0.1)
        delta = s.flat.data - x
        acc = torch.zeros_like(x)
        m.upload(0, cid, delta)  # what the client sends
        m.aggregate(acc, cid, delta, 1.0)
        for layer in m.layers:
            assert torch.linalg.matrix_rank(m._view(x + acc, layer), atol=1e-4).item() == r


def test_adapters_add_a_rank_a_change_to_the_fixed_base():
    cfg, s, m = _method(method_args={"ranks": (4,), "adapter_rank": 2})
    x = s.flat.data.clone()
    m.from_server(0, 0, {})
    m.init_client(0, 0, None, torch.ones_like(x))
    base = [m._view(s.flat.data, layer).clone() for layer in m.layers]
    s.flat.data.add_(torch.randn_like(x) * 0.1)
    acc, delta = torch.zeros_like(x), s.flat.data - x
    m.upload(0, 0, delta)
    m.aggregate(acc, 0, delta, 1.0)
    for layer, b in zip(m.layers, base):
        change = m._view(x + acc, layer) - b
        assert torch.linalg.matrix_rank(change, atol=1e-4).item() == 2


def test_bytes_per_group_and_against_fedavg():
    cfg = tiny_config(**BASE, method="fedslm", method_args={"ranks": (2, 8)}, participation="full")
    hist = ff.run(cfg, progress=False)
    avg = ff.run(cfg.replace(method="fedavg"), progress=False)
    held = hist.rows[-1]["client_bytes_by_group"]
    s = ff.loop.prepare(cfg)
    layers = fedslm.body_linears(s.model, s.flat)
    linear = sum(m * n for _, _, m, n in layers)
    other = (s.flat.numel - linear) * 4
    assert held == [other + 4 * sum(min(r * (m + n), m * n) for _, _, m, n in layers) for r in (2, 8)]
    assert held[0] < held[1] < s.flat.numel * 4
    # at rank >= mn/(m+n) a layer is held dense: full rank costs what FedAvg's model costs
    m = ff.methods.build(cfg.replace(method_args={"ranks": (16,)}))
    m.setup(s)
    assert m.held_bytes(0) == s.flat.numel * 4
    assert hist.rows[0]["bytes_up"] == 3 * held[0] + 3 * held[1]   # 3 clients per group, no adapters
    assert hist.rows[0]["bytes_up"] < avg.rows[0]["bytes_up"]


def test_bad_ranks_are_named_before_training():
    with pytest.raises(ValueError, match=r"method_args\['ranks'\] of 'fedslm' must be increasing"):
        tiny_config(method="fedslm", method_args={"ranks": (8, 4)})
    with pytest.raises(ValueError, match=r"method_args\['ranks'\] of 'fedslm' must be increasing"):
        tiny_config(method="fedslm", method_args={"ranks": (4, 4)})
    with pytest.raises(ValueError, match=r"method_args\['ranks'\] of method 'fedslm' must be >= 1 \(each\)"):
        tiny_config(method="fedslm", method_args={"ranks": (0, 4)})
    with pytest.raises(ValueError, match="exceeds the smallest linear layer"):
        ff.run(tiny_config(method="fedslm", method_args={"ranks": (4, 17)}), progress=False)
    with pytest.raises(ValueError, match=r"method_args\['adapter_rank'\] of method 'fedslm' must be >= 0"):
        tiny_config(method="fedslm", method_args={"adapter_rank": -1})
    with pytest.raises(ValueError, match="fedslm.*engine='sequential'"):
        ff.run(tiny_config(method="fedslm", engine="batched"), progress=False)


def test_resume_equals_uninterrupted(tmp_path):
    cfg = tiny_config(**{**BASE, "rounds": 4}, method="fedslm", method_args={"ranks": (4, 8), "adapter_rank": 2})
    assert resumed(cfg, tmp_path).same_as(ff.run(cfg, progress=False))


def test_default_ranks_follow_the_model():
    assert fedslm.default_ranks(48) == (8, 16, 32)      # vit_digits
    assert fedslm.default_ranks(16) == (3, 5, 11)       # the tiny test model
    assert fedslm.default_ranks(2) == (1,)
    cfg, s, m = _method()
    assert m.ranks == (3, 5, 11)
