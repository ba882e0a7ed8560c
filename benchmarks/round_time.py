"""Seconds per round of the federated loop against references measured in the same process.

    python benchmarks/round_time.py [--rounds 4] [--clients 20]

On the same clients, batches and number of local steps (vit_digits, digits, 1 local epoch):
1. this loop (`fedfrozen.run`, one resident model, flat buffers, in-place accumulation);
2. a naive loop: a deepcopy of the global model and a new optimiser per client, averaging
   state_dicts afterwards (what a first implementation usually does);
3. a tight loop: the same number of training steps on one model, no federation at all.
Prints loop/naive speed-up, the loop's overhead over the tight loop, the stage-2/stage-1 time
per round of FedFrozen (frozen Q/K needs no weight gradients) and the stage-2 upload saving.
"""

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F

import fedfrozen as ff
from fedfrozen import local, loop
from fedfrozen.base.rng import seed_for

p = argparse.ArgumentParser()
p.add_argument("--rounds", type=int, default=4)
p.add_argument("--clients", type=int, default=20)
args = p.parse_args()

cfg = ff.Config(method="fedavg", partition="dirichlet", alpha=0.5, n_clients=args.clients, rounds=args.rounds,
                eval_every=10_000, client_holdout=0.0, val_fraction=0.0, device="cpu")
setup = loop.prepare(cfg)
R = cfg.rounds


def client_batches(r, cid):
    gen = torch.Generator().manual_seed(seed_for("local_batches", cfg.seed, r, cid))
    idx = setup.client_train[cid]
    return [idx[b] for b in local.batches(len(idx), cfg, gen, cfg.local_epochs, None)]


def naive_round(global_model, r):
    states, weights = [], []
    for cid in range(cfg.n_clients):
        model = copy.deepcopy(global_model)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        model.train()
        for b in client_batches(r, cid):
            opt.zero_grad()
            F.cross_entropy(model(setup.x[b]), setup.y[b]).backward()
            opt.step()
        states.append(model.state_dict())
        weights.append(len(setup.client_train[cid]))
    total = sum(weights)
    avg = {k: sum(w / total * s[k] for w, s in zip(weights, states)) for k in states[0]}
    global_model.load_state_dict(avg)


def tight_round(model, opt, r):
    model.train()
    for cid in range(cfg.n_clients):
        for b in client_batches(r, cid):
            opt.zero_grad()
            F.cross_entropy(model(setup.x[b]), setup.y[b]).backward()
            opt.step()


def per_round(fn):
    times = []
    for r in range(R):
        t0 = time.perf_counter()
        fn(r)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


torch.set_num_threads(torch.get_num_threads())
hist = ff.run(cfg, progress=False)
t_loop = statistics.median(row["seconds"] for row in hist.rows[:-1])  # last round also evaluates
ref_model = ff.models.create(cfg.model, 10)
t_naive = per_round(lambda r: naive_round(ref_model, r))
tight_model = ff.models.create(cfg.model, 10)
tight_opt = torch.optim.AdamW(tight_model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
t_tight = per_round(lambda r: tight_round(tight_model, tight_opt, r))
steps = sum(len(client_batches(0, c)) for c in range(cfg.n_clients))

frozen = ff.run(cfg.replace(method="fedfrozen", rounds=2 * R + 1, warmup_rounds=R), progress=False)
s1 = statistics.median(r["seconds"] for r in frozen.rows[:R])
s2 = statistics.median(r["seconds"] for r in frozen.rows[R + 1:-1])  # skip the switch round and the last

print(f"vit_digits, digits, {cfg.n_clients} clients x 1 local epoch = {steps} local steps per round; "
      f"medians over {R} rounds, {torch.get_num_threads()} threads")
print(f"  this loop       : {t_loop:.3f} s/round")
print(f"  naive (deepcopy): {t_naive:.3f} s/round  -> speed-up {t_naive / t_loop:.2f}x")
print(f"  tight (no FL)   : {t_tight:.3f} s/round  -> loop overhead {100 * (t_loop / t_tight - 1):+.1f}%")
print(f"  FedFrozen stage 2 / stage 1 time per round: {s2 / s1:.2f} ({s2:.3f} vs {s1:.3f} s)")
up1, up2 = frozen.rows[0]["bytes_up"], frozen.rows[-1]["bytes_up"]
print(f"  upload per round: stage 1 {up1:,} B, stage 2 {up2:,} B (saving {100 * (1 - up2 / up1):.1f}%)")
