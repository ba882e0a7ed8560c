"""The measures the claims are judged on (fedfrozen.studies.measures): the relative drift split into the mean step
and the clients' dispersion, read from a History's existing columns."""

import math

import pandas as pd
import pytest
import torch
from conftest import TINY, tiny_config

import fedfrozen as ff
from fedfrozen.engine.metrics import round_metrics
from fedfrozen.nets.flat import FlatParams


def _row(flat, updates, weights):
    """The History row's drift and step columns of one round whose clients sent `updates` (weights p_i), computed
    as the server does (client_sq = sum_i p_i ||D_i,g||^2 and the mean update)."""
    acc = sum(w * d for w, d in zip(weights, updates))
    client_sq = {g: sum(w * flat.group_sq_norms(d)[g] for w, d in zip(weights, updates)) for g in flat.group_range}
    return round_metrics(flat, acc, client_sq, frozen=set(), kernels=[], prev_kernels=[])


def _direct(flat, updates, weights, g):
    mean = sum(w * d[flat.group_slice(g)] for w, d in zip(weights, updates))
    return math.sqrt(sum(w * (d[flat.group_slice(g)] - mean).pow(2).sum().item() for w, d in zip(weights, updates)))


@pytest.fixture
def flat():
    model = ff.models.create("vit_digits", 10, **TINY)
    ff.qkv.split_qkv(model)
    return FlatParams(model.double())


def test_a_common_step_cuts_the_ratio_and_leaves_the_dispersion(flat):
    """Distinct client updates, then each plus one common vector (what a shrinkage λ·W every client applies alike
    adds): the relative drift falls, the dispersion is unchanged to 1e-9 and equals its definition."""
    gen = torch.Generator().manual_seed(0)
    updates = [torch.randn(flat.numel, generator=gen, dtype=torch.float64) for _ in range(5)]
    weights = [0.1, 0.3, 0.2, 0.25, 0.15]
    common = 3.0 * torch.randn(flat.numel, generator=gen, dtype=torch.float64)
    before = pd.DataFrame([_row(flat, updates, weights)])
    after = pd.DataFrame([_row(flat, [d + common for d in updates], weights)])
    for g in ("qk", "v", "attn_out", "mlp", "embed", "head"):
        assert after[f"drift_{g}"][0] < before[f"drift_{g}"][0]
        assert after[f"update_norm_{g}"][0] > before[f"update_norm_{g}"][0]
        d0, d1 = ff.measures.dispersion(before, g)[0], ff.measures.dispersion(after, g)[0]
        assert d1 == pytest.approx(d0, rel=1e-9, abs=0)
        assert d0 == pytest.approx(_direct(flat, updates, weights, g), rel=1e-9)


def test_clients_that_agree_have_no_dispersion(flat):
    same = torch.randn(flat.numel, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    frame = pd.DataFrame([_row(flat, [same, same.clone()], [0.5, 0.5])])
    assert ff.measures.dispersion(frame, "v")[0] == pytest.approx(0.0, abs=1e-6)


def test_parts_of_a_run_are_its_columns_over_the_last_rounds():
    cfg = tiny_config(rounds=4, method="fedavg")
    hist = ff.run(cfg, progress=False)
    sizes = ff.measures.group_sizes(cfg, 10)
    got = ff.measures.parts(hist, "v", last=2, numel=sizes["v"])
    frame = hist.to_frame().tail(2)
    assert got["drift_v"] == pytest.approx(frame["drift_v"].mean())
    assert got["step_v"] == pytest.approx(frame["update_norm_v"].mean())
    disp = (frame["drift_v"] ** 0.5 * frame["update_norm_v"]).mean()
    assert got["disp_v"] == pytest.approx(disp) and got["disp_v_per_param"] == pytest.approx(disp / sizes["v"] ** 0.5)
    every = ff.measures.parts(hist, "v", last=None)
    assert every["drift_v"] == pytest.approx(hist.to_frame()["drift_v"].mean()) and "disp_v_per_param" not in every


def test_a_frozen_group_has_no_parts():
    """FedFrozen's Q/K after T0: its columns are empty, so its parts over the last rounds are NaN, not 0."""
    hist = ff.run(tiny_config(rounds=3, warmup_rounds=1, method="fedfrozen"), progress=False)
    assert all(math.isnan(v) for v in ff.measures.parts(hist, "qk", last=2).values())


def test_group_sizes_cover_the_model():
    cfg = tiny_config()
    model = ff.models.create(cfg.model, 10, **TINY)
    sizes = ff.measures.group_sizes(cfg, 10)
    assert sum(sizes.values()) == sum(p.numel() for p in model.parameters())
    assert {"qk", "v", "attn_out", "mlp", "norm", "embed", "head"} <= set(sizes)
    assert sizes["v"] * 2 == sizes["qk"]  # W_Q and W_K against W_V, with their biases


def test_bits_per_char():
    assert ff.measures.bits_per_char(math.log(2)) == pytest.approx(1.0)
    assert ff.measures.bits_per_char(2.0) == pytest.approx(2.0 / math.log(2))
