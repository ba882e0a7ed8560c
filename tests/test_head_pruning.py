"""Head pruning: per-client head masks, confidence-weighted per-head aggregation, importance-driven selection."""

import pytest
import torch
from conftest import tiny_config
from torch import nn

import fedfrozen as ff
from fedfrozen import loop
from fedfrozen.methods.head_pruning import HeadPruning, head_index
from fedfrozen.nets.flat import FlatParams


def test_sparsity_zero_with_uniform_confidence_is_fedavg(setups):
    kw = dict(rounds=3, method_args={"sparsity": 0.0, "weighting": "uniform"})
    hp = ff.run(tiny_config(method="head_pruning", **kw), progress=False)
    x_hp = setups[-1].flat.data.clone()
    avg = ff.run(tiny_config(method="fedavg", rounds=3), progress=False)
    x_avg = setups[-1].flat.data.clone()
    # per-head sums divide by sum(p_i), which is 1 up to rounding; AdamW grows that to ~3e-6 in 3 rounds
    assert (x_hp - x_avg).abs().max() < 1e-5
    for a, b in zip(hp.rows, avg.rows):
        assert abs(a["train_loss"] - b["train_loss"]) < 1e-5 and abs(a["test_acc"] - b["test_acc"]) < 1e-4
        assert a["bytes_up"] == b["bytes_up"] + 4 * 4 * 4  # + 4 heads' confidences (float32) from 4 clients


class Recording(HeadPruning):
    def after_client(self, r, cid, delta, steps, lr, mask):
        super().after_client(r, cid, delta, steps, lr, mask)
        self.record = getattr(self, "record", []) + [(cid, delta.clone(), self.conf[cid].clone())]


def test_pruned_head_slices_stay_bit_identical_on_the_clients_that_pruned_them():
    built = []
    ff.methods.register("rec_heads", lambda cfg, **kw: built.append(Recording(cfg, **kw)) or built[-1],
                        summary="head pruning, recording updates", settings=HeadPruning.Settings)
    try:
        ff.run(tiny_config(method="rec_heads", rounds=2, method_args={"sparsity": 0.5}, weight_decay=0.1),
               progress=False)
    finally:
        ff.methods.unregister("rec_heads")
    m = built[-1]
    assert m.n_heads == 4 and m.keep == 2
    for cid, delta, conf in m.record:
        trained = conf > 0
        assert int(trained.sum()) == 2
        for h in range(m.n_heads):
            part = delta[m.head == h]
            assert (part == 0).all() != bool(trained[h]), (cid, h)  # untouched exactly when pruned
        assert (delta[~m.is_head] != 0).any()


def test_per_head_aggregation_with_one_client_per_head_returns_that_clients_head():
    cfg = tiny_config(method="head_pruning", method_args={"sparsity": 0.5},
                      model_kwargs=dict(embed_dim=16, depth=1, num_heads=2))
    s = loop.prepare(cfg)
    m = ff.methods.build(cfg)
    m.setup(s)
    m.num.zero_(), m.den.zero_()
    g = torch.Generator().manual_seed(0)
    d0, d1 = torch.randn(s.flat.numel, generator=g), torch.randn(s.flat.numel, generator=g)
    m.conf = {0: torch.tensor([0.9, 0.0]), 1: torch.tensor([0.0, 0.3])}  # client 0 trained head 0, client 1 head 1
    acc = torch.zeros(s.flat.numel)
    m.aggregate(acc, 0, d0, 0.25)
    m.aggregate(acc, 1, d1, 0.75)
    x = torch.zeros(s.flat.numel)
    m.server_update(0, x, acc, torch.ones(s.flat.numel), [0, 1])
    assert torch.allclose(x[m.head == 0], d0[m.head == 0], atol=1e-6)
    assert torch.allclose(x[m.head == 1], d1[m.head == 1], atol=1e-6)
    rest = ~m.is_head
    assert torch.allclose(x[rest], 0.25 * d0[rest] + 0.75 * d1[rest], atol=1e-6)  # everything else: FedAvg


def test_confidence_is_the_mean_max_attention_weight_in_01():
    cfg = tiny_config(method="head_pruning")
    s = loop.prepare(cfg)
    m = ff.methods.build(cfg)
    m.setup(s)
    conf, loss = m._probe(0)
    assert conf.shape == (4,) and ((conf > 0) & (conf <= 1)).all() and loss > 0
    n_tokens = 16 + 1  # 8x8 digits, patch 2 -> 16 patches; a class token when the model has one
    assert (conf >= 1 / n_tokens - 1e-6).all()  # a row's max is at least its mean
    assert all(getattr(a, "fused_attn", True) for a in m.attns)  # the fused path is restored


def test_selection_is_seeded_and_prefers_unseen_then_important_clients(tmp_path):
    cfg = tiny_config(method="head_pruning", n_clients=6, clients_per_round=2, rounds=4)
    a = ff.run(cfg, progress=False)
    b = ff.run(cfg, progress=False)
    assert [r["clients"] for r in a.rows] == [r["clients"] for r in b.rows]
    seen = {c for r in a.rows for c in r["clients"]}
    assert len(seen) >= 4  # unseen clients go first
    ff.run(cfg, callbacks=[lambda r, row, h: r == 1], checkpoint=tmp_path / "c.pt", progress=False)
    assert ff.run(cfg, resume_from=tmp_path / "c.pt", progress=False).same_as(a)


def test_bad_sparsity_and_models_without_heads_are_named():
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match=r"method_args\['sparsity'\] of method 'head_pruning'"):
            tiny_config(method="head_pruning", method_args={"sparsity": bad})
    model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="attention heads"):
        head_index(model, FlatParams(model))
