"""One short script for a GPU machine: does the package run on CUDA, do the engines agree there,
and how fast is a round of the paper profile?

    PYTHONPATH=. python benchmarks/device_check.py [--budget 420] [--out DIR]

Sections, each timed and guarded (a failing section prints its traceback and the next one runs;
a section is skipped once `--budget` seconds have passed):
1. environment: torch, timm, the GPU;
2. equivalence on CUDA: sequential == batched (fedavg, and fedfrozen across its stage switch) on
   vit_digits, 6 unequal clients, 3 rounds: largest weight and accuracy differences;
   CUDA against CPU for the sequential engine (float noise only, informational);
3. the engine benchmark of issue 15: vit_cifar, 100 clients of a fake CIFAR-10 written in
   torchvision's format at the real size (5,000 images per class), the paper recipe, 10 and
   100 clients per round, sequential vs batched seconds per round and the peak GPU memory;
4. the paper profile's cost: seconds per round at 10 per round, and the minutes of one 200-round run;
5. the batched engine with torch.compile at 100 per round (only when 40% of the budget is left).
Everything printed is also written to OUT/device_check.txt.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings

import torch

import fedfrozen as ff

T_START = time.perf_counter()
LOG: list[str] = []
LOG_PATH: list[str] = []
DATA: list = []



def peak_gib() -> float:
    """Peak GPU memory of this process so far, in GiB (0 without CUDA)."""
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0

def say(*parts) -> None:
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    LOG.append(line)
    if LOG_PATH:
        with open(LOG_PATH[0], "a") as f:  # as it goes: a run stopped at its time limit keeps what it printed
            f.write(line + "\n")


def section(name, budget):
    def wrap(fn):
        def go(*a, **k):
            used = time.perf_counter() - T_START
            if used > budget:
                say(f"== {name}: skipped ({used:.0f} s of the {budget} s budget used)")
                return None
            say(f"== {name}")
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            except Exception:
                say(traceback.format_exc())
            finally:
                say(f"   ({time.perf_counter() - t0:.1f} s)")
        return go
    return wrap


def final_vector(cfg, **kw):
    """Run cfg; return its History and the final global weights (the Setup's flat vector) on the CPU."""
    built = []
    original = ff.loop.prepare

    def spy(c, train=None, test=None):
        built.append(original(c, train, test))
        return built[-1]

    ff.loop.prepare = spy
    try:
        hist = ff.run(cfg, progress=False, **kw)
    finally:
        ff.loop.prepare = original
    return hist, built[-1].flat.data.detach().float().cpu()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=420.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--device", default="cuda", help="cuda (the point); cpu only to try the script")
    ap.add_argument("--per-class", type=int, default=5000, help="fake CIFAR-10 train images per class")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    B = args.budget
    os.makedirs(args.out, exist_ok=True)
    LOG_PATH.append(os.path.join(args.out, "device_check.txt"))

    @section("environment", B)
    def env():
        import timm
        say(f"python {sys.version.split()[0]}, torch {torch.__version__}, timm {timm.__version__}, "
            f"cuda available {torch.cuda.is_available()}")
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            say(f"GPU {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")

    @section("equivalence on CUDA (vit_digits, 6 unequal clients, 3 rounds)", B)
    def equivalence():
        for method, extra in (("fedavg", {}), ("fedfrozen", dict(warmup_rounds=1))):
            base = ff.Config(dataset="digits", method=method, n_clients=6, clients_per_round=6, rounds=3,
                             partition="dirichlet", alpha=0.1, batch_size=16, lr=1e-2, eval_every=1,
                             optimizer="sgd", device=args.device, **extra)
            hs, ws = final_vector(base.replace(engine="sequential"))
            hb, wb = final_vector(base.replace(engine="batched"))
            hc, wc = final_vector(base.replace(engine="sequential", device="cpu"))
            acc = lambda h: [r.get("test_acc") for r in h.rows]  # noqa: E731
            d_acc = max(abs(a - b) for a, b in zip(acc(hs), acc(hb)))
            say(f"   {method}: batched vs sequential on cuda: max |w| diff {(ws - wb).abs().max():.2e}, "
                f"max acc diff {d_acc:.1e}; cuda vs cpu (sequential): max |w| diff {(ws - wc).abs().max():.2e}, "
                f"final acc cuda {acc(hs)[-1]:.4f} cpu {acc(hc)[-1]:.4f}")

    @section("engine benchmark (vit_cifar, 100 clients, fake CIFAR-10 at full size, paper recipe)", B)
    def engine():
        tmp = tempfile.mkdtemp()
        t0 = time.perf_counter()
        ff.data.write_fake_cifar("cifar10", tmp, per_class=args.per_class, test_per_class=args.per_class // 5)
        train, test = ff.data.load("cifar10", tmp, download=False)
        DATA[:] = [train, test]
        say(f"   fake CIFAR-10 written and loaded: {len(train.y)} train, {len(test.y)} test "
            f"({time.perf_counter() - t0:.1f} s)")
        recipe = {k: v for k, v in ff.profiles.PAPER_RECIPE.items() if k != "lr_warmup_rounds"}
        results = {}
        for per_round in (10, 100):
            base = ff.Config(dataset="cifar10", model="vit_cifar", n_clients=100, clients_per_round=per_round,
                             rounds=4, eval_every=10**6, device=args.device, method="fedavg", **recipe)
            for engine in ("sequential", "batched", "sequential", "batched"):
                if time.perf_counter() - T_START > B:
                    say("   budget reached; stopping the benchmark here")
                    break
                if args.device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                hist = ff.run(base.replace(engine=engine), progress=False, train=train, test=test)
                secs = [r["seconds"] for r in hist.rows[1:-1]]  # not round 0 (allocations), not the last (evaluates)
                results.setdefault((per_round, engine), []).append(statistics.median(secs))
                say(f"   {per_round} per round, {engine}: rounds {[round(r['seconds'], 3) for r in hist.rows]} s, "
                    f"peak GPU memory {peak_gib():.2f} GiB")
            if (per_round, "batched") in results and (per_round, "sequential") in results:
                s = statistics.median(results[(per_round, "sequential")])
                b = statistics.median(results[(per_round, "batched")])
                say(f"   vit_cifar, 100 clients, {per_round} per round: sequential {s:.3f} s/round, "
                    f"batched {b:.3f} s/round, ratio {s / b:.2f}x")
        return results

    @section("paper profile cost (10 per round, sequential and batched)", 10**9)
    def paper(results):
        if not results:
            say("   no engine timings")
            return
        for engine in ("sequential", "batched"):
            if (10, engine) in results:
                s = statistics.median(results[(10, engine)])
                say(f"   {engine}: {s:.3f} s/round -> one 200-round run ~{200 * s / 60:.1f} min "
                    "(plus evaluation)")

    @section("batched + torch.compile, 100 per round (compile time and s/round)", B * 0.6)
    def compiled(results):
        train, test = DATA
        recipe = {k: v for k, v in ff.profiles.PAPER_RECIPE.items() if k != "lr_warmup_rounds"}
        cfg = ff.Config(dataset="cifar10", model="vit_cifar", n_clients=100, clients_per_round=100, rounds=4,
                        eval_every=10**6, device=args.device, method="fedavg", engine="batched",
                        engine_compile=True, **recipe)
        hist = ff.run(cfg, progress=False, train=train, test=test)
        sec = statistics.median(r["seconds"] for r in hist.rows[1:-1])
        say(f"   rounds {[round(r['seconds'], 3) for r in hist.rows]} s (round 0 compiles)")
        if (100, "batched") in (results or {}):
            b = statistics.median(results[(100, "batched")])
            say(f"   batched+compile {sec:.3f} s/round vs batched {b:.3f}: {b / sec:.2f}x")

    env()
    equivalence()
    res = engine()
    paper(res)
    compiled(res)
    say(f"total {time.perf_counter() - T_START:.0f} s")


if __name__ == "__main__":
    main()
