"""Augmentation: reproducible, shape- and range-preserving, and off means the old behaviour."""

import pytest
import torch
from conftest import tiny_config

import fedfrozen as ff
from fedfrozen import augment


def _batch(seed=0, shape=(6, 3, 8, 8)):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def test_the_same_seed_gives_the_same_augmented_batch():
    x = _batch()
    a = augment.apply(x, augment.draw(6, torch.Generator().manual_seed(1), "cpu", flip=True))
    b = augment.apply(x, augment.draw(6, torch.Generator().manual_seed(1), "cpu", flip=True))
    c = augment.apply(x, augment.draw(6, torch.Generator().manual_seed(2), "cpu", flip=True))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_shapes_and_values_are_preserved():
    x = _batch()
    out = augment.apply(x, augment.draw(6, torch.Generator().manual_seed(3), "cpu", flip=True))
    assert out.shape == x.shape and out.dtype == x.dtype
    for i in range(len(x)):  # reflect padding only repeats pixels of the same image and channel
        for ch in range(3):
            assert set(out[i, ch].flatten().tolist()) <= set(x[i, ch].flatten().tolist())


def test_a_constant_image_stays_constant():
    x = torch.full((4, 3, 8, 8), 0.7)
    out = augment.apply(x, augment.draw(4, torch.Generator().manual_seed(0), "cpu", flip=True))
    assert torch.equal(out, x)


def test_centre_offset_is_the_identity_and_the_flip_mirrors():
    x = _batch(shape=(2, 3, 8, 8))
    centre = torch.tensor([[4, 4, 0], [4, 4, 1]])
    out = augment.apply(x, centre)
    assert torch.equal(out[0], x[0]) and torch.equal(out[1], x[1].flip(-1))
    shifted = augment.apply(x, torch.tensor([[4, 5, 0], [4, 5, 0]]))  # one pixel to the right
    assert torch.equal(shifted[:, :, :, :-1], x[:, :, :, 1:])


def test_no_flip_for_svhn_and_defaults_by_dataset():
    p = augment.draw(1000, torch.Generator().manual_seed(0), "cpu", flip=False)
    assert (p[:, 2] == 0).all() and p[:, :2].min() == 0 and p[:, :2].max() == 8
    assert augment.enabled(tiny_config()) is False                       # digits: off
    assert augment.enabled(tiny_config(augment=True)) is True
    cfg = ff.Config(dataset="cifar10", model="vit_cifar")
    assert augment.enabled(cfg) and not augment.enabled(cfg.replace(augment=False))
    assert augment.AUGMENTED["svhn"] is False


def test_augmentation_off_is_identical_to_no_augmentation_and_on_changes_training():
    off = ff.run(tiny_config(augment=False), progress=False)
    assert off.same_as(ff.run(tiny_config(), progress=False))  # digits default: off
    on = ff.run(tiny_config(augment=True), progress=False)
    assert not on.same_as(off)
    assert on.same_as(ff.run(tiny_config(augment=True), progress=False))  # reproducible


def test_bad_augment_value_is_named():
    with pytest.raises(ValueError, match="augment"):
        tiny_config(augment="yes")
