"""Adaptive freezing schedules: kernel_plateau and drift_ratio decide T0 from the measured History rows."""

import math

import pytest
from conftest import tiny_config

import fedfrozen as ff

INF = math.inf


def _without(hist, *keys):
    return [{k: v for k, v in r.items() if k not in (*keys, "seconds")} for r in hist.rows]


def test_kernel_plateau_with_tau_zero_never_freezes_and_is_fedavg():
    hist = ff.run(tiny_config(method="fedfrozen_plateau", freeze_tau=0.0, freeze_patience=1, rounds=4), progress=False)
    assert all(r["stage"] == 1 and r["frozen_from"] is None for r in hist.rows)
    assert _without(hist, "frozen_from") == _without(ff.run(tiny_config(method="fedavg", rounds=4), progress=False))


def test_kernel_plateau_with_tau_infinite_and_patience_one_freezes_after_round_zero():
    hist = ff.run(tiny_config(method="fedfrozen_plateau", freeze_tau=INF, freeze_patience=1, rounds=4), progress=False)
    assert [r["stage"] for r in hist.rows] == [1, 2, 2, 2] and hist.rows[0]["frozen_from"] == 1
    same = ff.run(tiny_config(method="fedfrozen", warmup_rounds=1, rounds=4), progress=False)
    assert _without(hist, "frozen_from") == _without(same)  # the adaptive T0 = 1 run is FedFrozen with T0 = 1


def test_drift_ratio_with_rho_infinite_never_freezes():
    hist = ff.run(tiny_config(method="fedfrozen_drift", freeze_rho=INF, freeze_patience=1, rounds=4), progress=False)
    assert all(r["stage"] == 1 for r in hist.rows)


def test_the_recorded_freeze_round_is_the_first_round_with_zero_kernel_change_from_then_on():
    for cfg in (tiny_config(method="fedfrozen_plateau", freeze_tau=0.9, freeze_patience=2, rounds=8),
                tiny_config(method="fedfrozen_drift", freeze_rho=0.0, freeze_patience=2, rounds=8)):
        hist = ff.run(cfg, progress=False)
        frozen_from = hist.rows[-1]["frozen_from"]
        assert frozen_from is not None, cfg.method
        changes = [r["kernel_change"] for r in hist.rows]
        first_still = next(i for i in range(len(changes)) if all(c == 0.0 for c in changes[i:]))
        assert frozen_from == first_still, (cfg.method, changes)
        assert all(r["frozen_from"] is None for r in hist.rows[:frozen_from - 1])


def test_an_adaptive_schedule_composes_with_another_base_method_and_resumes(tmp_path):
    cfg = tiny_config(method="fedprox", freeze_schedule="kernel_plateau", freeze_tau=0.9, freeze_patience=2, rounds=6)
    full = ff.run(cfg, progress=False)
    assert full.rows[-1]["stage"] == 2 and ff.methods.build(cfg).local.name == "prox"
    ff.run(cfg, callbacks=[lambda r, row, h: r == 1], checkpoint=tmp_path / "c.pt", progress=False)  # mid-streak
    assert ff.run(cfg, resume_from=tmp_path / "c.pt", progress=False).same_as(full)


@pytest.mark.parametrize("kw, field", [(dict(freeze_tau=-0.1), "freeze_tau"), (dict(freeze_rho=-1.0), "freeze_rho"),
                                       (dict(freeze_patience=0), "freeze_patience")])
def test_bad_thresholds_are_named(kw, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(method="fedfrozen_plateau", **kw)


# --- progressive: Q/K frozen layer by layer from the input up -------------------------------------------
DEEP = dict(model_kwargs=dict(embed_dim=16, depth=3, num_heads=2), rounds=5)


def test_progressive_with_tau_zero_never_freezes_and_is_fedavg():
    hist = ff.run(tiny_config(method="fedavg", freeze_schedule="progressive", freeze_tau=0.0, freeze_patience=1,
                              **DEEP), progress=False)
    assert all(r["layers_frozen_from"] == [] for r in hist.rows)
    assert _without(hist, "frozen_from", "layers_frozen_from") == _without(ff.run(tiny_config(method="fedavg", **DEEP),
                                                                                  progress=False))


def test_progressive_freezes_one_layer_per_round_from_the_bottom_and_frozen_layers_do_not_move(setups):
    hist = ff.run(tiny_config(method="fedavg", freeze_schedule="progressive", freeze_tau=INF, freeze_patience=1,
                              **DEEP), progress=False)
    assert hist.rows[-1]["layers_frozen_from"] == [1, 2, 3] and hist.rows[-1]["frozen_from"] == 3
    assert [r["stage"] for r in hist.rows] == [1, 1, 1, 2, 2]  # the whole group freezes with the last layer
    for r in hist.rows:
        frozen = sum(1 for f in r["layers_frozen_from"] if f <= r["round"])
        changes = r["kernel_change_layers"]
        assert all(c == 0.0 for c in changes[:frozen]) and all(c > 0 for c in changes[frozen:])
    uploads = [r["bytes_up"] for r in hist.rows]
    assert uploads[0] > uploads[1] > uploads[2] > uploads[3] == uploads[4]  # frozen Q/K entries are not sent


def test_progressive_resumes_and_runs_batched(tmp_path):
    cfg = tiny_config(method="fedavg", freeze_schedule="progressive", freeze_tau=INF, freeze_patience=2, **DEEP)
    full = ff.run(cfg, progress=False)
    ckpt = tmp_path / "c.pt"
    ff.run(cfg, callbacks=[lambda r, row, h: r == 1], checkpoint=ckpt, progress=False)
    assert _without(ff.run(cfg, resume_from=ckpt, progress=False)) == _without(full)
    batched = ff.run(cfg.replace(engine="batched"), progress=False)
    assert [r["layers_frozen_from"] for r in batched.rows] == [r["layers_frozen_from"] for r in full.rows]
    assert [r["bytes_up"] for r in batched.rows] == [r["bytes_up"] for r in full.rows]


def test_progressive_needs_the_query_key_block():
    with pytest.raises(ValueError, match="progressive.*freeze must be"):
        tiny_config(method="fedavg", freeze_schedule="progressive", freeze=("v",))
