"""Seeds for every random choice after setup: one 63-bit seed per (config seed, round, client, purpose).

Drawing each choice from a generator seeded by its position, rather than from one running
stream, is what makes a resumed run draw exactly what the uninterrupted run would have drawn.
"""

from __future__ import annotations

import numpy as np

__all__ = ["derive_seed"]


def derive_seed(*parts) -> int:
    """A 63-bit seed from integers (config seed, round, client, purpose tag)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint64)[0] >> 1)
