"""Seeds for every random choice after setup: one 63-bit seed per (config seed, position, purpose).

Drawing each choice from a generator seeded by its position, rather than from one running
stream, is what makes a resumed run draw exactly what the uninterrupted run would have drawn.
Each kind of choice has its own purpose tag in PURPOSES, so two kinds never share a stream:

    rng = np.random.default_rng(seed_for("sampling", cfg.seed, r))      # round r's client sample

(The partitioners take Config.seed itself, the stratified subset its fixed SUBSET_SEED, and the
linear-attention simulator its own seeds: they are set-up choices, not draws of a run.)
"""

from __future__ import annotations

import numpy as np

__all__ = ["derive_seed", "seed_for", "PURPOSES"]

# purpose -> tag (the last part of the seed sequence). Never reuse or renumber a tag: the tag is part of every
# seed drawn for that purpose, so changing one changes the results of every run that draws it.
PURPOSES = {
    "holdout": 101,            # the stratified validation and public splits of the training data (per config)
    "init": 102,               # the model's initialisation (per config)
    "server_pretrain": 103,    # the batch order of the server's warm start on the public split (per config)
    "sampling": 104,           # the clients of round r (per round)
    "local_batches": 105,      # client cid's batch order and dropout in round r (per round and client)
    "head_pruning": 106,       # head pruning's own client sample in round r (per round)
    "participation": 107,      # the skewed-participation probabilities of the clients (per config)
    "fedsteer_subspace": 108,  # FedSteer's random subspace (per config)
    "fedsteer_core": 109,      # FedSteer's core set of round r (per round)
    "fedslm_groups": 110,      # FedSLM's assignment of clients to rank groups (per config)
    "afedlf_devices": 111,     # AFedLF's simulated device profiles (per config; until 0.1.0 it drew from tag 107)
    "pretrain": 112,           # the initialisation of the server's pre-training (per pretrain_seed)
    "pretrain_batches": 113,   # the pre-training's batch order and rotations (per pretrain_seed)
    "shift_patches": 114,      # the patch order of each client group under shift="patch_permutation" (per config)
}
assert len(set(PURPOSES.values())) == len(PURPOSES), "a purpose tag is used twice"


def derive_seed(*parts) -> int:
    """A 63-bit seed from integers (config seed, round, client, purpose tag)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint64)[0] >> 1)


def seed_for(purpose: str, *position) -> int:
    """The seed of one random choice: `position` (config seed, then round and client where the choice has them)
    and the tag of `purpose` (PURPOSES)."""
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {', '.join(PURPOSES)}; got {purpose!r}")
    return derive_seed(*position, PURPOSES[purpose])
