"""Feature shift (fedfrozen.inputs.shift, Config.shift / shift_groups): clients in groups that see their images
transformed."""

import pytest
import torch
from conftest import tiny_config

import fedfrozen as ff
from fedfrozen import shift


def _setups(**kw):
    cfg = tiny_config(n_clients=8, partition="iid", **kw)
    return ff.loop.prepare(cfg.replace(shift="none", shift_groups=4)), ff.loop.prepare(cfg)


def test_a_clients_images_are_its_groups_transformation_of_the_same_samples_and_labels_stay_iid():
    plain, rotated = _setups(shift="rotation", shift_groups=4)
    assert all(torch.equal(a, b) for a, b in zip(plain.client_train, rotated.client_train))  # the same IID clients
    assert torch.equal(plain.y, rotated.y)
    for cid in range(8):
        g = shift.group_of(cid, 4)
        for idx in (rotated.client_train[cid], rotated.client_eval[cid]):
            want = torch.rot90(plain.x[idx], g, dims=(2, 3))  # a quarter turn per group: exact
            assert torch.equal(rotated.x[idx], want), (cid, g)
    assert not torch.equal(plain.x[rotated.client_train[1]], rotated.x[rotated.client_train[1]])
    # the validation images dealt to the groups in turn
    val = rotated.val_idx
    assert torch.equal(rotated.x[val[1::4]], torch.rot90(plain.x[val[1::4]], 1, dims=(2, 3)))
    assert torch.equal(rotated.x[val[0::4]], plain.x[val[0::4]])


def test_the_groups_test_sets_differ_and_the_loaded_data_is_not_touched():
    plain, shifted = _setups(shift="patch_permutation", shift_groups=3)
    tests = shifted.test_groups
    assert len(tests) == 3 and torch.equal(tests[0], plain.test_x)
    assert not torch.equal(tests[1], tests[0]) and not torch.equal(tests[2], tests[1])
    fresh = ff.loop.prepare(tiny_config(n_clients=8, partition="iid"))  # another run of this process
    assert torch.equal(fresh.x, plain.x) and plain.test_groups == []


def test_a_patch_permutation_moves_whole_patches_in_the_groups_fixed_order():
    x = torch.arange(2 * 1 * 8 * 8, dtype=torch.float32).reshape(2, 1, 8, 8)
    y = shift.transform(x, "patch_permutation", 1, 3, patch=4, seed=0)
    order = shift.patch_order(1, 4, seed=0)
    tiles = lambda t: t.reshape(2, 1, 2, 4, 2, 4).permute(0, 2, 4, 1, 3, 5).reshape(2, 4, 1, 4, 4)  # noqa: E731
    assert torch.equal(tiles(y), tiles(x)[:, order])
    assert torch.equal(shift.patch_order(1, 4, seed=0), order)  # fixed: the same order every time
    assert not torch.equal(shift.patch_order(1, 16, seed=0), torch.arange(16))
    assert torch.equal(shift.transform(x, "patch_permutation", 0, 3, patch=4), x)  # group 0 as it is
    assert sorted(shift.patch_order(2, 16, seed=5).tolist()) == list(range(16))
    with pytest.raises(ValueError, match="patch size that divides"):
        shift.transform(x, "patch_permutation", 1, 3, patch=3)


def test_each_groups_accuracy_is_a_column_and_test_acc_their_mean():
    hist = ff.run(tiny_config(n_clients=6, rounds=2, shift="rotation", shift_groups=3), progress=False)
    row = hist.rows[-1]
    groups = [row[f"test_acc_g{g}"] for g in range(3)]
    assert row["test_acc"] == pytest.approx(sum(groups) / 3) and row["test_acc_worst"] == min(groups)
    late = [sum(hist.window(f"test_acc_g{g}")) / len(hist.window(f"test_acc_g{g}")) for g in range(3)]
    assert hist.late_accuracy == pytest.approx(sum(late) / 3)  # late_acc: the late mean over the groups


@pytest.mark.parametrize("kw, match", [
    (dict(shift="blur"), "shift must be one of"),
    (dict(shift="rotation", shift_groups=1), "shift_groups"),
    (dict(shift="rotation", shift_groups=9, n_clients=8), r"shift_groups \(9\) must not exceed n_clients"),
    (dict(shift_groups=3), "shift_groups.*shift is 'none'"),
])
def test_a_bad_shift_is_refused_naming_the_setting(kw, match):
    with pytest.raises(ValueError, match=match):
        tiny_config(**kw)


def test_a_patch_permutation_needs_a_model_with_patches():
    with pytest.raises(ValueError, match="patch_embed.patch_size"):
        shift.patch_size_of(torch.nn.Linear(2, 2))
