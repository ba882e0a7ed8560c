"""The measures the claims are judged on, read from a History's existing columns (docs/claims.md, "The measures").

A round records, for each trained parameter group g, the relative client drift and the norm of the mean update:

    drift_g       = sum_i p_i ||D_i,g||^2 / ||D̄_g||^2 - 1        (History column drift_<g>)
    update_norm_g = ||D̄_g||,  D̄_g = sum_i p_i D_i,g                 (History column update_norm_<g>)

The drift is a ratio, and a ratio moves when either part does: a term every client adds alike (a shrinkage λ·W_V in
every client's gradient) makes the mean step longer and the ratio smaller with the clients exactly as far apart as
before. So the ratio is split into its parts before it decides anything:

    dispersion_g  = sqrt(sum_i p_i ||D_i,g - D̄_g||^2) = sqrt(drift_g) · update_norm_g

the root-mean-square distance of a client's update from the round's mean update (how far apart the clients pull:
unchanged when every client's update moves by one common vector), and its value per parameter,
dispersion_g / sqrt(numel_g), comparable across groups of different sizes. `parts` gives all three (ratio, step,
dispersion) over a run's last rounds; the History gains no column, so every archived History can be read so.

Text accuracy at its power: `bits_per_char` of the 50,000-window final test loss (History column test_loss_final).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["dispersion", "parts", "group_sizes", "bits_per_char", "PARTS"]

PARTS = ("drift", "step", "dispersion")  # the relative drift, the mean step's norm, the clients' dispersion


def dispersion(frame, group: str):
    """Per round (a Series over the History frame's rows), the clients' dispersion of `group`'s update:
    sqrt(sum_i p_i ||D_i,g - D̄_g||^2) = sqrt(drift_g) · update_norm_g (NaN on rounds where the group is frozen)."""
    drift, step = frame[f"drift_{group}"].astype(float), frame[f"update_norm_{group}"].astype(float)
    return np.sqrt(drift.clip(lower=0.0)) * step


def parts(hist, group: str, last: int | None = 5, numel: int | None = None, frame=None) -> dict:
    """The relative drift, the mean step's norm and the dispersion of `group` (each the mean over the run's `last`
    rounds, all rounds where None), keyed `drift_<g>`, `step_<g>`, `disp_<g>`; with `numel` (the group's parameter
    count, `group_sizes`) also `disp_<g>_per_param` = the dispersion / sqrt(numel). NaN for a run that diverged or
    in which the group never trained. `frame`: the History's frame where the caller has it already (it is not built
    again)."""
    keys = [f"drift_{group}", f"step_{group}", f"disp_{group}"] + ([f"disp_{group}_per_param"] if numel else [])
    frame = hist.to_frame() if frame is None else frame
    if hist.diverged or f"drift_{group}" not in frame:
        return dict.fromkeys(keys, math.nan)
    frame = frame if last is None else frame.tail(last)
    out = {keys[0]: float(frame[f"drift_{group}"].astype(float).mean()),
           keys[1]: float(frame[f"update_norm_{group}"].astype(float).mean()),
           keys[2]: float(dispersion(frame, group).mean())}
    if numel:
        out[keys[3]] = out[keys[2]] / math.sqrt(numel)
    return out


def group_sizes(cfg, num_classes: int) -> dict:
    """{group: parameter count} of `cfg`'s model with `num_classes` outputs (the dataset's classes, or a text's
    vocabulary) after the Q/K/V split (`qkv.group_sizes`): the groups of the History's drift columns, empty groups
    left out. Builds the model once; no data is read."""
    from ..nets import models, qkv

    model = models.create(cfg.model, int(num_classes), **dict(cfg.model_kwargs or {}))
    qkv.split_qkv(model)
    return {g: size["params"] for g, size in qkv.group_sizes(model).items() if size["params"]}


def bits_per_char(loss: float) -> float:
    """Cross-entropy in nats per character as bits per character (loss / ln 2)."""
    return float(loss) / math.log(2)
