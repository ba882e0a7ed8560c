"""The paper's linear-attention analysis, executable (paper, Sec. 4).

Model: single-layer linear attention on token matrices X in R^{n x d},
    f(X) = (1/n) r(X)^T W_Q W_K^T X^T X W_V = r^T K M v,   K = W_Q W_K^T,  M = X^T X / n,
with readout token r(X) (the last token) and a scalar value vector v = W_V in R^d. For a fixed
kernel K the prediction is linear in v with features z(X; K) = M K^T r, so the value problem
is ridge regression (closed form `value_optimum`), and the kernel-profile objective is
    Phi(K) = min_v sum_i p_i L_i(K, v) + (lam/2) ||v||^2,  L_i = mean squared error / 2.
Clients draw data from their own teachers K_i* = K* + sigma ||K*|| E_i, v_i* = v* + sigma ||v*|| F_i.

Everything is float64 torch, full batch, seconds on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["ClientData", "make_clients", "features", "global_loss", "value_optimum", "profile_objective",
           "profile_gradient", "strong_convexity", "simulate", "centralised", "min_profile", "decompose"]

DT = torch.float64


@dataclass
class ClientData:
    """One client's samples: readouts r (m, d), second moments M (m, d, d), targets y (m,)."""

    r: torch.Tensor
    M: torch.Tensor
    y: torch.Tensor


def _unit(rng, shape):
    a = rng.standard_normal(shape)
    return a / np.linalg.norm(a)


def make_clients(n_clients: int = 10, d: int = 8, n_tokens: int = 8, samples: int = 200, sigma: float = 1.0,
                 noise: float = 0.1, covariance_shift: float = 0.0, seed: int = 0, teacher_seed: int | None = None,
                 heldout: bool = False):
    """Clients with client-specific teachers (and optional input-covariance shift).

    Returns (clients, weights p_i). `heldout=True` draws fresh samples from the same clients'
    distributions (same teachers: pass the same seed), for held-out loss.
    """
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0; got {sigma}")
    if n_clients < 1 or samples < 1:
        raise ValueError("n_clients and samples must be >= 1")
    trng = np.random.default_rng(seed if teacher_seed is None else teacher_seed)
    K_star = trng.standard_normal((d, d)) / np.sqrt(d)
    v_star = trng.standard_normal(d)
    teachers, scales = [], []
    for _ in range(n_clients):
        K_i = K_star + sigma * np.linalg.norm(K_star) * _unit(trng, (d, d))
        v_i = v_star + sigma * np.linalg.norm(v_star) * _unit(trng, d)
        scale = 1.0 + covariance_shift * trng.standard_normal(d)
        teachers.append((K_i, v_i))
        scales.append(np.abs(scale) + 0.1 * (covariance_shift > 0))
    drng = np.random.default_rng([seed, 1 if heldout else 0])
    clients = []
    for (K_i, v_i), scale in zip(teachers, scales):
        X = drng.standard_normal((samples, n_tokens, d)) * scale
        r = X[:, -1, :]
        M = np.einsum("snd,sne->sde", X, X) / n_tokens
        y = np.einsum("sd,de,sef,f->s", r, K_i, M, v_i)
        y = y + noise * drng.standard_normal(samples)
        clients.append(ClientData(*(torch.as_tensor(a, dtype=DT) for a in (r, M, y))))
    p = torch.full((n_clients,), 1.0 / n_clients, dtype=DT)
    return clients, p


def features(K: torch.Tensor, c: ClientData) -> torch.Tensor:
    """z(X; K) = M K^T r per sample: f = z^T v."""
    return torch.einsum("sde,fe,sf->sd", c.M, K, c.r)


def _client_loss(K, v, c: ClientData):
    return 0.5 * ((features(K, c) @ v - c.y) ** 2).mean()


def global_loss(K, v, clients, p, lam: float = 0.0):
    """sum_i p_i L_i(K, v) + (lam/2) ||v||^2."""
    loss = sum(pi * _client_loss(K, v, c) for pi, c in zip(p, clients))
    return loss + 0.5 * lam * (v @ v)


def _gram(K, clients, p):
    d = K.shape[0]
    A = torch.zeros(d, d, dtype=DT)
    b = torch.zeros(d, dtype=DT)
    for pi, c in zip(p, clients):
        Z = features(K, c)
        A += pi * Z.T @ Z / len(c.y)
        b += pi * Z.T @ c.y / len(c.y)
    return A, b


def value_optimum(K, clients, p, lam: float):
    """argmin_v of the value problem for fixed K: (G + lam I)^-1 b, G = sum p_i Z_i^T Z_i / m_i."""
    A, b = _gram(K.detach(), clients, p)
    return torch.linalg.solve(A + lam * torch.eye(len(b), dtype=DT), b)


def profile_objective(K, clients, p, lam: float):
    """Phi(K) = min_v global_loss(K, v) (the kernel-profile objective)."""
    return global_loss(K, value_optimum(K, clients, p, lam), clients, p, lam)


def profile_gradient(K, clients, p, lam: float):
    """grad Phi(K): by the envelope theorem, the K-gradient of the loss at v = v*(K)."""
    v = value_optimum(K, clients, p, lam)
    K = K.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(global_loss(K, v, clients, p, lam), K)
    return g


def strong_convexity(K, clients, p, lam: float) -> float:
    """Smallest eigenvalue of the value problem's Hessian G + lam I (>= lam)."""
    A, _ = _gram(K.detach(), clients, p)
    return float(torch.linalg.eigvalsh(A + lam * torch.eye(len(A), dtype=DT))[0])


# --- two-stage FedAvg and its drift-free reference -------------------------------------------

def init_weights(d: int, seed: int, scale: float = 0.3):
    g = torch.Generator().manual_seed(seed)
    WQ = scale * torch.randn(d, d, generator=g, dtype=DT) / np.sqrt(d) + torch.eye(d, dtype=DT) * scale
    WK = scale * torch.randn(d, d, generator=g, dtype=DT) / np.sqrt(d) + torch.eye(d, dtype=DT) * scale
    v = torch.zeros(d, dtype=DT)
    return WQ, WK, v


def _grads(WQ, WK, v, clients, p, lam):
    """Gradients of the loss on `clients` (weights p) w.r.t. WQ, WK, v."""
    WQ, WK, v = (t.detach().clone().requires_grad_(True) for t in (WQ, WK, v))
    loss = global_loss(WQ @ WK.T, v, clients, p, lam)
    return torch.autograd.grad(loss, (WQ, WK, v))


def simulate(clients, p, *, rounds: int, warmup: int, local_steps: int, lr: float, lam: float = 0.0,
             init=None, seed: int = 0):
    """Two-stage FedAvg: `warmup` rounds on (W_Q, W_K, v), then K frozen and FedAvg on v.

    Every client runs `local_steps` full-batch gradient steps per round on its own loss (+ the
    ridge term), the server averages with weights p. Returns dict with K at the switch (K_T0),
    the final (K, v) and the per-round global loss.
    """
    d = clients[0].r.shape[1]
    WQ, WK, v = init if init is not None else init_weights(d, seed)
    one = torch.ones(1, dtype=DT)
    losses = []
    K_T0 = WQ @ WK.T if warmup == 0 else None
    for r in range(rounds):
        frozen = r >= warmup
        if frozen and K_T0 is None:
            K_T0 = WQ @ WK.T
        new = [torch.zeros_like(WQ), torch.zeros_like(WK), torch.zeros_like(v)]
        for pi, c in zip(p, clients):
            q, k, vv = WQ.clone(), WK.clone(), v.clone()
            for _ in range(local_steps):
                gq, gk, gv = _grads(q, k, vv, [c], one, lam)
                if not frozen:
                    q, k = q - lr * gq, k - lr * gk
                vv = vv - lr * gv
            for acc, t in zip(new, (q, k, vv)):
                acc += pi * t
        WQ, WK, v = new if not frozen else (WQ, WK, new[2])
        losses.append(float(global_loss(WQ @ WK.T, v, clients, p)))
    if K_T0 is None:
        K_T0 = WQ @ WK.T
    return {"K_T0": K_T0, "K": WQ @ WK.T, "v": v, "losses": losses}


def centralised(clients, p, *, steps: int, lr: float, lam: float = 0.0, init=None, seed: int = 0):
    """Plain gradient descent on the pooled objective: the drift-free reference. Returns K after `steps`."""
    d = clients[0].r.shape[1]
    WQ, WK, v = init if init is not None else init_weights(d, seed)
    for _ in range(steps):
        gq, gk, gv = _grads(WQ, WK, v, clients, p, lam)
        WQ, WK, v = WQ - lr * gq, WK - lr * gk, v - lr * gv
    return WQ @ WK.T, v


def min_profile(clients, p, lam: float, K0, iters: int = 300) -> float:
    """An estimate of min_K Phi(K): L-BFGS on K from K0 (Phi is not convex: a local minimum)."""
    K = K0.detach().clone().requires_grad_(True)
    opt = torch.optim.LBFGS([K], max_iter=iters, line_search_fn="strong_wolfe", tolerance_grad=1e-12,
                            tolerance_change=1e-14)

    def closure():
        opt.zero_grad()
        loss = profile_objective(K, clients, p, lam)
        loss.backward()
        return loss

    opt.step(closure)
    return float(profile_objective(K.detach(), clients, p, lam))


def decompose(clients, p, heldout, *, rounds: int, warmup: int, local_steps: int, lr: float, lam: float,
              phi_min: float, seed: int = 0) -> dict:
    """bias, kernel drift, value drift and final losses of one two-stage run (paper, Sec. 4)."""
    init = init_weights(clients[0].r.shape[1], seed)
    sim = simulate(clients, p, rounds=rounds, warmup=warmup, local_steps=local_steps, lr=lr, lam=lam, init=init)
    K_c, _ = centralised(clients, p, steps=warmup * local_steps, lr=lr, lam=lam, init=init)
    phi_c = float(profile_objective(K_c, clients, p, lam))
    phi_fed = float(profile_objective(sim["K_T0"], clients, p, lam))
    v_opt = value_optimum(sim["K_T0"], clients, p, lam)
    K_final = sim["K"]
    return {
        "warmup": warmup,
        "bias": phi_c - phi_min,
        "kernel_drift": phi_fed - phi_c,
        "value_drift": float((sim["v"] - v_opt).norm()),
        "value_gap": float(global_loss(K_final, sim["v"], clients, p, lam)) - phi_fed if warmup < rounds else None,
        "train_loss": float(global_loss(K_final, sim["v"], clients, p)),
        "heldout_loss": float(global_loss(K_final, sim["v"], heldout, p)),
    }
