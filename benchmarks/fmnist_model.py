"""Choose vit_fmnist by measurement: centralised Fashion-MNIST test accuracy after a fixed number of
epochs against seconds per epoch on this machine (1 thread per candidate).

    python benchmarks/fmnist_model.py                 # all candidates, 5 epochs
    python benchmarks/fmnist_model.py p7d32L2 --epochs 3

Every candidate is timm's VisionTransformer (the project models' class) with mlp_ratio 2 and average
pooling, trained with AdamW (lr 2e-3, weight decay 0.01, cosine over the epochs, batch 64; --batch to change) on
the full 60,000 training images (or --subset), evaluated on the 10,000 test images. Same seed and batch order for all.
"""

import argparse
import time

import torch
import torch.nn.functional as F

import fedfrozen as ff

CANDIDATES = {
    "p7d32L2": dict(patch_size=7, embed_dim=32, depth=2, num_heads=2),
    "p7d48L3": dict(patch_size=7, embed_dim=48, depth=3, num_heads=4),
    "p4d32L2": dict(patch_size=4, embed_dim=32, depth=2, num_heads=2),
    "p7d64L4": dict(patch_size=7, embed_dim=64, depth=4, num_heads=4),
}


def evaluate(model, split) -> float:
    model.eval()
    with torch.no_grad():
        hits = sum((model(split.x[i:i + 1000]).argmax(1) == split.y[i:i + 1000]).sum().item()
                   for i in range(0, len(split), 1000))
    model.train()
    return hits / len(split)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", default=list(CANDIDATES))
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--subset", type=int, default=None,
                    help="train on the cpu profile's fixed subset (data.subset) less its 10%% validation hold-out")
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    train, test = ff.data.load("fashion_mnist")
    if args.subset:  # the federation's training pool: the subset less the stratified 10% validation split
        train = ff.data.subset(ff.data.subset(train, args.subset), int(args.subset * 0.9))
    print(f"{'model':10s} {'params':>7s} {'s/epoch':>8s} " + " ".join(f"ep{e + 1:<4d}" for e in range(args.epochs)),
          flush=True)
    for name in args.names:
        torch.manual_seed(0)
        model = ff.models.create("vit_digits", 10, img_size=28, **CANDIDATES[name])
        params = sum(p.numel() for p in model.parameters())
        steps = args.epochs * (len(train) // args.batch)
        opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
        gen = torch.Generator().manual_seed(0)
        accs, seconds = [], 0.0
        for _ in range(args.epochs):
            order = torch.randperm(len(train), generator=gen)
            start = time.perf_counter()
            for i in range(0, len(train) - args.batch + 1, args.batch):
                idx = order[i:i + args.batch]
                loss = F.cross_entropy(model(train.x[idx]), train.y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
            seconds += time.perf_counter() - start
            accs.append(evaluate(model, test))
        print(f"{name:10s} {params:7d} {seconds / args.epochs:8.1f} " + " ".join(f"{a:.4f}" for a in accs), flush=True)


if __name__ == "__main__":
    main()
