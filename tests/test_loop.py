import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

import fedfrozen as ff
from fedfrozen import local, loop


def _qk_v_values(model):
    groups = ff.qkv.param_groups(model)
    params = dict(model.named_parameters())
    return ({n: params[n].detach().clone() for n in groups["qk"]},
            {n: params[n].detach().clone() for n in groups["v"]})


def test_qk_bit_identical_through_stage_two_while_v_moves():
    snapshots = []

    def grab(r, row, hist):
        snapshots.append(_qk_v_values(state["model"]))

    state = {}
    original_prepare = loop.prepare

    def spy(cfg, train=None, test=None):
        s = original_prepare(cfg, train, test)
        state["model"] = s.model
        return s

    loop.prepare = spy
    try:
        hist = ff.run(tiny_config(method="fedfrozen", rounds=4, warmup_rounds=1), callbacks=[grab], progress=False)
    finally:
        loop.prepare = original_prepare
    assert [r["stage"] for r in hist.rows] == [1, 2, 2, 2]
    qk1, v1 = snapshots[0]  # after round 0: the kernel frozen from round 1 on
    for qk, v in snapshots[1:]:
        assert all(torch.equal(qk[n], qk1[n]) for n in qk1)
        assert any(not torch.equal(v[n], v1[n]) for n in v1)
        v1 = v
    assert hist.rows[1]["kernel_change"] == 0.0 and hist.rows[0]["kernel_change"] > 0


def test_stage_two_upload_is_smaller_by_exactly_the_qk_bytes():
    cfg = tiny_config(method="fedfrozen", rounds=3, warmup_rounds=1)
    hist = ff.run(cfg, progress=False)
    model = ff.qkv.split_qkv(ff.models.create("vit_digits", 10, **cfg.model_kwargs))
    sizes = ff.qkv.group_sizes(model)
    total = sum(s["bytes"] for s in sizes.values())
    n = cfg.n_clients
    assert hist.rows[0]["bytes_up"] == n * total
    assert hist.rows[1]["bytes_up"] == n * (total - sizes["qk"]["bytes"])
    assert hist.rows[1]["bytes_down"] == n * total  # the frozen block is delivered once...
    assert hist.rows[2]["bytes_down"] == n * (total - sizes["qk"]["bytes"])  # ...then never again


def test_warmup_beyond_rounds_is_exactly_fedavg():
    a = ff.run(tiny_config(method="fedavg"), progress=False)
    b = ff.run(tiny_config(method="fedfrozen", warmup_rounds=3), progress=False)
    assert a.same_as(b)
    c = ff.run(tiny_config(method="fedfrozen", warmup_rounds=1), progress=False)
    assert not a.same_as(c)


def test_one_client_one_step_is_one_centralised_sgd_step():
    cfg = tiny_config(n_clients=1, rounds=1, local_steps=1, optimizer="sgd", momentum=0.0, weight_decay=0.0,
                      lr=0.1, batch_size=4096, val_fraction=0.0, client_holdout=0.0, partition="iid")
    s = loop.prepare(cfg)
    x0 = s.flat.data.clone()
    idx = s.client_train[0]
    # reference: a plain SGD step on the full client data from the same initial weights
    loss = F.cross_entropy(s.model(s.x[idx]), s.y[idx])
    grads = torch.autograd.grad(loss, [p for p in s.model.parameters()])
    expected = {n: p.detach() - 0.1 * g for (n, p), g in zip(s.model.named_parameters(), grads)}
    captured = {}

    def grab(r, row, hist):
        captured.update({n: p.detach().clone() for n, p in state["model"].named_parameters()})

    state = {}
    original = loop.prepare

    def spy(c, train=None, test=None):
        st = original(c, train, test)
        state["model"] = st.model
        assert torch.equal(st.flat.data, x0)  # same initialisation
        return st

    loop.prepare = spy
    try:
        ff.run(cfg, callbacks=[grab], progress=False)
    finally:
        loop.prepare = original
    for n, v in expected.items():
        assert torch.allclose(captured[n], v, atol=1e-6, rtol=0), n


def test_aggregation_weights_by_sample_count():
    cfg = tiny_config(partition="quantity", alpha=0.5, n_clients=3, rounds=1)
    s = loop.prepare(cfg)
    sizes = s.client_sizes
    assert sizes.max() > 1.5 * sizes.min()  # unequal clients
    # replay the round by hand: each client's update, averaged with weights n_i / sum n
    x0 = s.flat.data.clone()
    deltas = []
    for cid in range(3):
        s.flat.data.copy_(x0)
        opt = local.make_optimizer(cfg, s.flat)
        seed = ff.rng.seed_for("local_batches", cfg.seed, 0, cid)
        torch.manual_seed(seed)
        local.train(s, opt, cfg.lr, s.client_train[cid], torch.Generator().manual_seed(seed), steps=cfg.local_steps,
                          anchor=x0)
        deltas.append(s.flat.data - x0)
    w = sizes / sizes.sum()
    expected = x0 + sum(float(wi) * d for wi, d in zip(w, deltas))
    got = {}
    st = {}
    original = loop.prepare

    def spy(c, train=None, test=None):
        st["s"] = original(c, train, test)
        return st["s"]

    loop.prepare = spy
    try:
        ff.run(cfg, callbacks=[lambda r, row, h: got.setdefault("x", st["s"].flat.data.clone())], progress=False)
    finally:
        loop.prepare = original
    assert torch.allclose(got["x"], expected, atol=1e-6)
    uniform = x0 + sum(d / 3 for d in deltas)
    assert not torch.allclose(got["x"], uniform, atol=1e-6)


def test_same_config_same_history():
    cfg = tiny_config(method="fedfrozen", clients_per_round=2)
    a, b = ff.run(cfg, progress=False), ff.run(cfg, progress=False)
    assert a.same_as(b)
    c = ff.run(cfg.replace(seed=1), progress=False)
    assert not a.same_as(c)


@pytest.mark.parametrize("method", ["fedfrozen", "scaffold", "fedadam"])
def test_resume_equals_uninterrupted(tmp_path, method):
    cfg = tiny_config(method=method, rounds=4, warmup_rounds=2, clients_per_round=3)
    ckpt = tmp_path / "checkpoint.pt"
    full = ff.run(cfg, progress=False)
    stopped = ff.run(cfg, callbacks=[lambda r, row, h: r == 1], checkpoint=ckpt, checkpoint_every=10,
                     progress=False)  # stop after round 1 (a stop writes a checkpoint)
    assert len(stopped) == 2
    resumed = ff.run(cfg, resume_from=ckpt, progress=False)
    assert len(resumed) == 4
    assert full.same_as(resumed)
    with pytest.raises(ValueError, match="different config.*seed"):
        ff.run(cfg.replace(seed=5), resume_from=ckpt, progress=False)


def test_huge_learning_rate_is_detected_as_divergence():
    with pytest.warns(RuntimeWarning, match="diverged"):
        hist = ff.run(tiny_config(optimizer="sgd", lr=1e12, momentum=0.0, rounds=3), progress=False)
    assert hist.diverged is not None and hist.diverged["round"] < 3
    assert len(hist) == hist.diverged["round"]


def test_cache_hit_does_not_train_again(tmp_path, monkeypatch):
    cfg = tiny_config(rounds=1)
    first = ff.run_or_load(cfg, root=str(tmp_path), experiment="t", progress=False)
    assert not first.cached
    folder = tmp_path / "t" / ff.experiments.config_key(cfg)
    assert {p.name for p in folder.iterdir()} == {"config.json", "env.json", "history.json", "digest.json"}
    monkeypatch.setattr(loop, "run", lambda *a, **k: pytest.fail("trained again"))
    second = ff.run_or_load(cfg, root=str(tmp_path), experiment="t")
    assert second.cached and second.same_as(first)
    assert second.env["torch"] == torch.__version__
    assert ff.experiments.config_key(cfg) != ff.experiments.config_key(cfg.replace(seed=1))


def test_the_run_log_names_every_run_with_its_training_seconds(tmp_path, monkeypatch):
    """FEDFROZEN_RUN_LOG (`fedfrozen budget`): one line per run loaded or trained, with whether it was cached and the
    sum of its rounds' seconds (the same when it is loaded again); nothing is written when it is unset."""
    cfg = tiny_config(rounds=2)
    ff.run_or_load(cfg, root=str(tmp_path / "quiet"), experiment="t", progress=False)  # unset: no log anywhere
    log = tmp_path / "runs.jsonl"
    monkeypatch.setenv(ff.io.RUN_LOG_ENV, str(log))
    hist = ff.run_or_load(cfg, root=str(tmp_path), experiment="t", progress=False)
    ff.run_or_load(cfg, root=str(tmp_path), experiment="t", progress=False)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    seconds = sum(row["seconds"] for row in hist.rows)
    key = ff.experiments.config_key(cfg)
    assert lines == [{"key": key, "experiment": "t", "cached": False, "seconds": seconds},
                     {"key": key, "experiment": "t", "cached": True, "seconds": seconds}]
    assert seconds > 0


def test_min_client_samples_lets_a_sparser_draw_through_and_keeps_the_default_partition():
    """Dirichlet alpha 0.05 cannot give 60 digits clients two images each; with min_client_samples=1 every client
    has at least one. The default (2) is the partition of every earlier run, unchanged."""
    cfg = tiny_config(n_clients=60, alpha=0.05)
    with pytest.raises(ValueError, match="min_size=2"):
        loop.prepare(cfg)
    s = loop.prepare(cfg.replace(min_client_samples=1))
    assert min(len(t) + len(e) for t, e in zip(s.client_train, s.client_eval)) >= 1
    with pytest.raises(ValueError, match="min_client_samples"):
        cfg.replace(min_client_samples=0)
    a, b = loop.prepare(tiny_config()), loop.prepare(tiny_config(min_client_samples=2))
    assert all(torch.equal(x, y) for x, y in zip(a.client_train, b.client_train))
    assert ff.experiments.config_key(tiny_config()) == ff.experiments.config_key(tiny_config(min_client_samples=2))


def test_history_save_load_and_frame(tmp_path):
    hist = ff.run(tiny_config(rounds=2, eval_every=2), progress=False)
    df = hist.to_frame()
    assert list(df["round"]) == [0, 1] and math.isnan(df["test_acc"][0]) and df["test_acc"][1] >= 0
    for col in ["drift_qk", "drift_v", "update_norm_head", "kernel_change", "bytes_up", "client_acc_worst10"]:
        assert col in df
    hist.save(tmp_path / "h.json")
    assert ff.History.load(tmp_path / "h.json").same_as(hist)


def test_public_warm_start_trains_the_server_model_first():
    cold = ff.run(tiny_config(public_fraction=0.3, rounds=1), progress=False)
    warm = ff.run(tiny_config(public_fraction=0.3, rounds=1, init="public", server_pretrain_epochs=15),
                  progress=False)
    assert warm.rows[0]["train_loss"] < cold.rows[0]["train_loss"] - 0.2
    assert warm.rows[0]["test_acc"] > cold.rows[0]["test_acc"] + 0.1


def test_init_from_a_state_dict_file(tmp_path):
    cfg = tiny_config(rounds=1)
    torch.manual_seed(7)
    model = ff.models.create("vit_digits", 10, **cfg.model_kwargs)
    torch.save(model.state_dict(), tmp_path / "w.pt")
    s = loop.prepare(cfg.replace(init=str(tmp_path / "w.pt")))
    assert torch.equal(dict(s.model.named_parameters())["head.weight"], model.head.weight)
    with pytest.raises(ValueError, match="init"):
        loop.prepare(cfg.replace(init=str(tmp_path / "missing.pt")))


def test_client_splits_are_disjoint_and_cover_the_pool():
    cfg = tiny_config(val_fraction=0.1, public_fraction=0.1, client_holdout=0.2)
    s = loop.prepare(cfg)
    parts = [t.numpy() for t in s.client_train + s.client_eval] + [s.val_idx.numpy(), s.public_idx.numpy()]
    allidx = np.concatenate(parts)
    assert np.array_equal(np.sort(allidx), np.arange(len(s.y)))


@pytest.mark.parametrize("kw, field", [
    (dict(warmup_rounds=-1), "warmup_rounds"),
    (dict(local_epochs=1, local_steps=2), "local_epochs and local_steps"),
    (dict(clients_per_round=5), "clients_per_round"),
    (dict(method="fedmagic"), "method must be one of fedavg"),
    (dict(dataset="imagenet"), "dataset must be one of digits"),
    (dict(freeze=("keys",)), "freeze must be one of qk"),
    (dict(alpha=-0.1), "alpha"),
    (dict(lr=0), "lr"),
    (dict(partition="zipf"), "partition"),
    (dict(local_objective="feddyn"), "feddyn"),
    (dict(init="public"), "public_fraction"),
    (dict(scaffold_variant="option3"), "scaffold_variant"),
    (dict(eval_window=-1), "eval_window"),
])
def test_bad_config_names_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**kw)


def test_unknown_model_and_too_many_clients_fail_before_training():
    with pytest.raises(ValueError, match="unknown model"):
        ff.run(tiny_config(model="vit_imaginary", model_kwargs={}), progress=False)
    with pytest.raises(ValueError, match="n_clients"):
        ff.run(tiny_config(n_clients=5000, partition="iid"), progress=False)


def test_bad_checkpoint_arguments_are_named_before_training(tmp_path):
    cfg = tiny_config()
    with pytest.raises(ValueError, match="checkpoint_every"):
        ff.run(cfg, checkpoint=tmp_path / "c.pt", checkpoint_every=0, progress=False)
    with pytest.raises(ValueError, match="checkpoint_seconds"):
        ff.run(cfg, checkpoint=tmp_path / "c.pt", checkpoint_seconds=-1, progress=False)
    with pytest.raises(FileNotFoundError, match="resume_from"):
        ff.run(cfg, resume_from=tmp_path / "missing.pt", progress=False)


def test_a_late_window_is_evaluated_every_round_and_changes_nothing_else():
    """eval_window=3 of 6 rounds at eval_every=3: rounds 2, 3, 4, 5 evaluated (2 by eval_every); training is the same
    run (every non-evaluation column equal), and the late measures come from the window."""
    plain = ff.run(tiny_config(rounds=6, eval_every=3), progress=False)
    windowed = ff.run(tiny_config(rounds=6, eval_every=3, eval_window=3), progress=False)
    evaluated = [r["round"] for r in windowed.rows if r["test_acc"] is not None]
    assert evaluated == [2, 3, 4, 5]
    eval_cols = {"test_loss", "test_acc", "val_loss", "val_acc", "client_acc_mean", "client_acc_worst10",
                 "client_acc_std", "seconds"}
    def strip(h):
        return ([{k: v for k, v in r.items() if k not in eval_cols} for r in h.rows])
    assert strip(plain) == strip(windowed)
    assert windowed.window("test_acc") == [r["test_acc"] for r in windowed.rows[3:]]
    assert windowed.late_accuracy == pytest.approx(sum(windowed.window("test_acc")) / 3)
    assert math.isfinite(windowed.oscillation()) and math.isnan(plain.oscillation())  # plain: 2 evaluations, 3 apart
    assert plain.late_accuracy == pytest.approx((plain.rows[2]["test_acc"] + plain.rows[5]["test_acc"]) / 2)
    whole = ff.run(tiny_config(rounds=3, eval_every=3, eval_window=10), progress=False)  # longer than the run
    assert [r["test_acc"] is not None for r in whole.rows] == [True] * 3 and len(whole.window("test_acc")) == 3
