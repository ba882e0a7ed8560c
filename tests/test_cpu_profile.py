"""The cpu profile's pieces: the fixed training subset, late accuracy, arms with published optimisers, rates."""

import math

import pytest
import torch

import fedfrozen as ff


def _split(labels):
    y = torch.tensor(labels)
    return ff.data.from_tensors(torch.arange(len(labels), dtype=torch.float32).view(-1, 1, 1, 1), y)


def test_subset_is_stratified_fixed_and_in_order():
    split = _split([0] * 60 + [1] * 30 + [2] * 10)
    sub = ff.data.subset(split, 20)
    assert torch.bincount(sub.y).tolist() == [12, 6, 2]  # each class's share kept
    assert torch.equal(sub.x, ff.data.subset(split, 20).x)  # the same images every time (SUBSET_SEED)
    assert (sub.x.view(-1).diff() > 0).all()  # in the split's order
    assert len(ff.data.subset(split, 7)) == 7  # largest remainders make up the total
    assert ff.data.subset(split, 500) is split
    with pytest.raises(ValueError, match="train_subset"):
        ff.data.subset(split, 0)


def test_train_subset_is_the_same_for_every_seed_and_named_when_invalid():
    cfg = ff.Config(train_subset=300, n_clients=3, rounds=1, local_steps=1, model_kwargs=dict(embed_dim=16, depth=1,
                                                                                              num_heads=2))
    a, b = ff.loop.prepare(cfg), ff.loop.prepare(cfg.replace(seed=1))
    pool = lambda s: sorted(torch.cat([*s.client_train, *s.client_eval, s.val_idx]).tolist())  # noqa: E731
    assert len(pool(a)) == 300
    assert torch.equal(a.x, b.x)  # the subset does not depend on the run's seed
    with pytest.raises(ValueError, match="train_subset"):
        ff.Config(train_subset=0)


def test_late_accuracy_is_the_mean_of_the_last_evaluations():
    h = ff.History()
    for r, acc in enumerate([0.1, None, 0.5, None, 0.6, 0.7]):
        h.append({"round": r, "test_acc": acc})
    assert h.final_accuracy == 0.7
    assert h.late_accuracy == pytest.approx((0.5 + 0.6 + 0.7) / 3)
    assert h.late("test_acc", k=10) == pytest.approx((0.1 + 0.5 + 0.6 + 0.7) / 4)
    assert ff.History().late_accuracy is None


def test_arms_and_their_rates():
    assert ff.profiles.arm("scaffold:sgd") == dict(method="scaffold", **ff.profiles.SGD_AS_PUBLISHED)
    assert ff.profiles.arm("fedavg") == {"method": "fedavg"}
    with pytest.raises(ValueError, match="only variant"):
        ff.profiles.arm("fedavg:adam")
    cfg = ff.Config(**{**ff.profiles.federated("cpu"), **ff.profiles.arm("scaffold:sgd")})
    assert cfg.optimizer == "sgd" and cfg.momentum == 0 and ff.methods.scaffold.scaffold_variant(cfg) == "update"
    lrs = ff.profiles.learning_rates(["fedavg", "fedavg:sgd", "scaffold:sgd", "freeze_v"], profile="cpu")
    assert lrs["fedavg"] == ff.profiles.CPU_LR["fedavg"] and lrs["fedavg:sgd"] == ff.profiles.CPU_LR["fedavg:sgd"]
    # a method not selected at the cpu scale takes FedAvg's selected rate of its optimiser
    unselected = [m for m in ff.methods.names() if m not in ff.profiles.CPU_LR]
    assert all(lrs_m == ff.profiles.CPU_LR["fedavg"]
               for lrs_m in ff.profiles.learning_rates(unselected, profile="cpu").values())
    assert all(math.isfinite(v) and v > 0 for v in ff.profiles.CPU_LR.values())


def test_the_cpu_profile_model_is_the_measured_one():
    # docs/cpu_profile.md: patch 7, width 48, depth 3, 4 heads (60,730 parameters), 0.886 centralised at 10 epochs
    model = ff.models.create(ff.profiles.federated("cpu")["model"], num_classes=10)
    assert sum(p.numel() for p in model.parameters()) == 60_730
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    earlier = ff.models.create("vit_fmnist", num_classes=10)  # the earlier, smaller model stays available
    assert sum(p.numel() for p in earlier.parameters()) == 19_658
