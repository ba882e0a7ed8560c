"""Paired arms differ in one thing: at one rate, from one start and seed, FedFrozen is FedAvg until T0.

The claims compare FedFrozen with FedAvg seed by seed (`ff.tables.PAIRED_RULE`). That pairing means what it says only
if, given the same config but the method, the two runs are the same run until the kernel freezes: the same partition,
initialisation, client sampling and batches, and the same floats. Then every difference after T0 is the freeze's."""

from __future__ import annotations

import pytest
import torch

import fedfrozen as ff

TINY = dict(dataset="digits", model="vit_digits", model_kwargs=dict(embed_dim=16, depth=2, num_heads=2), n_clients=4,
            clients_per_round=2, rounds=5, local_steps=2, batch_size=16, partition="dirichlet", alpha=0.5,
            warmup_rounds=3, eval_every=1, seed=0, lr=3e-3, device="cpu", engine="sequential")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_at_a_shared_rate_fedfrozen_is_fedavg_bit_for_bit_before_t0(schedule):
    cfg = ff.Config(method="fedavg", lr_schedule=schedule, **TINY)
    fedavg = ff.run(cfg, progress=False).without_wall_clock()
    fedfrozen = ff.run(cfg.replace(method="fedfrozen"), progress=False).without_wall_clock()
    t0 = TINY["warmup_rounds"]
    assert fedfrozen[:t0] == fedavg[:t0]  # every measure of every round before the freeze, to the last bit
    assert fedfrozen[t0]["kernel_change"] == 0 and fedavg[t0]["kernel_change"] > 0  # from T0 on: the freeze
    assert fedfrozen[t0]["bytes_up"] < fedavg[t0]["bytes_up"]


def test_another_rate_differs_from_the_first_round():
    """Why arms at different rates are not paired in one thing: their runs part in round 0."""
    cfg = ff.Config(method="fedfrozen", **TINY)
    one = ff.run(cfg, progress=False).without_wall_clock()
    other = ff.run(cfg.replace(lr=1e-3), progress=False).without_wall_clock()
    assert one[0]["train_loss"] != other[0]["train_loss"]
