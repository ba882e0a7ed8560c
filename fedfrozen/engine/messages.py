"""The round's two messages: what the server decides for round r (`Plan`), what it sends each sampled client
(`Instruction`) and what the client sends back (`Reply`). In this process they are passed as they are; on Flower they
travel as records (fedfrozen.flower.records)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["Plan", "Instruction", "Reply"]


@dataclass(kw_only=True)
class Plan:
    """What round r is: decided by `Round.open` before any client trains (built by keyword)."""

    r: int
    frozen: tuple            # groups no client trains
    lr: float                # the clients' local lr
    value_l2: float          # lambda of the value penalty
    sampled: list            # the clients of the round, in order
    weights: np.ndarray      # their data shares among the sampled (p_i)
    anchor_coeff: float      # the local objective's prox weight
    switched: bool           # the stage changed at this round (fresh optimiser, frozen block sent again)
    mask: torch.Tensor       # 0/1 over the flat buffer: the entries of the groups this stage trains
    trainable_bytes: int     # bytes of those groups

    @property
    def stage(self) -> int:
        return 2 if self.frozen else 1


@dataclass(frozen=True, kw_only=True)
class Instruction:
    """What the server sends client `cid` in round r (Round.instructions; on Flower, its records)."""

    r: int
    cid: int
    weight: float                      # p_i: the client's share of the sampled clients' training examples
    weights: torch.Tensor              # the global flat weights x (read only)
    frozen: tuple                      # the groups this stage freezes
    stage_mask: torch.Tensor           # 0/1 over the flat buffer: the groups this stage trains
    lr: float                          # the local rate of the round
    value_l2: float                    # lambda of the value penalty
    anchor_coeff: float                # the local objective's prox weight
    value_mode: str = "ridge"          # the value penalty's form (Config.value_l2_mode: ridge | prox)
    sent: dict = field(default_factory=dict)  # the server half's Method.to_client for this client ("mask": the
    #                                           client's mask, where the server decides it)


@dataclass(frozen=True, kw_only=True)
class Reply:
    """What client `cid` sends back: its update after Method.upload, as a view of the clients' side's buffer (valid
    until the next reply), what the server counts, and what its half of the method sends the server's."""

    cid: int
    weight: float                 # p_i, as instructed
    update: torch.Tensor          # client - global weights, as Method.upload left it
    loss: float                   # mean training loss over its steps
    steps: int
    extras: dict = field(default_factory=dict)  # the clients' half's Method.to_server
