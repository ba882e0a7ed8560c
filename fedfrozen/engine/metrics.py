"""What a round measures for its History row: the client drift and update norm of every parameter group, the change
of the attention kernels, and the evaluation of the global model (test, validation, the clients' held-out slices;
under a feature shift each group's test set; with natural clients fixed samples of the test text)."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..nets import qkv
from . import local

__all__ = ["round_metrics", "evaluate", "evaluate_round"]

_EPS = 1e-12


def round_metrics(flat, acc, client_sq: dict, frozen, kernels, prev_kernels) -> dict:
    """A round's model measurements for its History row: per trained group the client drift
    (sum_i p_i ||D_i||^2 / ||sum_i p_i D_i||^2 - 1, from `client_sq` = sum_i p_i ||D_i,g||^2 and the mean
    update `acc`) and the norm of the mean update (None for frozen groups; `other` only if the model has
    it), and the relative kernel change, overall and per layer."""
    row = {}
    mean_sq = flat.group_sq_norms(acc)
    for g in qkv.GROUPS:
        if g == "other" and not flat.group_numel("other"):
            continue
        trained = g not in frozen
        norm2 = mean_sq[g].item()
        row[f"drift_{g}"] = max(float(client_sq[g]) - norm2, 0.0) / (norm2 + _EPS) if trained else None
        row[f"update_norm_{g}"] = math.sqrt(norm2) if trained else None
    row["kernel_change"] = _kernel_change(kernels, prev_kernels)
    row["kernel_change_layers"] = _kernel_changes(kernels, prev_kernels)
    return row


def _head_ratios(new, old) -> list:
    return [((a - b).flatten(1).norm(dim=1) / (b.flatten(1).norm(dim=1) + _EPS)) for a, b in zip(new, old)]


def _kernel_change(new, old) -> float | None:
    """Mean over layers and heads of the relative change of the attention kernels in one round."""
    if not new:
        return None
    return torch.cat(_head_ratios(new, old)).mean().item()


def _kernel_changes(new, old) -> list[float] | None:
    """Per layer (from the input up), the mean over heads of the relative kernel change in one round."""
    if not new:
        return None
    return [r.mean().item() for r in _head_ratios(new, old)]


@torch.no_grad()
def evaluate(model, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024, amp: bool = False):
    """(mean loss, accuracy, per-sample correctness) of `model` on (x, y)."""
    model.eval()
    if len(y) == 0:
        return float("nan"), float("nan"), torch.zeros(0, dtype=torch.bool)
    losses, correct = [], []
    for i in range(0, len(y), batch_size):
        with local.autocast(amp, x.device):
            out = model(x[i:i + batch_size]).float()
        losses.append(F.cross_entropy(out, y[i:i + batch_size], reduction="sum"))
        correct.append(out.argmax(1) == y[i:i + batch_size])
    correct = torch.cat(correct)
    return (torch.stack(losses).sum() / len(y)).item(), correct.float().mean().item(), correct


def evaluate_round(s, r: int) -> dict:
    """The evaluation columns of round r's row (None on rounds that are not evaluated)."""
    cfg = s.cfg
    keys = ("test_loss", "test_acc", "val_loss", "val_acc", "client_acc_mean", "client_acc_worst10",
            "client_acc_std")
    groups = getattr(s, "test_groups", [])  # a feature shift: the test set as each group sees it (inputs.shift)
    if groups:
        keys += (*(f"test_acc_g{g}" for g in range(len(groups))), "test_acc_worst")
    final = getattr(s, "test_final", None)  # natural clients: a larger test sample at the last round
    if final is not None:
        keys += ("test_loss_final", "test_acc_final")
    if (r + 1) % cfg.eval_every and r < cfg.rounds - max(cfg.eval_window, 1):
        return dict.fromkeys(keys)
    out = {}
    if groups:  # each group's accuracy; test_loss and test_acc their means, test_acc_worst the lowest
        measured = [evaluate(s.model, x, s.test_y, amp=cfg.amp)[:2] for x in groups]
        out["test_loss"] = sum(loss for loss, _ in measured) / len(groups)
        out["test_acc"] = sum(acc for _, acc in measured) / len(groups)
        out.update({f"test_acc_g{g}": acc for g, (_, acc) in enumerate(measured)})
        out["test_acc_worst"] = min(acc for _, acc in measured)
    else:  # (natural clients: a fixed sample of their test text on every evaluated round)
        out["test_loss"], out["test_acc"], _ = evaluate(s.model, s.test_x, s.test_y, amp=cfg.amp)
    if final is not None:  # ... and a larger one at the last round
        out["test_loss_final"], out["test_acc_final"] = (evaluate(s.model, *final, amp=cfg.amp)[:2]
                                                         if r == cfg.rounds - 1 else (None, None))
    if len(s.val_idx):
        out["val_loss"], out["val_acc"], _ = evaluate(s.model, s.x[s.val_idx], s.y[s.val_idx], amp=cfg.amp)
    else:
        out["val_loss"] = out["val_acc"] = None
    if len(s.client_eval_all):
        _, _, correct = evaluate(s.model, s.x[s.client_eval_all], s.y[s.client_eval_all], amp=cfg.amp)
        n = len(s.client_eval)
        hits = torch.bincount(s.client_eval_owner, weights=correct.float(), minlength=n)
        sizes = torch.bincount(s.client_eval_owner, minlength=n).float()
        acc = (hits[sizes > 0] / sizes[sizes > 0]).cpu().numpy()
        worst = np.sort(acc)[:max(1, int(math.ceil(0.1 * acc.size)))]
        out.update(client_acc_mean=float(acc.mean()), client_acc_worst10=float(worst.mean()),
                   client_acc_std=float(acc.std()))
    else:
        out.update(client_acc_mean=None, client_acc_worst10=None, client_acc_std=None)
    return out
