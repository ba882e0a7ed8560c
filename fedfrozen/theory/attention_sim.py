"""Notebook 01's executable theory past linear attention: a softmax kernel and several heads (notebook 12 § 2).

fedfrozen.theory.linear_attention runs the paper's model in closed form: one linear-attention head read out by the last
token. Here the same two-stage FedAvg runs on

    f(X) = sum_h sum_j a_hj(X) (x_j · v_h),   a_hj = r^T K_h x_j / n        (kernel="linear")
                                              a_hj = softmax_j(r^T K_h x_j / sqrt(d))   (kernel="softmax")

with K_h = W_Q,h W_K,hᵀ (d × d/H each, H = `heads`) and the readout token r = x_n, by autograd (float64, every
client's local steps at once). For a fixed kernel the prediction is still linear in the values, f = z(X; K) · v
with z_h = sum_j a_hj x_j, so the frozen stage is again ridge regression with a closed-form optimum (`value_optimum`),
and the paper's decomposition (bias, kernel drift, value drift) is computed as notebook 01 computes it. With
kernel="linear" and heads=1 the model is fedfrozen.theory.linear_attention's (a test).

Client i's teacher has the student's form: K_h,i* and v_h,i* are the shared teacher's moved by sigma in direction and
rescaled to its norms (as in linear_attention.make_clients), plus label noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["KERNELS", "Task", "make_task", "features", "global_loss", "value_optimum", "strong_convexity",
           "init_weights", "simulate", "centralised", "min_profile", "warmup_sweep", "lambda_sweep", "best_warmup"]

DT = torch.float64
KERNELS = ("linear", "softmax")


@dataclass
class Task:
    """Stacked client data: tokens X (N, m, n, d), targets y (N, m), weights p (N,), the kernel and heads."""

    X: torch.Tensor
    y: torch.Tensor
    p: torch.Tensor
    kernel: str
    heads: int

    @property
    def dim(self) -> int:
        return self.X.shape[-1]


def _check(kernel: str, heads: int, d: int) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}; got {kernel!r}")
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 or d % heads:
        raise ValueError(f"heads must be a positive integer dividing d ({d}); got {heads!r}")


def features(WQ: torch.Tensor, WK: torch.Tensor, X: torch.Tensor, kernel: str) -> torch.Tensor:
    """z (..., m, H, d): per head the attention-weighted tokens. WQ, WK: (..., H, d, d/H), broadcast over X's
    leading client dimension (N, m, n, d)."""
    n, d = X.shape[-2], X.shape[-1]
    r = X[..., -1, :]                                          # (N, m, d) the readout token
    q = torch.einsum("...md,...hde->...mhe", r, WQ)            # (N, m, H, d/H)
    k = torch.einsum("...mjd,...hde->...mhje", X, WK)          # (N, m, H, n, d/H)
    logits = torch.einsum("...mhe,...mhje->...mhj", q, k)      # (N, m, H, n) = r^T K_h x_j
    a = logits / n if kernel == "linear" else torch.softmax(logits / math.sqrt(d), dim=-1)
    return torch.einsum("...mhj,...mjd->...mhd", a, X)


def _predict(WQ, WK, v, X, kernel):
    return torch.einsum("...mhd,...hd->...m", features(WQ, WK, X, kernel), v)


def _client_losses(WQ, WK, v, t: Task) -> torch.Tensor:
    return 0.5 * ((_predict(WQ, WK, v, t.X, t.kernel) - t.y) ** 2).mean(dim=-1)


def global_loss(WQ, WK, v, t: Task, lam: float = 0.0) -> torch.Tensor:
    """sum_i p_i L_i + (lam/2) ||v||^2 at shared weights."""
    return t.p @ _client_losses(WQ, WK, v, t) + 0.5 * lam * v.pow(2).sum()


def _unit(rng, shape):
    a = rng.standard_normal(shape)
    return a / np.linalg.norm(a)


def make_task(n_clients: int = 10, d: int = 8, n_tokens: int = 8, samples: int = 100, sigma: float = 1.0,
              kernel: str = "softmax", heads: int = 1, noise: float = 0.1, seed: int = 0,
              heldout: bool = False) -> Task:
    """Clients whose teachers (of the student's form) differ by sigma; `heldout` draws fresh samples of the same
    clients. The teachers depend on `seed` only."""
    _check(kernel, heads, d)
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0; got {sigma}")
    dh = d // heads
    trng = np.random.default_rng([seed, 10])
    # entries of K_h* = Q_h* K_h*ᵀ of variance 1/d, as linear_attention's K* (and softmax logits of unit scale)
    Q_star = trng.standard_normal((heads, d, dh)) / (d * dh) ** 0.25
    K_star = trng.standard_normal((heads, d, dh)) / (d * dh) ** 0.25
    v_star = trng.standard_normal((heads, d)) / math.sqrt(heads)
    drng = np.random.default_rng([seed, 12 if heldout else 11])
    Xs, ys = [], []
    for _ in range(n_clients):
        teacher = []
        for w in (Q_star, K_star, v_star):
            wi = w + sigma * np.linalg.norm(w) * _unit(trng, w.shape)
            teacher.append(torch.as_tensor(wi * np.linalg.norm(w) / np.linalg.norm(wi), dtype=DT))
        X = torch.as_tensor(drng.standard_normal((samples, n_tokens, d)), dtype=DT)
        y = _predict(*teacher, X, kernel) + noise * torch.as_tensor(drng.standard_normal(samples), dtype=DT)
        Xs.append(X)
        ys.append(y)
    return Task(torch.stack(Xs), torch.stack(ys), torch.full((n_clients,), 1.0 / n_clients, dtype=DT), kernel, heads)


def _gram(WQ, WK, t: Task):
    """The frozen stage's normal equations at the kernel (WQ, WK): G = sum_i p_i Z_iᵀ Z_i / m and b (differentiable in
    the kernel; callers that only read them pass detached weights)."""
    Z = features(WQ, WK, t.X, t.kernel).flatten(-2)  # (N, m, H d)
    m = t.y.shape[1]
    return torch.einsum("n,nsd,nse->de", t.p, Z, Z) / m, torch.einsum("n,nsd,ns->d", t.p, Z, t.y) / m


def _solve(G, b, t: Task, lam: float) -> torch.Tensor:
    return torch.linalg.solve(G + lam * torch.eye(len(b), dtype=DT), b).reshape(t.heads, t.dim)


def value_optimum(WQ, WK, t: Task, lam: float) -> torch.Tensor:
    """argmin_v of the frozen stage's problem (ridge regression on z), shape (H, d)."""
    return _solve(*_gram(WQ.detach(), WK.detach(), t), t, lam)


def strong_convexity(WQ, WK, t: Task, lam: float) -> float:
    """Smallest eigenvalue of the frozen stage's Hessian G + lam I (always >= lam)."""
    G, _ = _gram(WQ.detach(), WK.detach(), t)
    return float(torch.linalg.eigvalsh(G + lam * torch.eye(len(G), dtype=DT))[0])


def _profile(WQ, WK, t: Task, lam: float) -> torch.Tensor:
    """Phi = min_v of the global objective at the kernel (WQ, WK), differentiable in the kernel."""
    return global_loss(WQ, WK, _solve(*_gram(WQ, WK, t), t, lam), t, lam)


def init_weights(d: int, heads: int, seed: int, scale: float = 0.5):
    """W_Q, W_K near scale * (the identity's columns of each head), and v = 0."""
    g = torch.Generator().manual_seed(seed)
    dh = d // heads
    eye = torch.eye(d, dtype=DT).reshape(d, heads, dh).permute(1, 0, 2).contiguous()  # (H, d, dh)
    WQ = scale * (eye + torch.randn(heads, d, dh, generator=g, dtype=DT) / math.sqrt(d))
    WK = scale * (eye + torch.randn(heads, d, dh, generator=g, dtype=DT) / math.sqrt(d))
    return WQ, WK, torch.zeros(heads, d, dtype=DT)


def _local(q, k, v, t: Task, steps: int, lr: float, lam: float, frozen: bool, weighted: bool = False):
    """`steps` full-batch gradient steps of every client at once (per-client weights, leading dim N); `weighted`:
    one shared set of weights on the pooled objective (the drift-free reference)."""
    for _ in range(steps):
        q, k = q.detach().requires_grad_(not frozen), k.detach().requires_grad_(not frozen)
        v = v.detach().requires_grad_()
        if weighted:
            loss = global_loss(q, k, v, t, lam)
        else:
            loss = (_client_losses(q, k, v, t) + 0.5 * lam * v.pow(2).flatten(1).sum(1)).sum()
        grads = torch.autograd.grad(loss, [w for w in (q, k, v) if w.requires_grad])
        if frozen:
            v = v - lr * grads[0]
        else:
            q, k, v = q - lr * grads[0], k - lr * grads[1], v - lr * grads[2]
    return q.detach(), k.detach(), v.detach()


def simulate(t: Task, *, rounds: int, warmup: int, local_steps: int, lr: float, lam: float = 0.0, init=None,
             seed: int = 0) -> dict:
    """Two-stage FedAvg: `warmup` rounds on (W_Q, W_K, v), then the kernel frozen and FedAvg on v. Returns the
    kernel at the switch (WQ_T0, WK_T0), the final weights and the global loss after every round."""
    N = t.X.shape[0]
    WQ, WK, v = init if init is not None else init_weights(t.dim, t.heads, seed)
    losses, at_T0 = [], None
    for r in range(rounds):
        frozen = r >= warmup
        if frozen and at_T0 is None:
            at_T0 = (WQ, WK)
        q, k, vv = (w.unsqueeze(0).repeat(N, *([1] * w.dim())) for w in (WQ, WK, v))
        q, k, vv = _local(q, k, vv, t, local_steps, lr, lam, frozen)
        if not frozen:
            WQ, WK = torch.einsum("n,n...->...", t.p, q), torch.einsum("n,n...->...", t.p, k)
        v = torch.einsum("n,n...->...", t.p, vv)
        losses.append(float(global_loss(WQ, WK, v, t)))
    if at_T0 is None:
        at_T0 = (WQ, WK)
    return {"WQ_T0": at_T0[0], "WK_T0": at_T0[1], "WQ": WQ, "WK": WK, "v": v, "losses": losses}


def centralised(t: Task, *, steps: int, lr: float, lam: float = 0.0, init=None, seed: int = 0):
    """Gradient descent on the pooled objective from the same start (drift-free): (WQ, WK, v) after `steps`."""
    WQ, WK, v = init if init is not None else init_weights(t.dim, t.heads, seed)
    return _local(WQ, WK, v, t, steps, lr, lam, frozen=False, weighted=True)


def min_profile(t: Task, lam: float, WQ0, WK0, iters: int = 100) -> float:
    """An estimate of min Phi over the kernel: L-BFGS on (W_Q, W_K) from a start (a local minimum)."""
    WQ, WK = (w.detach().clone().contiguous().requires_grad_(True) for w in (WQ0, WK0))
    opt = torch.optim.LBFGS([WQ, WK], max_iter=iters, line_search_fn="strong_wolfe", tolerance_grad=1e-12,
                            tolerance_change=1e-15)

    def closure():
        opt.zero_grad()
        loss = _profile(WQ, WK, t, lam)
        loss.backward()
        return loss

    opt.step(closure)
    return float(_profile(WQ.detach(), WK.detach(), t, lam))


def warmup_sweep(sigmas, warmups, seeds, *, kernel: str, heads: int, rounds: int, local_steps: int, lr: float,
                 lam: float = 1e-3, n_clients: int = 10, samples: int = 100, d: int = 8, lbfgs_iters: int = 100,
                 progress: bool = True):
    """Notebook 01's warm-up sweep for this model: per (sigma, seed, T0) the bias, kernel drift, value drift and
    final train and held-out losses (one row per run)."""
    import pandas as pd

    from ..base.progress import progress_bar

    rows = []
    grid = [(s, seed) for s in sigmas for seed in seeds]
    for sigma, seed in progress_bar(grid, progress, desc=f"warm-up sweep ({kernel}, {heads} heads)", leave=False):
        common = dict(n_clients=n_clients, d=d, samples=samples, sigma=sigma, kernel=kernel, heads=heads, seed=seed)
        t, h = make_task(**common), make_task(**common, heldout=True)
        init = init_weights(d, heads, seed)
        ref = centralised(t, steps=2 * rounds * local_steps, lr=lr, lam=lam, init=init)
        phi_min = min_profile(t, lam, ref[0], ref[1], iters=lbfgs_iters)
        for T0 in warmups:
            sim = simulate(t, rounds=rounds, warmup=T0, local_steps=local_steps, lr=lr, lam=lam, init=init)
            c = centralised(t, steps=T0 * local_steps, lr=lr, lam=lam, init=init)
            phi_c = float(_profile(c[0], c[1], t, lam))
            phi_fed = float(_profile(sim["WQ_T0"], sim["WK_T0"], t, lam))
            v_opt = value_optimum(sim["WQ_T0"], sim["WK_T0"], t, lam)
            rows.append({"kernel": kernel, "heads": heads, "sigma": sigma, "seed": seed, "local_steps": local_steps,
                         "warmup": T0, "diverged": not math.isfinite(sim["losses"][-1]),
                         "bias": phi_c - phi_min, "kernel_drift": phi_fed - phi_c,
                         "value_drift": float((sim["v"] - v_opt).norm()),
                         "train_loss": float(global_loss(sim["WQ"], sim["WK"], sim["v"], t)),
                         "heldout_loss": float(global_loss(sim["WQ"], sim["WK"], sim["v"], h))})
    return pd.DataFrame(rows)


def best_warmup(sweep, col: str = "train_loss"):
    """The T0 of the lowest mean `col` over seeds, per (kernel, heads, sigma) (ties to the earlier T0)."""
    means = sweep.groupby(["kernel", "heads", "sigma", "warmup"])[col].mean().reset_index()
    return means.sort_values(["kernel", "heads", "sigma", col, "warmup"]).groupby(["kernel", "heads", "sigma"]).first()[
        "warmup"]


def lambda_sweep(lams, local_steps_list, seeds, *, kernel: str, heads: int, sigma: float, rounds: int, warmup: int,
                 lr: float, n_clients: int = 10, samples: int = 100, d: int = 8, progress: bool = True):
    """Notebook 01's frozen-stage sweep for this model: one warm-up per seed, then per (lam, E) the frozen stage
    for the remaining rounds; value drift, strong convexity, train and held-out loss (and at the value optimum)."""
    import pandas as pd

    from ..base.progress import progress_bar

    rows = []
    for seed in progress_bar(seeds, progress, desc=f"lambda sweep ({kernel}, {heads} heads)", leave=False):
        common = dict(n_clients=n_clients, d=d, samples=samples, sigma=sigma, kernel=kernel, heads=heads, seed=seed)
        t, h = make_task(**common), make_task(**common, heldout=True)
        warm = simulate(t, rounds=warmup, warmup=warmup, local_steps=local_steps_list[-1], lr=lr, seed=seed)
        start = (warm["WQ"], warm["WK"], warm["v"])
        if not all(torch.isfinite(w).all() for w in start):  # the warm-up diverged: no frozen stage to measure
            rows += [{"kernel": kernel, "heads": heads, "seed": seed, "lam": lam, "local_steps": E, "diverged": True}
                     for lam in lams for E in local_steps_list]
            continue
        for lam in lams:
            for E in local_steps_list:
                sim = simulate(t, rounds=rounds - warmup, warmup=0, local_steps=E, lr=lr, lam=lam, init=start)
                v_opt = value_optimum(warm["WQ"], warm["WK"], t, lam)
                rows.append({"kernel": kernel, "heads": heads, "seed": seed, "lam": lam, "local_steps": E,
                             "diverged": not bool(torch.isfinite(sim["v"]).all()),
                             "value_drift": float((sim["v"] - v_opt).norm()),
                             "strong_convexity": strong_convexity(warm["WQ"], warm["WK"], t, lam),
                             "train_loss": float(global_loss(warm["WQ"], warm["WK"], sim["v"], t)),
                             "heldout_loss": float(global_loss(warm["WQ"], warm["WK"], sim["v"], h)),
                             "train_loss_at_optimum": float(global_loss(warm["WQ"], warm["WK"], v_opt, t)),
                             "heldout_loss_at_optimum": float(global_loss(warm["WQ"], warm["WK"], v_opt, h))})
    return pd.DataFrame(rows)
