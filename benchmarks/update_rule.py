"""The local update rule's step against torch.optim.AdamW's, side by side in one process.

    python benchmarks/update_rule.py [--steps 300] [--turns 3] [--model vit_fmnist_w48]

Times only the optimiser's step (the gradient is fixed, no forward or backward pass) on the model's parameters:
1. torch.optim.AdamW (foreach) over the trainable parameter tensors, the reference;
2. fedfrozen.nets.update.FlatOptimizer with the run's plain rule (AdamW, decoupled decay) over the same entries;
3. the same with a client's mask and the clip (transforms 1 and 2 of the composed rule);
4. FedLADA's transform (Adam with coupled decay) and FedAdamW's (lr scale and the pull after each step).
Each in stage 1 (everything trains) and stage 2 (Q/K frozen: the optimiser holds no state for them). Turns alternate
the contenders so that the machine's noise falls on all of them; prints the median ms per step and the ratio to (1).
"""

import argparse
import dataclasses
import statistics
import time

import torch

import fedfrozen as ff
from fedfrozen.nets.flat import FlatParams
from fedfrozen.nets.update import FlatOptimizer, UpdateRule

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=300)
p.add_argument("--turns", type=int, default=3)
p.add_argument("--model", default="vit_fmnist_w48")
args = p.parse_args()

torch.manual_seed(0)
model = ff.qkv.split_qkv(ff.models.create(args.model, 10, in_chans=1, img_size=28))
flat = FlatParams(model)
gen = torch.Generator().manual_seed(1)
grad = 1e-3 * torch.randn(flat.numel, generator=gen)
client_mask = (torch.rand(flat.numel, generator=gen) < 0.75).float()
delta_bar = 1e-4 * torch.randn(flat.numel, generator=gen)
base = UpdateRule("adamw", weight_decay=0.01)


def timed(step, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        flat.grad.copy_(grad)
        step()
    return (time.perf_counter() - t0) / n * 1e3


def contenders(frozen: tuple) -> dict:
    trainable = flat.mask([g for g in ff.qkv.GROUPS if g not in frozen])
    params = [q for name, q in model.named_parameters()
              if trainable[flat.param_range[name][0]:flat.param_range[name][1]].any()]
    torch_opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=True)

    def rule_opt(rule, mask=None):
        opt = FlatOptimizer(flat, rule, trainable=trainable, model=model)
        opt.rule, opt.mask = rule, mask
        return lambda: opt.step(1e-3)

    pull = dataclasses.replace(base, lr_scale=0.1, weight_decay=0.1,
                               after_step=lambda: flat.data.add_(delta_bar, alpha=0.9 / 50))
    return {"torch AdamW (foreach)": torch_opt.step,
            "rule: AdamW": rule_opt(base),
            "rule: + client mask, clip": rule_opt(dataclasses.replace(base, clip=1.0), client_mask),
            "rule: FedLADA (coupled)": rule_opt(dataclasses.replace(base, weight_decay=0.0, coupled_decay=1e-3)),
            "rule: FedAdamW (scale, pull)": rule_opt(pull)}


print(f"{args.model}: {flat.numel:,} weights in {len(list(model.parameters()))} tensors; {args.steps} steps a turn, "
      f"{args.turns} turns; threads {torch.get_num_threads()}")
for stage, frozen in (("stage 1 (all train)", ()), ("stage 2 (Q/K frozen)", ("qk",))):
    runs = contenders(frozen)
    times = {name: [] for name in runs}
    for _ in range(args.turns):
        for name, step in runs.items():
            timed(step, 10)  # warm
            times[name].append(timed(step, args.steps))
    ref = statistics.median(times["torch AdamW (foreach)"])
    print(f"\n{stage}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:30s} {med:7.3f} ms/step  (turns {min(ts):.3f}-{max(ts):.3f})  ratio to torch {med / ref:5.2f}")
