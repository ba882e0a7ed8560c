"""The cost of notebook 12's models and notebook 13's 49-token ViT against the cpu profile's ViT, side by side.

    python benchmarks/model_cost.py [--steps 30] [--repeats 3]

One local training step (batch 16, 28x28, one channel, AdamW) and one evaluation pass (batch 1,000, no gradients) of
each model of fedfrozen.studies.families.MODELS and of vit_fmnist_p4 (patch 4: 49 tokens), timed in turns with the ViT
(vit_fmnist_w48) so that machine noise hits both alike; prints each model's parameters and its median times as ratios
to the ViT's. `fedfrozen budget`'s idle estimate scales a run's local epochs and its per-round evaluation by these
ratios (fedfrozen.runs.timing.MODEL_COST), since its idle rates were measured on the ViT.
"""

import argparse
import statistics
import time

import torch

import fedfrozen as ff
from fedfrozen import families


def step_time(model, x, y, steps: int) -> float:
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(3):  # warm-up
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    t = time.perf_counter()
    for _ in range(steps):
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return (time.perf_counter() - t) / steps


def eval_time(model, x, repeats: int = 2) -> float:
    model.eval()
    with torch.no_grad():
        model(x)
        t = time.perf_counter()
        for _ in range(repeats):
            model(x)
    model.train()
    return (time.perf_counter() - t) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)  # as the runs train: one thread each (ff.io.use_threads)
    torch.manual_seed(0)
    x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    table = {**families.MODELS, "p4": dict(model="vit_fmnist_p4")}
    models = {name: ff.qkv.split_qkv(ff.models.create(f["model"], 10, **f.get("model_kwargs", {})))
              for name, f in table.items()}
    xe = torch.randn(1000, 1, 28, 28)
    train = {name: [] for name in models}
    evals = {name: [] for name in models}
    for _ in range(args.repeats):
        for name, model in models.items():  # the ViT beside every model in each turn
            train[name].append(step_time(model, x, y, args.steps) / step_time(models["vit"], x, y, args.steps))
            evals[name].append(eval_time(model, xe) / eval_time(models["vit"], xe))
    for name, model in models.items():
        n = sum(p.numel() for p in model.parameters())
        print(f"{name:8s} {table[name]['model']:30s} {n:7d} params   / ViT's: training step "
              f"{statistics.median(train[name]):.2f}, evaluation {statistics.median(evals[name]):.2f}  "
              f"(repeats {[round(r, 2) for r in train[name]]}, {[round(r, 2) for r in evals[name]]})")


if __name__ == "__main__":
    main()
