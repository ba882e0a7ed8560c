"""What the Shakespeare federation's character Transformer costs beside the cpu profile's ViT, side by side.

    python benchmarks/text_cost.py [--steps 20] [--repeats 3] [--rounds 100 --local-steps 10 --depth 2]

One local training step (batch 16: 80-character windows for `char_transformer`, 28x28 images for vit_fmnist_w48;
AdamW) and one evaluation pass over 1,000 samples, timed in turns on one thread so that machine noise hits both
alike; prints the medians and their ratios to the ViT's, and what one round and one evaluation of a text run cost at
a given size (clients a round x local steps; the evaluated windows: fedfrozen.engine.setup.TEST_SAMPLE for test and
validation, CLIENT_EVAL a client, FINAL_SAMPLE at the last round) and what a whole run costs at a given number of
rounds and evaluations — the numbers notebook 14's budget is chosen from.
"""

import argparse
import statistics
import time

import torch
from model_cost import step_time  # (benchmarks/model_cost.py: one AdamW step, timed after a warm-up)

import fedfrozen as ff
from fedfrozen import roles, setup


@torch.no_grad()
def eval_time(model, x) -> float:
    model.eval()
    model(x[:64])
    t = time.perf_counter()
    model(x)
    model.train()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clients", type=int, default=roles.PER_ROUND, help="clients a round")
    ap.add_argument("--local-steps", type=int, default=roles.BUDGET["local_steps"])
    ap.add_argument("--n-clients", type=int, default=roles.N_CLIENTS)
    ap.add_argument("--rounds", type=int, default=roles.BUDGET["rounds"])
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-window", type=int, default=10)
    ap.add_argument("--depth", type=int, default=None, help="the text model's depth (default: char_transformer's)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as the runs train: one thread each
    torch.manual_seed(0)
    vocab = 73  # the release's vocabulary (its training text's characters and the unknown symbol)
    kw = {} if args.depth is None else {"depth": args.depth}
    text = ff.qkv.split_qkv(ff.models.create("char_transformer", vocab, **kw))
    vit = ff.qkv.split_qkv(ff.models.create("vit_fmnist_w48", 10))
    xt, yt = torch.randint(0, vocab, (16, 80)), torch.randint(0, vocab, (16,))
    xv, yv = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    et, ev = torch.randint(0, vocab, (1000, 80)), torch.randn(1000, 1, 28, 28)
    steps, evals = {"text": [], "vit": []}, {"text": [], "vit": []}
    for _ in range(args.repeats):
        steps["text"].append(step_time(text, xt, yt, args.steps))
        steps["vit"].append(step_time(vit, xv, yv, args.steps))
        evals["text"].append(eval_time(text, et))
        evals["vit"].append(eval_time(vit, ev))
    s = {k: statistics.median(v) for k, v in steps.items()}
    e = {k: statistics.median(v) for k, v in evals.items()}
    n = sum(p.numel() for p in text.parameters())
    print(f"char_transformer ({n} params): training step {1e3 * s['text']:.1f} ms "
          f"({s['text'] / s['vit']:.2f}x the ViT's {1e3 * s['vit']:.1f} ms); 1,000 windows evaluated in "
          f"{e['text']:.2f} s ({e['text'] / e['vit']:.2f}x the ViT's {e['vit']:.2f} s for 1,000 images)")
    windows = 2 * setup.TEST_SAMPLE + setup.CLIENT_EVAL * args.n_clients
    train = args.clients * args.local_steps * s["text"]
    evaluation = windows / 1000 * e["text"]
    print(f"a text round ({args.clients} clients x {args.local_steps} steps): {train:.1f} s of training; "
          f"an evaluation ({windows} windows: test and validation samples, {setup.CLIENT_EVAL} a client "
          f"of {args.n_clients}): {evaluation:.1f} s")
    last = args.rounds - max(args.eval_window, 1)
    evaluated = sum(1 for r in range(args.rounds) if (r + 1) % args.eval_every == 0 or r >= last)
    final = setup.FINAL_SAMPLE / 1000 * e["text"]
    total = args.rounds * train + evaluated * evaluation + final
    print(f"a run of {args.rounds} rounds ({evaluated} evaluated, then {setup.FINAL_SAMPLE:,} test windows at the "
          f"last): {total / 60:.1f} min on one thread ({args.rounds * train / 60:.1f} training, "
          f"{evaluated * evaluation / 60:.1f} evaluating, {final / 60:.1f} the last round's sample)")


if __name__ == "__main__":
    main()
