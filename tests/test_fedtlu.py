"""FedTLU: top-k layer selection by the signal-to-noise score of the last aggregated update."""

import math

import pytest
import torch
from conftest import tiny_config
from torch import nn

import fedfrozen as ff
from fedfrozen import loop
from fedfrozen.methods.fedtlu import layer_of_parameters
from fedfrozen.nets.flat import FlatParams

N_LAYERS = 4  # tiny_config: embedding, 2 blocks, head


def _rows_without(hist, key):
    return [{k: v for k, v in r.items() if k not in (key, "seconds")} for r in hist.rows]


def test_fedtlu_with_every_layer_is_fedavg():
    tlu = ff.run(tiny_config(method="fedtlu", method_args={"k": N_LAYERS}, rounds=4), progress=False)
    avg = ff.run(tiny_config(method="fedavg", rounds=4), progress=False)
    assert _rows_without(tlu, "trained_layers") == _rows_without(avg, "trained_layers")
    assert all(r["trained_layers"] == list(range(N_LAYERS)) for r in tlu.rows)


def test_only_the_selected_layers_move_and_upload(setups):
    snaps = []
    hist = ff.run(tiny_config(method="fedtlu", method_args={"k": 1}, rounds=4),
                  callbacks=[lambda r, row, h: snaps.append(setups[-1].flat.data.clone())], progress=False)
    s = setups[-1]
    layer, n = layer_of_parameters(s.model, s.flat)
    assert n == N_LAYERS and hist.rows[0]["trained_layers"] == list(range(N_LAYERS))
    full = hist.rows[0]["bytes_up"] // s.cfg.n_clients
    for r in range(1, 4):
        chosen = hist.rows[r]["trained_layers"]
        assert len(chosen) == 1
        moved = snaps[r] != snaps[r - 1]
        assert not moved[layer != chosen[0]].any()          # every other layer bit-identical
        assert moved[layer == chosen[0]].any()
        up = int((layer == chosen[0]).sum()) * 4 * s.cfg.n_clients
        assert hist.rows[r]["bytes_up"] == up and hist.rows[r]["bytes_down"] == full * s.cfg.n_clients


def test_scores_are_the_signal_to_noise_of_the_aggregated_update(tmp_path):
    cfg = tiny_config(method="fedtlu", method_args={"k": 2}, rounds=2)
    ckpt = tmp_path / "c.pt"
    seen = []
    ff.run(cfg, callbacks=[lambda r, row, h: seen.append(1) or r == 0], checkpoint=ckpt, progress=False)
    scores = torch.load(ckpt, weights_only=True)["method"]["tlu_scores"]
    x1 = torch.load(ckpt, weights_only=True)["x"]
    s = loop.prepare(cfg)
    x0 = s.flat.data.clone()
    layer, _ = layer_of_parameters(s.model, s.flat)
    for i in range(N_LAYERS):  # FedAvg with server lr 1: the aggregated update is x1 - x0
        d = (x1 - x0)[layer == i]
        expected = d.norm() / (math.sqrt(d.numel()) * d.std(unbiased=False))
        assert scores[i].item() == pytest.approx(expected.item(), rel=1e-3), i
        assert expected.item() >= 1.0  # sqrt(1 + mean^2/var)


@pytest.mark.parametrize("method", ["fedtlu", "fedfrozen_tlu"])
def test_fedtlu_resume_equals_uninterrupted(tmp_path, method):
    cfg = tiny_config(method=method, method_args={"k": 2}, rounds=5, warmup_rounds=2)
    full = ff.run(cfg, progress=False)
    ff.run(cfg, callbacks=[lambda r, row, h: r == 2], checkpoint=tmp_path / "c.pt", progress=False)
    assert ff.run(cfg, resume_from=tmp_path / "c.pt", progress=False).same_as(full)


def test_fedfrozen_tlu_freezes_qk_and_selects_layers(setups):
    hist = ff.run(tiny_config(method="fedfrozen_tlu", method_args={"k": 2}, rounds=4, warmup_rounds=2), progress=False)
    assert [r["stage"] for r in hist.rows] == [1, 1, 2, 2] and all(len(r["trained_layers"]) == 2 for r in hist.rows[1:])
    assert hist.rows[3]["kernel_change"] == 0.0


def test_bad_k_and_models_without_blocks_are_named_before_training():
    with pytest.raises(ValueError, match=r"method_args\['k'\] of method 'fedtlu' must be >= 1"):
        tiny_config(method="fedtlu", method_args={"k": 0})
    with pytest.raises(ValueError, match="method_args\\['k'\\] of 'fedtlu' must be between 1 and the model's 4 layers"):
        ff.run(tiny_config(method="fedtlu", method_args={"k": 5}), progress=False)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    with pytest.raises(ValueError, match="numbered transformer blocks"):
        layer_of_parameters(model, FlatParams(model))
