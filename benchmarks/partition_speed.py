"""Time the Dirichlet partitioner at CIFAR-100 scale: 50,000 labels, 100 classes, 1,000 clients.

    python benchmarks/partition_speed.py

Prints the median of 5 runs and, as a same-process reference, the time of one
`np.random.default_rng().permutation(50_000)` (so the figure can be read across machines).
"""

import time

import numpy as np

from fedfrozen import partition

labels = np.random.default_rng(0).integers(0, 100, 50_000)


def timed(fn, repeats=5):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


t_dir = timed(lambda: partition.dirichlet(labels, 1000, alpha=0.5, seed=0, min_size=1))
t_ref = timed(lambda: np.random.default_rng(0).permutation(50_000))
print(f"dirichlet(50,000 labels, 100 classes, 1,000 clients, alpha=0.5): {t_dir * 1e3:.1f} ms "
      f"(median of 5); reference permutation: {t_ref * 1e3:.2f} ms; ratio {t_dir / t_ref:.0f}x")
