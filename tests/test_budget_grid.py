"""tools/budget_grid.py: notebook 15's grid trained a seed at a time, its new runs packed as it goes."""

import importlib.util
from pathlib import Path

import pytest

import fedfrozen as ff
from fedfrozen.runs.archive import held

TOOL = Path(__file__).resolve().parents[1] / "tools" / "budget_grid.py"
spec = importlib.util.spec_from_file_location("budget_grid", TOOL)
grid = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grid)

TINY = dict(dataset="digits", model="vit_digits", model_kwargs=dict(embed_dim=16, depth=1, num_heads=2),
            n_clients=4, clients_per_round=2, rounds=2, local_steps=1, batch_size=16, partition="iid",
            eval_every=1, device="cpu", engine="sequential")



def test_bad_arguments_name_the_option(capsys):
    with pytest.raises(SystemExit):
        grid.parse(["sgd", "--workers", "0"])
    assert "--workers must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        grid.parse(["sgd", "--pack", "runs.zip"])
    assert "--pack must name a .tar.xz file" in capsys.readouterr().err


def test_only_runs_no_archive_holds_are_packed(tmp_path):
    root, archives = tmp_path / "results", tmp_path / "archives"
    archives.mkdir()
    first = [ff.Config(seed=s, **TINY) for s in (0, 1)]
    ff.run_many(first, root=root, experiment="digits", workers=1, progress=False)
    a = archives / "a.tar.xz"
    assert "2 runs" in grid.pack_new(a, ["digits"], root, archives)
    assert len(held(a)) == 2
    assert "nothing new" in grid.pack_new(archives / "b.tar.xz", ["digits"], root, archives)
    assert not (archives / "b.tar.xz").exists()
    ff.run_many([ff.Config(seed=2, **TINY)], root=root, experiment="digits", workers=1, progress=False)
    assert "1 runs" in grid.pack_new(archives / "b.tar.xz", ["digits"], root, archives)
    assert len(held(archives / "b.tar.xz")) == 1
    assert "3 runs" in grid.pack_new(a, ["digits"], root, archives / "none")  # its own file is not an "other"


def test_a_seed_trains_its_first_budget_then_its_longer_ones(capsys, request):
    import torch

    threads = torch.get_num_threads()
    request.addfinalizer(lambda: torch.set_num_threads(threads))  # main() trains at one thread (ff.io.use_threads)
    assert grid.main(["adamw", "--profile", "smoke", "--seeds", "1", "--workers", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("rates {}") and len(out) == 2
    line = out[1]
    assert line.startswith("adamw seed 1: ")
    rounds = [int(part.split(":")[0].split()[1]) for part in line.split(": ", 1)[1].split("; ")[0].split(", ")]
    assert len(rounds) == 5 and rounds[:2] == [min(rounds)] * 2  # the pair at 1x first, then 2x (FedAvg) and 4x
    assert sorted(set(rounds)) == [min(rounds), 2 * min(rounds), 4 * min(rounds)]
