"""The batched engine (fedfrozen.engine.batched) trains exactly what the sequential engine trains."""

import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

import fedfrozen as ff
from fedfrozen import batched, local, loop

# Dirichlet alpha 0.3 over 6 clients and 1 local epoch: clients of unequal size, hence unequal numbers of
# steps (checked below) and epochs whose last batch is short. lr 1e-3 (the paper's).
BASE = dict(n_clients=6, alpha=0.3, local_steps=None, local_epochs=1, rounds=3, warmup_rounds=1, lr=1e-3)
CASES = {
    "fedavg": dict(method="fedavg"),
    "fedfrozen": dict(method="fedfrozen"),            # Q/K frozen from round 1: across the stage switch
    "fedprox": dict(method="fedprox", prox_mu=0.1),
    "value_ridge": dict(method="fedfrozen", value_l2=0.1),
    "scaffold": dict(method="scaffold"),
    "scaffold_clip": dict(method="scaffold", grad_clip=0.5),
    "fedyogi": dict(method="fedyogi"),
}


def final_weights(cfg, setups):
    hist = ff.run(cfg, progress=False)
    return setups[-1].flat, hist


def test_clients_do_unequal_numbers_of_steps():
    s = loop.prepare(tiny_config(**BASE))
    sizes = [len(t) for t in s.client_train]
    steps = {-(-n // 16) for n in sizes}
    assert len(steps) >= 3, sizes


def compare(kw, setups, fraction: float):
    flat_s, hist_s = final_weights(tiny_config(**kw, engine="sequential"), setups)
    for chunk in (1, 3, None):
        flat_b, hist_b = final_weights(tiny_config(**kw, engine="batched", engine_chunk=chunk), setups)
        close = ((flat_s.data - flat_b.data).abs() < 1e-5).float().mean().item()
        assert close >= fraction, (kw, chunk, close)
        for rs, rb in zip(hist_s.rows, hist_b.rows, strict=True):
            assert abs(rs["test_acc"] - rb["test_acc"]) < 1e-4
            assert abs(rs["test_loss"] - rb["test_loss"]) < 1e-4
            assert abs(rs["train_loss"] - rb["train_loss"]) < 1e-4
            assert (rs["stage"], rs["bytes_up"], rs["bytes_down"]) == (rb["stage"], rb["bytes_up"], rb["bytes_down"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_batched_equals_sequential_sgd(case, setups):
    """Under SGD (momentum, weight decay) every weight agrees within 1e-5 after 3 rounds."""
    compare({**BASE, **CASES[case], "optimizer": "sgd", "lr": 0.05}, setups, fraction=1.0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_batched_equals_sequential_adamw(case, setups):
    """Under AdamW, at least 99% of the weights agree within 1e-5 after 3 rounds, and the History within 1e-4.

    Not all: some directions have an analytically zero gradient (the key biases: softmax is invariant
    to adding q.b_k to every logit of a query; test_key_bias_gradient_is_zero), so their gradient is float
    noise that depends on the order of the sums, and AdamW turns noise below its eps into steps of up to
    lr * noise / eps. There the sequential engine disagrees with itself across thread counts too (FedProx,
    mu 0.1: 3.5e-4 between 1 and 2 threads), and no engine can be held to 1e-5. A wrong batched step
    moves most entries, and fails this test."""
    compare({**BASE, **CASES[case]}, setups, fraction=0.99)


def test_key_bias_gradient_is_zero():
    """The premise of `reproducible_entries`: the key biases get no gradient, up to float noise."""
    s = loop.prepare(tiny_config())
    s.flat.zero_grad()
    F.cross_entropy(s.model(s.x[:64]), s.y[:64]).backward()
    key_bias = torch.zeros(s.flat.numel, dtype=torch.bool)
    for name, (a, b) in s.flat.param_range.items():
        key_bias[a:b] = name.endswith(".k.bias")
    assert s.flat.grad[key_bias].abs().max() < 1e-6 * s.flat.grad[~key_bias].abs().max()


def test_a_finished_client_does_not_move(setups):
    """Two clients of 1 and 4 steps in one chunk: each ends where it ends when trained alone."""
    cfg = tiny_config(n_clients=2, partition="quantity", alpha=0.3, local_steps=None, local_epochs=1, batch_size=8,
                      optimizer="sgd", lr=0.05)  # SGD: no AdamW amplification of float noise (see above)
    s = loop.prepare(cfg)
    steps = [-(-len(t) // 8) for t in s.client_train]
    assert len(set(steps)) == 2, steps
    opt = local.make_optimizer(cfg, s.flat)
    layout = batched.EntryMap(s.model, s.flat, opt.slices)
    x0 = s.flat.data.clone()

    def clients(ids):
        return [SimpleNamespace(idx=s.client_train[i], gen=torch.Generator().manual_seed(i), correction=None, mask=None)
                for i in ids]

    together = batched.train_chunk(s, layout, opt.rule, cfg.lr, x0, clients([0, 1]))
    alone = [batched.train_chunk(s, layout, opt.rule, cfg.lr, x0, clients([i]))[0] for i in (0, 1)]
    for (w, loss, k), (w1, loss1, k1) in zip(together, alone):
        assert k == k1
        assert torch.allclose(w, w1, atol=1e-6) and torch.allclose(loss, loss1, atol=1e-6)


def test_batched_run_is_deterministic_and_resumes(tmp_path):
    cfg = tiny_config(**BASE, method="fedfrozen", engine="batched")
    full = ff.run(cfg, progress=False)
    again = ff.run(cfg, progress=False)
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in full.rows]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in again.rows]
    ckpt = tmp_path / "c.pt"
    ff.run(cfg, callbacks=[lambda r, row, h: r == 0], checkpoint=ckpt, progress=False)
    resumed = ff.run(cfg, resume_from=ckpt, progress=False)
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in resumed.rows]


def test_a_method_without_a_batched_path():
    with pytest.raises(ValueError, match="afedlf.*engine='sequential'"):
        ff.run(tiny_config(method="afedlf", engine="batched"), progress=False)
    auto = ff.run(tiny_config(method="afedlf", engine="auto"), progress=False)   # falls back, same result
    seq = ff.run(tiny_config(method="afedlf", engine="sequential"), progress=False)
    assert [r["test_acc"] for r in auto.rows] == [r["test_acc"] for r in seq.rows]


def test_a_model_with_random_layers_is_refused():
    cfg = tiny_config(model_kwargs=dict(embed_dim=16, depth=1, num_heads=2, drop_rate=0.1), engine="batched")
    with pytest.raises(ValueError, match="random layers.*Dropout"):
        ff.run(cfg, progress=False)


def test_engine_fields_are_checked():
    with pytest.raises(ValueError, match="engine must be one of"):
        tiny_config(engine="vmap")
    with pytest.raises(ValueError, match="engine_chunk"):
        tiny_config(engine_chunk=0)
    with pytest.raises(ValueError, match="engine_compile"):
        tiny_config(engine_compile="yes")


def test_a_failing_compiler_falls_back_to_eager(monkeypatch):
    def broken(fn, **kw):
        def run(*a):
            raise RuntimeError("no C++ compiler")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(batched, "_STEPS", {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hist = ff.run(tiny_config(engine="batched", engine_compile=True, rounds=1), progress=False)
    assert any("torch.compile failed" in str(w.message) for w in caught)
    eager = ff.run(tiny_config(engine="batched", rounds=1), progress=False)
    assert hist.rows[0]["test_acc"] == eager.rows[0]["test_acc"]
