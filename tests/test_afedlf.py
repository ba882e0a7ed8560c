"""AFedLF: per-client frozen prefixes chosen for gain per simulated second, and a prefix cache that skips work."""

import pytest
import torch
from conftest import tiny_config

import fedfrozen as ff
from fedfrozen import local, loop
from fedfrozen.methods.afedlf import AFedLF

CFG = dict(method="afedlf", rounds=5, n_clients=4, local_steps=3, model_kwargs=dict(embed_dim=16, depth=3, num_heads=2))
EXTRA = ("sim_seconds", "sim_clock", "cache_hits", "depths", "seconds")


def _rows(hist):
    return [{k: v for k, v in r.items() if k not in EXTRA} for r in hist.rows]


def test_every_client_at_depth_zero_is_fedavg():
    a = ff.run(tiny_config(**CFG, method_args={"max_depth": 0}), progress=False)
    assert all(set(r["depths"].values()) == {0} and r["cache_hits"] == 0 for r in a.rows)
    b = ff.run(tiny_config(**{**CFG, "method": "fedavg"}), progress=False)
    assert _rows(a) == _rows(b)


def test_the_cached_prefix_gives_the_same_logits_as_recomputing_it():
    cfg = tiny_config(**CFG)
    s = loop.prepare(cfg)
    m = ff.methods.build(cfg)
    m.setup(s)
    m.begin_round(0, [0])
    m.depths[0] = 2
    forward = m.client_forward(0, 0)
    b = s.client_train[0][:7]
    s.model.eval()
    with torch.no_grad():
        assert torch.allclose(forward(b, s.x[b]), s.model(s.x[b]), atol=1e-6)


def test_a_cache_hit_really_skips_the_prefix(monkeypatch):
    prefix_calls, train_embeds = [], []
    original_prefix, original_train = AFedLF._prefix, local.train
    monkeypatch.setattr(AFedLF, "_prefix", lambda self, x, f: prefix_calls.append(f) or original_prefix(self, x, f))
    counted = set()

    def local_train(s, *a, **k):
        if id(s.model) not in counted:
            s.model.patch_embed.register_forward_hook(lambda *_: train_embeds.append(1) if inside else None)
            counted.add(id(s.model))
        global inside
        inside = True
        try:
            return original_train(s, *a, **k)
        finally:
            inside = False

    global inside
    inside = False
    monkeypatch.setattr(local, "train", local_train)
    hist = ff.run(tiny_config(**CFG), progress=False)
    deep = sum(1 for r in hist.rows for f in r["depths"].values() if f > 0)
    shallow_steps = sum(CFG["local_steps"] for r in hist.rows for f in r["depths"].values() if f == 0)
    hits = sum(r["cache_hits"] for r in hist.rows)
    assert hits > 0
    assert len(prefix_calls) == deep - hits          # a prefix is computed only on a cache miss
    assert len(train_embeds) == shallow_steps        # local steps of frozen-prefix clients never run the embedding


def test_profiles_depths_and_clock_are_seeded_and_resume_exactly(tmp_path):
    cfg = tiny_config(**CFG)
    a, b = ff.run(cfg, progress=False), ff.run(cfg, progress=False)
    assert a.same_as(b) and [r["sim_clock"] for r in a.rows] == sorted(r["sim_clock"] for r in a.rows)
    assert a.rows[-1]["sim_clock"] == pytest.approx(sum(r["sim_seconds"] for r in a.rows))
    assert len({f for r in a.rows for f in r["depths"].values()}) > 1  # depths adapt over the rounds
    ff.run(cfg, callbacks=[lambda r, row, h: r == 2], checkpoint=tmp_path / "c.pt", progress=False)
    assert ff.run(cfg, resume_from=tmp_path / "c.pt", progress=False).same_as(a)


def test_bad_depth_is_named():
    with pytest.raises(ValueError, match=r"method_args\['max_depth'\] of method 'afedlf' must be >= 0"):
        tiny_config(**CFG, method_args={"max_depth": -1})
