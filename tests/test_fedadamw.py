"""FedAdamW: local AdamW from the server's per-tensor second moments and step counter, pulled along the
last mean update (fedfrozen/methods/fedadamw.py)."""

import pytest
import torch
from conftest import resumed, tiny_config

import fedfrozen as ff
from fedfrozen.methods.fedadamw import FedAdamW


def rows(hist):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in hist.rows]


def test_without_pull_and_server_moments_it_is_local_adamw_which_is_fedavg():
    plain = ff.run(tiny_config(method="fedadamw", method_args={"gamma": 0.0, "server_moments": False}), progress=False)
    local = ff.run(tiny_config(method="local_adamw"), progress=False)
    assert rows(plain) == rows(local) == rows(ff.run(tiny_config(method="fedavg"), progress=False))


def test_clients_start_from_the_server_moments_and_step_counter(monkeypatch):
    seen = []
    original = FedAdamW.init_client

    def spy(self, r, cid, opt, mask):
        original(self, r, cid, opt, mask)
        full = torch.zeros_like(self.flat.data)
        offset = 0
        for s in opt.slices:
            full[s] = opt.v[offset:offset + s.stop - s.start]
            offset += s.stop - s.start
        seen.append((r, opt.t, self.t, full.clone(), self.v_bar[self.tensor_of].clone(), opt.rule.lr_scale,
                     opt.rule.weight_decay))

    monkeypatch.setattr(FedAdamW, "init_client", spy)
    cfg = tiny_config(method="fedadamw", local_steps=3, lr=1e-2, weight_decay=0.01)
    ff.run(cfg, progress=False)
    for r, opt_t, server_t, v, v_bar, lr, wd in seen:
        assert opt_t == server_t == 3 * r                       # the counter runs on: + K per round
        assert torch.equal(v, v_bar)                              # per tensor, the server's mean of v
        assert lr == pytest.approx(0.1) and wd == pytest.approx(0.01 / 0.1)  # the factor on the round's lr: 1 - gamma
    assert seen[0][3].abs().sum() == 0 and seen[-1][3].abs().sum() > 0


def test_exchange_counts_the_moments_and_the_mean_update():
    fa = ff.run(tiny_config(method="fedadamw"), progress=False)
    avg = ff.run(tiny_config(method="fedavg"), progress=False)
    s = ff.loop.prepare(tiny_config())
    extra = 4 * len(s.flat.param_range) * len(fa.rows[0]["clients"])  # float32 per tensor, per client
    assert fa.rows[0]["bytes_up"] == avg.rows[0]["bytes_up"] + extra
    assert fa.rows[0]["bytes_down"] == 2 * avg.rows[0]["bytes_down"] + extra
    assert rows(fa) != rows(avg)


def test_resume_equals_uninterrupted(tmp_path):
    cfg = tiny_config(method="fedadamw", rounds=4)
    assert resumed(cfg, tmp_path).same_as(ff.run(cfg, progress=False))


def test_bad_input_and_engine():
    with pytest.raises(ValueError, match=r"method_args\['gamma'\] of method 'fedadamw' must be >= 0 and < 1"):
        tiny_config(method="fedadamw", method_args={"gamma": 1.0})
    with pytest.raises(ValueError, match="optimizer must be 'adamw'"):
        ff.run(tiny_config(method="fedadamw", optimizer="sgd"), progress=False)
    with pytest.raises(ValueError, match="fedadamw.*engine='sequential'"):
        ff.run(tiny_config(method="fedadamw", engine="batched"), progress=False)
