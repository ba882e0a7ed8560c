"""Past the paper's own limits (notebook 12): C1 and C2 on models and federations the paper leaves to future work.

The paper's analysis rests on linear attention, its experiments on ViT-like backbones, and it leaves other attention
variants and larger federations with partial participation for later. The cells here test its claims there, each a
comparison with FedAvg of the same model and regime, paired by seed and judged as one family
(fedfrozen.studies.verdicts):

- `linear`: the linear attention of the paper's Sec. 4 (`linear_vit` with the identity feature map, out = Q Kᵀ V / n)
  at the cpu profile's ViT shape (28×28, patch 7, width 48, depth 3, 4 heads), pretrained like the ViT (a body per
  seed), FedAvg and FedFrozen at T0 = 0, 25% and 50% of the rounds, at Dirichlet 0.1 and 0.5 (C1: T0 25% at 0.1, on
  `seeds_c1`; C2: does some T0 beat FedAvg at 0.1, and is the best T0 earlier at 0.1 than at 0.5?);
- `swin`, `cait`: two other attention families from timm, windowed attention with relative position biases (Swin)
  and class attention with talking heads (CaiT), sized near the ViT's cost, pretrained like it: C1 at Dirichlet 0.1;
- `vit`: the cpu profile's ViT in the same setting (its runs are notebook 03 § 3's `bodies` cell, through the cache);
- `clients`: the same 12k subset and pretrained ViT over 100 and 1,000 clients, 10 a round, 6 local steps a round,
  240 rounds, every client dealt one image before the Dirichlet(0.1) draw (partition.MIN_SIZE_RULES "deal": no draw
  gives 1,000 clients an image each): FedAvg and FedFrozen T0 25% and 50%. Only `n_clients` differs between the two.

At the paper profile (CIFAR-10) every cell runs from scratch at vit_cifar's scale (PAPER_MODELS): its clients hold
every training image, so there is no pretrained start.

Every model's local rate is chosen by the one rule (fedfrozen.studies.selection.RULE) on REGIME_LR_GRID, for FedAvg
and for
FedFrozen, on SELECTION_SEED, which no comparison evaluates; where the two arms choose different rates, both arms run
at both (each comparison at a shared rate). The 100/1,000-client cells take the pretrained regime's rates
(profiles.REGIME_LR, selected at 100 clients, 120 rounds, one local epoch); between the two of them only `n_clients`
differs.

    rates, feature_map, table = families.rates_by_rule(profile, base, ["linear", "swin", "cait"])  # seed 100
    arms = families.build(profile, base, rates, seeds=..., ...)    # [Arm(cell, arm, cfg, model), ...]
    rows = families.comparisons(arms)                       # [Comparison(claim, label, cell, a, b, measure), ...]
"""

from __future__ import annotations

from ..engine.config import Config
from .controls import Arm, arms_of
from .profiles import REGIME_LR_GRID, among, dirichlet_fields, regime_learning_rates, regime_setup, select
from .selection import selection_t0
from .study import SELECTION_SEED, Comparison, Study, against_fedavg, selected_rates

__all__ = ["study", "client_counts", "clients_cell", "MODELS", "SMOKE_MODELS", "SELECTION_SEED", "CLIENT_COUNTS",
           "model_fields", "selection_configs", "trains_stably", "rates_by_rule", "build", "comparisons", "best_t0"]

# the models of notebook 12 at the cpu profile (28×28, one channel) and at the smoke profile's digits (8×8)
MODELS = {
    "vit": dict(model="vit_fmnist_w48"),
    "linear": dict(model="linear_vit", model_kwargs=dict(img_size=28, patch_size=7, feature_map="identity")),
    "swin": dict(model="swin_tiny_patch4_window7_224",
                 model_kwargs=dict(img_size=28, patch_size=4, in_chans=1, embed_dim=32, depths=(2, 1), num_heads=(2, 4),
                                   window_size=4, mlp_ratio=2.0)),
    "cait": dict(model="cait_xxs24_224",
                 model_kwargs=dict(img_size=28, patch_size=7, in_chans=1, embed_dim=48, depth=3, num_heads=4,
                                   mlp_ratio=2.0, depth_token_only=1)),
}
SMOKE_MODELS = {
    "vit": dict(model="vit_digits"),
    "linear": dict(model="linear_vit", model_kwargs=dict(embed_dim=16, depth=1, num_heads=2, feature_map="identity")),
    "swin": dict(model="swin_tiny_patch4_window7_224",
                 model_kwargs=dict(img_size=8, patch_size=2, in_chans=1, embed_dim=16, depths=(1, 1), num_heads=(2, 2),
                                   window_size=2, mlp_ratio=2.0)),
    "cait": dict(model="cait_xxs24_224",
                 model_kwargs=dict(img_size=8, patch_size=2, in_chans=1, embed_dim=16, depth=2, num_heads=2,
                                   mlp_ratio=2.0, depth_token_only=1)),
}
# the paper profile (CIFAR, 32×32, three channels; docs/paper_profile.md): the same families at vit_cifar's scale,
# from scratch (its clients hold every training image: no pretrained start)
PAPER_MODELS = {
    "vit": dict(model="vit_cifar"),
    "linear": dict(model="linear_vit", model_kwargs=dict(img_size=32, patch_size=4, in_chans=3, embed_dim=192, depth=7,
                                                         num_heads=3, feature_map="identity")),
    "swin": dict(model="swin_tiny_patch4_window7_224",
                 model_kwargs=dict(img_size=32, patch_size=4, in_chans=3, embed_dim=96, depths=(2, 2), num_heads=(3, 6),
                                   window_size=4, mlp_ratio=2.0)),
    "cait": dict(model="cait_xxs24_224",
                 model_kwargs=dict(img_size=32, patch_size=4, in_chans=3, embed_dim=192, depth=6, num_heads=4,
                                   mlp_ratio=2.0, depth_token_only=2)),
}
CLIENT_COUNTS = (100, 1000)
LARGE = dict(rounds=240, local_steps=6, local_epochs=None, min_client_samples=1, min_samples_by="deal")


def model_fields(profile: str, name: str, feature_map: str | None = None) -> dict:
    """Config fields of model `name` (MODELS; SMOKE_MODELS at the smoke profile); `feature_map` replaces the linear
    model's ("elu" where the identity map does not train stably)."""
    table = select(profile, smoke=SMOKE_MODELS, cpu=MODELS, paper=PAPER_MODELS)
    if name not in table:
        raise ValueError(f"model must be one of {', '.join(table)}; got {name!r}")
    fields = {k: (dict(v) if isinstance(v, dict) else v) for k, v in table[name].items()}
    if feature_map is not None:
        if name != "linear":
            raise ValueError(f"feature_map is a setting of the linear model; got model {name!r}")
        fields["model_kwargs"]["feature_map"] = feature_map
    return fields


def _start(profile: str, base: dict, name: str, feature_map: str | None) -> dict:
    """The fields of model `name`'s runs: pretrained with the ViT's recipe (smoke, cpu), or from scratch where the
    profile has no images outside the clients' (paper)."""
    fields = regime_setup(profile, base, "pretrained")
    if fields is None:
        fields = dict(base)
    fields = {k: v for k, v in fields.items() if k not in ("method", "lr")}  # each arm's own (the paper recipe has one)
    return {**fields, **model_fields(profile, name, feature_map)}


def selection_configs(profile: str, base: dict, name: str, methods=("fedavg", "fedfrozen"), grid=REGIME_LR_GRID,
                      feature_map: str | None = None) -> list[Config]:
    """The configs the one rule (selection.RULE) compares for model `name`: each method at each rate of `grid`,
    Dirichlet 0.1, T0 = 25%, pretrained with its own body, on SELECTION_SEED."""
    fields = _start(profile, base, name, feature_map)
    fields.update(warmup_rounds=selection_t0(fields["rounds"]), seed=SELECTION_SEED)
    if fields.get("init") == "pretrained":
        fields["pretrain_seed"] = SELECTION_SEED
    return [Config(method=m, lr=float(lr), **dirichlet_fields(0.1), **fields) for m in methods for lr in grid]


def trains_stably(cfgs, hists, num_classes: int = 10) -> bool:
    """Whether FedAvg's selection runs of a model trained: some rate did not diverge and reached twice chance in late
    validation accuracy (the rule by which the linear model keeps the identity feature map, else elu + 1)."""
    accs = [h.late("val_acc") for c, h in zip(cfgs, hists) if c.method == "fedavg" and not h.diverged]
    return any(a is not None and a >= 2 / num_classes for a in accs)


def rates_by_rule(profile: str, base: dict, names, grid=REGIME_LR_GRID, experiment: str | None = None):
    """Each model's rates by the one rule: its `selection_configs` trained (or loaded) and `selected_rates` of them;
    the linear model falls back to elu + 1 where the identity map does not train (`trains_stably`). Returns
    (rates {model: {method: rate}}, the linear model's feature map: None for the identity or "elu", and a table of
    every selection run: model, method, lr, late validation accuracy)."""
    import pandas as pd

    from ..runs.experiments import run_many

    experiment = experiment or base["dataset"]
    sel = {m: selection_configs(profile, base, m, grid=grid) for m in names}
    hists = run_many([c for cs in sel.values() for c in cs], experiment=experiment)
    rates, rows, feature_map, i = {}, [], None, 0
    for m, cs in sel.items():
        hs = hists[i:i + len(cs)]
        i += len(cs)
        if m == "linear" and not trains_stably(cs, hs):
            feature_map = "elu"
            cs = selection_configs(profile, base, m, grid=grid, feature_map="elu")
            hs = run_many(cs, experiment=experiment)
        rates[m] = selected_rates(cs, hs)
        rows += [dict(model=m, method=c.method, lr=c.lr, late_val_acc=None if h.diverged else h.late("val_acc"))
                 for c, h in zip(cs, hs)]
    return rates, feature_map, pd.DataFrame(rows, columns=["model", "method", "lr", "late_val_acc"])


def _pairs(rates, fractions):
    """FedAvg and FedFrozen at each fraction, every arm at every rate of `rates` (the arms' selected rates)."""
    arms = [("fedavg", None)] + [("fedfrozen", f) for f in fractions]
    return [(m, f, r) for r in sorted(set(rates)) for m, f in arms]


def build(profile: str, base: dict, rates: dict, seeds=range(5), seeds_c1=range(15), seeds_large=range(5),
          alphas=(0.1, 0.5), cells=("linear", "swin", "cait", "vit", "clients"),
          feature_map: str | None = None) -> list[Arm]:
    """Every arm of notebook 12's `cells`, one Arm per seed. `rates`: {model: {method: rate}} of the rule
    (`selected_rates`) for the models that need one (linear, swin, cait); `seeds` for every cell, `seeds_c1` for the
    linear model's C1 pair at Dirichlet 0.1 (FedAvg, T0 25%), `seeds_large` for the 100/1,000-client cells."""
    known = ("linear", "swin", "cait", "vit", "clients")
    cells = among("cells", cells, known)
    seeds, seeds_c1, seeds_large = list(seeds), list(seeds_c1), list(seeds_large)
    if not seeds or not seeds_large:
        raise ValueError("seeds and seeds_large must not be empty")
    out: list[Arm] = []
    pretrained_lr = regime_learning_rates("pretrained", ["fedavg"], profile=profile, dataset=base["dataset"])["fedavg"]
    for name in ("linear", "swin", "cait", "vit"):
        if name not in cells:
            continue
        fields = _start(profile, base, name, feature_map if name == "linear" else None)
        rounds = fields["rounds"]
        if name == "vit":  # notebook 03 § 3's bodies cell (FedAvg's pretrained rate, which FedFrozen selected too)
            model_rates = [pretrained_lr]
        else:
            if name not in rates:
                raise ValueError(f"rates has no selected rates for model {name!r}")
            model_rates = list(rates[name].values())
        if name == "linear":
            for a in alphas:
                out += arms_of(f"linear, Dir {a:g}", fields, a, seeds, _pairs(model_rates, (0.0, 0.25, 0.5)),
                               rounds, model=name, bodies=True)
            extra = [s for s in seeds_c1 if s not in seeds]
            out += arms_of(f"linear, Dir {alphas[0]:g}", fields, alphas[0], extra, _pairs(model_rates, (0.25,)),
                           rounds, model=name, bodies=True)
        else:
            out += arms_of(f"{name}, Dir 0.1", fields, 0.1, seeds, _pairs(model_rates, (0.25,)), rounds, model=name,
                           bodies=True)
    if "clients" in cells:
        fields = {**_start(profile, base, "vit", None), **LARGE}
        if select(profile, smoke=True, cpu=False, paper=False):  # digits: 1,000 images, 10 and 100 clients
            fields.update(rounds=4, local_steps=2)
        counts = client_counts(profile)
        for n in counts:
            f = {**fields, "n_clients": n}
            out += arms_of(clients_cell(n), f, 0.1, seeds_large, _pairs([pretrained_lr], (0.25, 0.5)),
                           f["rounds"], model="vit", bodies=True)
    return out


def client_counts(profile: str) -> tuple:
    """The federation sizes of the `clients` cells at `profile` (CLIENT_COUNTS; the smoke profile's digits: 10, 100)."""
    return select(profile, smoke=(10, 100), cpu=CLIENT_COUNTS, paper=CLIENT_COUNTS)


def clients_cell(n: int) -> str:
    """The name of the `clients` cell of `n` clients (as `build` names it)."""
    return f"{n} clients, Dir 0.1"


def comparisons(arms: list[Arm]) -> list[Comparison]:
    """Each FedFrozen arm against FedAvg of its cell at the same rate (C1 for T0 25%, C2 for the others), a minus b
    paired by seed (`study.against_fedavg`)."""
    return against_fedavg(arms)


def best_t0(stats_means: dict) -> str:
    """The arm with the highest mean among {arm label: mean late accuracy} (FedAvg included: 'never')."""
    return max(stats_means, key=lambda k: (stats_means[k], k))


def study(profile: str, base: dict, rates: dict, seeds=range(5), seeds_c1=range(15), seeds_large=range(5),
          alphas=(0.1, 0.5), cells=("linear", "swin", "cait", "vit", "clients"),
          feature_map: str | None = None) -> Study:
    """Notebook 12's study: `build`'s arms and their `comparisons`."""
    arms = build(profile, base, rates, seeds=seeds, seeds_c1=seeds_c1, seeds_large=seeds_large, alphas=alphas,
                 cells=cells, feature_map=feature_map)
    return Study("12", tuple(arms), tuple(comparisons(arms)))
