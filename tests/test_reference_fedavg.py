"""tools/reference_fedavg.py: a FedAvg written apart from the package (docs/claims.md, "FedAvg's level"). It must import
nothing from fedfrozen, read IDX files as torchvision writes them, and give the same numbers for the same seed."""

from __future__ import annotations

import ast
import gzip
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import reference_fedavg as ref  # noqa: E402


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(">" + "I" * array.ndim, *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def tiny_fmnist(tmp_path):
    rng = np.random.default_rng(0)
    for split, n in (("train", 400), ("t10k", 100)):
        labels = np.arange(n) % 10
        images = (rng.random((n, 28, 28)) * 60 + labels[:, None, None] * 19).astype(np.uint8)  # learnable by class
        _write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", images)
        _write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", labels)
    return tmp_path


def test_it_imports_nothing_from_fedfrozen():
    tree = ast.parse((ROOT / "tools" / "reference_fedavg.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n.split(".")[0] == "fedfrozen"]


def test_it_reads_idx_files_and_splits_every_image_once(tiny_fmnist):
    xs, ys, xt, yt = ref.load_fashion_mnist([str(tiny_fmnist)])
    assert tuple(xs.shape) == (400, 1, 28, 28) and tuple(xt.shape) == (100, 1, 28, 28)
    assert ys.tolist() == [i % 10 for i in range(400)]
    parts = ref.dirichlet_split(ys.numpy(), 8, 0.1, np.random.default_rng(1), cap=True)
    assert sorted(np.concatenate(parts).tolist()) == list(range(400))
    with pytest.raises(SystemExit, match="IDX files"):
        ref.load_fashion_mnist([str(tiny_fmnist / "missing")])


def test_a_seed_gives_the_same_numbers_and_they_are_accuracies(tiny_fmnist, tmp_path):
    args = ["--data", str(tiny_fmnist), "--seeds", "3", "--rounds", "30", "--clients", "4", "--per-round", "2",
            "--subset", "200", "--val-fraction", "0.1", "--client-holdout", "0.1", "--cap"]
    out = [tmp_path / "a.csv", tmp_path / "b.csv"]
    for path in out:
        assert ref.main([*args, "--out", str(path)]) == 0
    assert out[0].read_text() == out[1].read_text()
    row = dict(zip(*[line.split(",") for line in out[0].read_text().splitlines()]))
    assert 0.0 <= float(row["late10"]) <= 1.0 and float(row["acc_30"]) > 0.3  # the tiny task is learnable


def test_a_plain_torch_round_gives_fedfrozens_fedavg_weights():
    """The local loop is not where FedAvg's level comes from (docs/claims.md, "FedAvg's level"): on one Setup, one round
    of FedAvg written with torch.optim.AdamW (a fresh one per client, the same clients, batches and p_i weights) gives
    the weights fedfrozen's round gives, to float rounding."""
    import copy

    import torch
    import torch.nn.functional as F

    import fedfrozen as ff
    from fedfrozen import loop, methods
    from fedfrozen.base.rng import seed_for
    from fedfrozen.engine.clients import LocalTraining

    cfg = ff.Config(dataset="digits", model="vit_digits", model_kwargs=dict(embed_dim=16, depth=2, num_heads=2),
                    n_clients=6, clients_per_round=3, rounds=2, partition="dirichlet", alpha=0.5, lr=3e-3,
                    weight_decay=0.01, batch_size=16, method="fedavg", seed=1, device="cpu")
    method, client = methods.build(cfg), methods.build(cfg)  # the server's half, the clients'
    s, rnd, hist, _ = loop.start_up(cfg, method, client=client)
    plain = copy.deepcopy(s.model)
    for p in plain.parameters():
        p.data, p.grad = p.data.clone(), None
        p.requires_grad_(True)
    start = {n: p.detach().clone() for n, p in plain.named_parameters()}
    clients = LocalTraining(s, client, False)
    plan = rnd.open(0)
    for reply in clients.replies(rnd.instructions(plan)):
        rnd.receive(plan, reply)
    rnd.finish(plan, hist, 0.0)
    total = {n: torch.zeros_like(v) for n, v in start.items()}
    for weight, cid in zip(plan.weights, plan.sampled):
        with torch.no_grad():
            for n, p in plain.named_parameters():
                p.copy_(start[n])
        opt = torch.optim.AdamW(plain.parameters(), lr=plan.lr, weight_decay=0.01)
        plain.train()
        idx = s.client_train[cid]
        gen = torch.Generator().manual_seed(seed_for("local_batches", 1, 0, cid))  # the round's batch order
        order = idx[torch.randperm(len(idx), generator=gen)]
        for b in order.split(cfg.batch_size):
            opt.zero_grad()
            F.cross_entropy(plain(s.x[b]), s.y[b]).backward()
            opt.step()
        with torch.no_grad():
            for n, p in plain.named_parameters():
                total[n] += float(weight) * (p - start[n])
    mine = dict(s.model.named_parameters())
    gap = max((start[n] + total[n] - mine[n]).abs().max().item() for n in start)
    moved = max((mine[n] - start[n]).abs().max().item() for n in start)
    assert moved > 1e-3 and gap < 1e-5, (moved, gap)


def test_the_committed_level_table_follows_from_its_rows():
    """figures/fedavg_level_verdicts.csv is tools/fedavg_level.py's verdict on the committed per-seed rows, and the
    rows the docs quote are there: the reference lands on fedfrozen's FedAvg once it draws the same split."""
    import fedavg_level
    import pandas as pd

    rows = pd.read_csv(ROOT / "figures" / "fedavg_level_runs.csv")
    again = fedavg_level.plain_draw_verdict(rows)
    committed = pd.read_csv(ROOT / "figures" / "fedavg_level_verdicts.csv", index_col=0)
    assert again["d"].to_numpy() == pytest.approx(committed["d"].to_numpy(), rel=1e-5)
    assert list(again["verdict_holm"]) == list(committed["verdict_holm"])
    level = fedavg_level.summary(rows)["late_acc"]
    assert abs(level["caphold"] - level["ff"]) < 0.01 < level["plain"] - level["ff"]  # the same split closes the gap
