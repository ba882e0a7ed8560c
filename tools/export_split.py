"""Write what a fedfrozen run starts from, for tools/reference_fedavg.py to train on: one difference at a time.

    python tools/export_split.py --seeds 0 1 2 3 4 --out /tmp/split      # the cpu profile's FedAvg, Dirichlet 0.1

For each seed, `split_{seed}.npz` holds `subset` (the run's 12,000 indices into Fashion-MNIST's 60,000 training
images) and `client_0..client_99` (each client's training indices into the subset, after its hold-out), and
`init_{seed}.pt` the run's initial weights as a stock timm state_dict (fused qkv). Then
`python tools/reference_fedavg.py --split-file /tmp/split/split_{seed}.npz` trains a plain FedAvg on fedfrozen's
clients (and `--init-file /tmp/split/init_{seed}.pt` from its initial weights): docs/claims.md, "FedAvg's level".
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import numpy as np
import torch

import fedfrozen as ff
from fedfrozen import data, profiles, qkv
from fedfrozen.engine.setup import prepare
from fedfrozen.runs.experiments import config_key


def config(seed: int, alpha: float) -> ff.Config:
    return ff.Config(**profiles.federated("cpu"), **profiles.dirichlet_fields(alpha), method="fedavg",
                     lr=profiles.CPU_LR["fedavg"], seed=seed)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    for seed in a.seeds:
        cfg = config(seed, a.alpha)
        s = prepare(cfg)
        train, _ = data.load(cfg.dataset, cfg.data_root, cfg.download)
        subset = data.subset_indices(train, cfg.train_subset)
        np.savez(os.path.join(a.out, f"split_{seed}.npz"), subset=subset,
                 **{f"client_{i}": t.cpu().numpy() for i, t in enumerate(s.client_train)})
        model = qkv.merge_qkv(copy.deepcopy(s.model))
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()},
                   os.path.join(a.out, f"init_{seed}.pt"))
        print(f"seed {seed}: {sum(len(t) for t in s.client_train)} client images, config key {config_key(cfg)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
