"""The paper's linear-attention analysis, executable (paper, Sec. 4).

Model: single-layer linear attention on token matrices X in R^{n x d},
    f(X) = (1/n) r(X)^T W_Q W_K^T X^T X W_V = r^T K M v,   K = W_Q W_K^T,  M = X^T X / n,
with the readout token r(X) (the last token) and a value vector v = W_V in R^d (scalar output).
For a fixed kernel K the prediction is linear in v with features z(X; K) = M K^T r, so the value
problem is ridge regression (`value_optimum`, closed form), and the kernel-profile objective is
    Phi(K) = min_v sum_i p_i L_i(K, v) + (lam/2) ||v||^2,   L_i = mean of (f - y)^2 / 2.
Client i draws data from its own teacher K_i* = K* + sigma ||K*|| E_i, v_i* = v* + sigma ||v*|| F_i
(unit-norm E_i, F_i; then rescaled to the norms of K*, v*, so that sigma changes the direction of a
client's teacher and not the scale of its labels), optionally with its own input scales, plus
label noise.

All clients are held stacked (`Clients`: r (N, m, d), M (N, m, d, d), y (N, m)) and gradients are
closed-form, so every client's local step is one batched tensor operation: a two-stage run of
10 clients x 200 samples x 60 rounds x 10 local steps takes well under a second. float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Clients", "make_clients", "features", "global_loss", "value_optimum", "profile_objective",
           "profile_gradient", "strong_convexity", "init_weights", "simulate", "centralised", "min_profile",
           "decompose", "warmup_sweep", "lambda_sweep", "rules_vs_oracle"]

DT = torch.float64


@dataclass
class Clients:
    """Stacked client data: readouts r (N, m, d), second moments M (N, m, d, d), targets y (N, m),
    and aggregation weights p (N,)."""

    r: torch.Tensor
    M: torch.Tensor
    y: torch.Tensor
    p: torch.Tensor

    @property
    def n_clients(self) -> int:
        return self.r.shape[0]

    @property
    def dim(self) -> int:
        return self.r.shape[2]


def _unit(rng, shape):
    a = rng.standard_normal(shape)
    return a / np.linalg.norm(a)


def make_clients(n_clients: int = 10, d: int = 8, n_tokens: int = 8, samples: int = 200, sigma: float = 1.0,
                 noise: float = 0.1, input_shift: float = 0.0, seed: int = 0, heldout: bool = False) -> Clients:
    """Clients with heterogeneous teachers (sigma) and optionally heterogeneous inputs (input_shift).

    The teachers depend on `seed` only; `heldout=True` draws fresh samples from the same clients'
    distributions (for held-out loss). Every client has `samples` samples and p_i = 1/N.
    """
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0; got {sigma}")
    if n_clients < 1 or samples < 1 or d < 1 or n_tokens < 1:
        raise ValueError("n_clients, samples, d and n_tokens must be >= 1")
    trng = np.random.default_rng([seed, 0])
    K_star = trng.standard_normal((d, d)) / np.sqrt(d)
    v_star = trng.standard_normal(d)
    drng = np.random.default_rng([seed, 2 if heldout else 1])
    rs, Ms, ys = [], [], []
    for _ in range(n_clients):
        K_i = K_star + sigma * np.linalg.norm(K_star) * _unit(trng, (d, d))
        v_i = v_star + sigma * np.linalg.norm(v_star) * _unit(trng, d)
        # rescaled to the shared teacher's norms: sigma moves the direction, not the scale of y
        K_i *= np.linalg.norm(K_star) / np.linalg.norm(K_i)
        v_i *= np.linalg.norm(v_star) / np.linalg.norm(v_i)
        scale = np.exp(input_shift * trng.standard_normal(d))
        X = drng.standard_normal((samples, n_tokens, d)) * scale
        r = X[:, -1, :]
        M = np.einsum("snd,sne->sde", X, X) / n_tokens
        y = np.einsum("sd,de,sef,f->s", r, K_i, M, v_i) + noise * drng.standard_normal(samples)
        rs.append(r)
        Ms.append(M)
        ys.append(y)
    as_t = lambda a: torch.as_tensor(np.stack(a), dtype=DT)  # noqa: E731
    return Clients(as_t(rs), as_t(Ms), as_t(ys), torch.full((n_clients,), 1.0 / n_clients, dtype=DT))


# --- the objective ------------------------------------------------------------------------

def features(K: torch.Tensor, c: Clients) -> torch.Tensor:
    """z = M K^T r per sample, shape (N, m, d); K is (d, d) or per client (N, d, d)."""
    u = c.r @ K  # (N, m, d): u_e = sum_d r_d K_de
    return (c.M * u.unsqueeze(-2)).sum(-1)  # z_f = sum_e M_fe u_e


def _client_losses(K, v, c: Clients) -> torch.Tensor:
    pred = torch.einsum("nsd,d->ns", features(K, c), v) if v.dim() == 1 else \
        torch.einsum("nsd,nd->ns", features(K, c), v)
    return 0.5 * ((pred - c.y) ** 2).mean(dim=1)


def global_loss(K, v, c: Clients, lam: float = 0.0) -> torch.Tensor:
    """sum_i p_i L_i(K, v) + (lam/2) ||v||^2."""
    return c.p @ _client_losses(K, v, c) + 0.5 * lam * (v @ v)


def _gram(K, c: Clients):
    Z = features(K.detach(), c)
    m = c.y.shape[1]
    G = torch.einsum("n,nsd,nse->de", c.p, Z, Z) / m
    b = torch.einsum("n,nsd,ns->d", c.p, Z, c.y) / m
    return G, b


def value_optimum(K, c: Clients, lam: float) -> torch.Tensor:
    """argmin_v of the value problem for fixed K: (G + lam I)^-1 b, G = sum_i p_i Z_i^T Z_i / m."""
    G, b = _gram(K, c)
    return torch.linalg.solve(G + lam * torch.eye(len(b), dtype=DT), b)


def profile_objective(K, c: Clients, lam: float) -> torch.Tensor:
    """Phi(K) = min_v sum_i p_i L_i(K, v) + (lam/2) ||v||^2 (the kernel-profile objective)."""
    return global_loss(K, value_optimum(K, c, lam), c, lam)


def profile_gradient(K, c: Clients, lam: float) -> torch.Tensor:
    """grad Phi(K) = d/dK of the loss at v = v*(K) (envelope theorem)."""
    v = value_optimum(K, c, lam)
    return _grads_K_v(K.detach().unsqueeze(0).expand(c.n_clients, -1, -1),
                      v.unsqueeze(0).expand(c.n_clients, -1), c, 0.0, weighted=True)[0]


def strong_convexity(K, c: Clients, lam: float) -> float:
    """Smallest eigenvalue of the value problem's Hessian G + lam I (always >= lam)."""
    G, _ = _gram(K, c)
    return float(torch.linalg.eigvalsh(G + lam * torch.eye(len(G), dtype=DT))[0])


# --- closed-form gradients, all clients at once ----------------------------------------------

def _grads_K_v(K, v, c: Clients, lam: float, weighted: bool = False):
    """Per-client gradients of L_i + (lam/2)||v||^2 in K (N, d, d) and v (N, d) at per-client
    (K_i, v_i); `weighted=True` returns sum_i p_i of them instead (shapes (d, d), (d,)).

    f = r^T K M v  =>  dL/dv = mean_s e_s z_s,  dL/dK = mean_s e_s r_s (M_s v)^T,  e = f - y.
    """
    N, m, d = c.r.shape
    z = features(K, c)
    e = (z * v.unsqueeze(1)).sum(-1) - c.y  # (N, m)
    w = torch.bmm(c.M.reshape(N, m * d, d), v.unsqueeze(-1)).reshape(N, m, d)  # M_s v
    er = c.r * (e / m).unsqueeze(-1)
    gK = er.transpose(1, 2) @ w  # (N, d, d)
    gv = torch.bmm(z.transpose(1, 2), (e / m).unsqueeze(-1)).squeeze(-1) + lam * v
    if weighted:
        return torch.einsum("n,nde->de", c.p, gK), c.p @ gv
    return gK, gv


def init_weights(d: int, seed: int, scale: float = 0.5):
    """W_Q, W_K near scale * I (a mild random kernel) and v = 0."""
    g = torch.Generator().manual_seed(seed)
    eye = torch.eye(d, dtype=DT)
    WQ = scale * (eye + torch.randn(d, d, generator=g, dtype=DT) / np.sqrt(d))
    WK = scale * (eye + torch.randn(d, d, generator=g, dtype=DT) / np.sqrt(d))
    return WQ, WK, torch.zeros(d, dtype=DT)


def simulate(c: Clients, *, rounds: int, warmup: int, local_steps: int, lr: float, lam: float = 0.0,
             init=None, seed: int = 0, rule: str | None = None, tau: float = 0.01, rho: float = 1.0,
             patience: int = 3) -> dict:
    """Two-stage FedAvg: `warmup` rounds on (W_Q, W_K, v), then K frozen and FedAvg on v.

    Each round every client runs `local_steps` full-batch gradient steps on L_i + (lam/2)||v||^2
    from the global weights; the server averages with weights p. Returns K at the switch (K_T0),
    the final K and v, the global loss after every round, and T0 (the first frozen round, `rounds`
    when K never froze).

    `rule` replaces the fixed `warmup` by an adaptive schedule deciding after every round, as the
    federated loop's schedules do (fedfrozen.methods.freezing): "kernel_plateau" freezes from the next
    round once the relative kernel change ||K^r - K^{r-1}|| / ||K^{r-1}|| stayed below `tau` for
    `patience` rounds; "drift_ratio" once the client drift of (W_Q, W_K) exceeded `rho` times that of v
    (drift: sum_i p_i ||D_i||^2 / ||sum_i p_i D_i||^2 - 1 over the clients' round updates D_i).
    """
    if rule not in (None, "kernel_plateau", "drift_ratio"):
        raise ValueError(f"rule must be None, 'kernel_plateau' or 'drift_ratio'; got {rule!r}")
    for name, value in (("tau", tau), ("rho", rho)):
        if not value >= 0:
            raise ValueError(f"{name} must be >= 0; got {value!r}")
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise ValueError(f"patience must be an integer >= 1; got {patience!r}")
    N, d = c.n_clients, c.dim
    WQ, WK, v = init if init is not None else init_weights(d, seed)
    T0 = rounds if rule is not None else warmup
    losses = []
    K_T0 = None
    streak = 0
    for r in range(rounds):
        frozen = r >= T0
        if frozen and K_T0 is None:
            K_T0 = WQ @ WK.T
        q, k, vv = (t.unsqueeze(0).repeat(N, *([1] * t.dim())) for t in (WQ, WK, v))
        for _ in range(local_steps):
            K = q @ k.transpose(1, 2)
            gK, gv = _grads_K_v(K, vv, c, lam)
            if not frozen:
                q, k = q - lr * gK @ k, k - lr * gK.transpose(1, 2) @ q
            vv = vv - lr * gv
        K_old = WQ @ WK.T
        if not frozen:
            dq = torch.cat([(q - WQ).flatten(1), (k - WK).flatten(1)], dim=1)
            WQ, WK = torch.einsum("n,nde->de", c.p, q), torch.einsum("n,nde->de", c.p, k)
        dv = vv - v
        v = c.p @ vv
        losses.append(float(global_loss(WQ @ WK.T, v, c)))
        if rule is not None and not frozen and r + 1 < rounds:
            if rule == "kernel_plateau":
                change = float((WQ @ WK.T - K_old).norm() / (K_old.norm() + 1e-12))
                fires = change < tau
            else:
                fires = _drift(dq, c.p) > rho * _drift(dv, c.p)
            streak = streak + 1 if fires else 0
            if streak >= patience:
                T0 = r + 1
    if K_T0 is None:
        K_T0 = WQ @ WK.T
    return {"K_T0": K_T0, "K": WQ @ WK.T, "v": v, "WQ": WQ, "WK": WK, "losses": losses, "T0": T0}


def _drift(updates: torch.Tensor, p: torch.Tensor) -> float:
    """Client drift of per-client updates (clients, entries): weighted spread over the squared mean update."""
    mean = p @ updates
    m2 = float(mean.pow(2).sum())
    return max(float(p @ updates.pow(2).sum(1)) - m2, 0.0) / (m2 + 1e-12)


def rules_vs_oracle(sigmas, seeds, *, warmups, rounds: int, local_steps: int, lr: float, lam: float = 1e-3,
                    taus=(0.01,), rhos=(1.0,), patience: int = 3, n_clients: int = 10, samples: int = 100,
                    d: int = 8):
    """Per (sigma, seed): the oracle fixed T0 (lowest final training loss over `warmups`) and, per rule
    and threshold, the T0 it chose and its final loss; regret = its loss minus the oracle's. A DataFrame."""
    import pandas as pd

    rows = []
    for sigma in sigmas:
        for seed in seeds:
            c = make_clients(n_clients, d, samples=samples, sigma=sigma, seed=seed)
            common = dict(rounds=rounds, local_steps=local_steps, lr=lr, lam=lam, seed=seed)
            fixed = {T0: simulate(c, warmup=T0, **common)["losses"][-1] for T0 in warmups}
            oracle_T0 = min(fixed, key=lambda t: (fixed[t], t))
            base = {"sigma": sigma, "seed": seed, "oracle_T0": oracle_T0, "oracle_loss": fixed[oracle_T0],
                    "no_freeze_loss": fixed.get(rounds, simulate(c, warmup=rounds, **common)["losses"][-1])}
            for rule, values in (("kernel_plateau", taus), ("drift_ratio", rhos)):
                for value in values:
                    kw = {"tau": value} if rule == "kernel_plateau" else {"rho": value}
                    out = simulate(c, warmup=rounds, rule=rule, patience=patience, **kw, **common)
                    rows.append({**base, "rule": rule, "threshold": value, "T0": out["T0"],
                                 "loss": out["losses"][-1], "regret": out["losses"][-1] - fixed[oracle_T0]})
    return pd.DataFrame(rows)


def centralised(c: Clients, *, steps: int, lr: float, lam: float = 0.0, init=None, seed: int = 0):
    """Gradient descent on the pooled objective sum_i p_i L_i (+ ridge) from the same start:
    the drift-free reference. Returns (K, v) after `steps` steps."""
    WQ, WK, v = init if init is not None else init_weights(c.dim, seed)
    N = c.n_clients
    for _ in range(steps):
        K = WQ @ WK.T
        gK, gv = _grads_K_v(K.expand(N, -1, -1), v.expand(N, -1), c, lam, weighted=True)
        WQ, WK, v = WQ - lr * gK @ WK, WK - lr * gK.T @ WQ, v - lr * gv
    return WQ @ WK.T, v


def min_profile(c: Clients, lam: float, K0, iters: int = 200) -> float:
    """An estimate of min_K Phi(K): L-BFGS on K from K0 (Phi is not convex: a local minimum)."""
    K = K0.detach().clone().requires_grad_(True)
    opt = torch.optim.LBFGS([K], max_iter=iters, line_search_fn="strong_wolfe", tolerance_grad=1e-12,
                            tolerance_change=1e-15)

    def closure():
        opt.zero_grad()
        K.grad = profile_gradient(K.detach(), c, lam)
        return profile_objective(K.detach(), c, lam)

    opt.step(closure)
    return float(profile_objective(K.detach(), c, lam))


def decompose(c: Clients, heldout: Clients, *, rounds: int, warmup: int, local_steps: int, lr: float,
              lam: float, phi_min: float, seed: int = 0) -> dict:
    """Bias, kernel drift, value drift and final losses of one two-stage run (paper, Sec. 4).

    bias = Phi(K^c_T0) - min Phi (the drift-free kernel after T0 rounds' worth of steps is not yet
    the best); kernel_drift = Phi(K_T0) - Phi(K^c_T0) (what heterogeneous local steps did to the
    kernel); value_drift = ||v_T - v*(K_T0)|| and value_gap its loss excess.
    """
    init = init_weights(c.dim, seed)
    sim = simulate(c, rounds=rounds, warmup=warmup, local_steps=local_steps, lr=lr, lam=lam, init=init)
    K_c, _ = centralised(c, steps=warmup * local_steps, lr=lr, lam=lam, init=init)
    phi_c = float(profile_objective(K_c, c, lam))
    phi_fed = float(profile_objective(sim["K_T0"], c, lam))
    v_opt = value_optimum(sim["K_T0"], c, lam)
    return {
        "warmup": warmup,
        "bias": phi_c - phi_min,
        "kernel_drift": phi_fed - phi_c,
        "value_drift": float((sim["v"] - v_opt).norm()),
        "value_gap": float(global_loss(sim["K"], sim["v"], c, lam)) - float(profile_objective(sim["K"], c, lam)),
        "train_loss": float(global_loss(sim["K"], sim["v"], c)),
        "heldout_loss": float(global_loss(sim["K"], sim["v"], heldout)),
    }


# --- sweeps for notebook 01 -------------------------------------------------------------------

def _reference_min(c: Clients, lam: float, rounds: int, local_steps: int, lr: float, seed: int,
                   iters: int) -> float:
    """min Phi, estimated by L-BFGS from the end of a long drift-free run (2x the federated budget)."""
    K, _ = centralised(c, steps=2 * rounds * local_steps, lr=lr, lam=lam, seed=seed)
    return min_profile(c, lam, K, iters=iters)


def warmup_sweep(sigmas, warmups, seeds, *, rounds: int, local_steps: int, lr: float, lam: float = 1e-3,
                 n_clients: int = 10, samples: int = 100, d: int = 8, lbfgs_iters: int = 200,
                 progress: bool = True):
    """Final losses and the bias / kernel-drift / value-drift decomposition for every
    (sigma, seed, T0): a DataFrame with one row per run (paper, Sec. 4, the warm-up trade-off)."""
    import pandas as pd

    from ..base.progress import progress_bar

    rows = []
    grid = [(s, seed) for s in sigmas for seed in seeds]
    for sigma, seed in progress_bar(grid, progress, desc="warm-up sweep", leave=False):
        c = make_clients(n_clients, d, samples=samples, sigma=sigma, seed=seed)
        h = make_clients(n_clients, d, samples=samples, sigma=sigma, seed=seed, heldout=True)
        phi_min = _reference_min(c, lam, rounds, local_steps, lr, seed, lbfgs_iters)
        for T0 in warmups:
            out = decompose(c, h, rounds=rounds, warmup=T0, local_steps=local_steps, lr=lr, lam=lam,
                            phi_min=phi_min, seed=seed)
            rows.append({"sigma": sigma, "seed": seed, "local_steps": local_steps, **out})
    return pd.DataFrame(rows)


def lambda_sweep(lams, local_steps_list, seeds, *, sigma: float, rounds: int, warmup: int, lr: float,
                 n_clients: int = 10, samples: int = 100, d: int = 8, progress: bool = True):
    """The frozen stage under a value penalty: for each seed one warm-up of `warmup` rounds
    (lam = 0, E = local_steps_list[-1]), then for each (lam, E) the frozen stage for the
    remaining rounds. Rows: value drift, strong convexity, train and held-out loss."""
    import pandas as pd

    from ..base.progress import progress_bar

    rows = []
    for seed in progress_bar(seeds, progress, desc="lambda sweep", leave=False):
        c = make_clients(n_clients, d, samples=samples, sigma=sigma, seed=seed)
        h = make_clients(n_clients, d, samples=samples, sigma=sigma, seed=seed, heldout=True)
        warm = simulate(c, rounds=warmup, warmup=warmup, local_steps=local_steps_list[-1], lr=lr, seed=seed)
        start = (warm["WQ"], warm["WK"], warm["v"])
        K = warm["K"]
        for lam in lams:
            for E in local_steps_list:
                sim = simulate(c, rounds=rounds - warmup, warmup=0, local_steps=E, lr=lr, lam=lam, init=start)
                v_opt = value_optimum(K, c, lam)
                rows.append({"seed": seed, "lam": lam, "local_steps": E,
                             "value_drift": float((sim["v"] - v_opt).norm()),
                             "strong_convexity": strong_convexity(K, c, lam),
                             "train_loss": float(global_loss(K, sim["v"], c)),
                             "heldout_loss": float(global_loss(K, sim["v"], h)),
                             "train_loss_at_optimum": float(global_loss(K, v_opt, c)),
                             "heldout_loss_at_optimum": float(global_loss(K, v_opt, h))})
    return pd.DataFrame(rows)
