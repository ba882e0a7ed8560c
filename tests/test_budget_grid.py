"""tools/budget_grid.py: notebook 15's grid trained a seed at a time, its new runs packed as it goes."""

import importlib.util
from pathlib import Path

import pytest

import fedfrozen as ff
from fedfrozen.runs.archive import held
from fedfrozen.runs.experiments import config_key

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


def test_a_screen_needs_a_readme_row_and_a_cell_or_screen_is_named(capsys):
    with pytest.raises(SystemExit):
        grid.parse([])
    assert "name a cell to train or --screen ROW" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        grid.parse(["--screen", "C9 no such row"])
    err = capsys.readouterr().err
    assert "--screen: no README row starts with 'C9 no such row'" in err and "C1 base, IID" in err
    assert grid.parse(["--screen", "C1 five local epochs"]).screen == ["C1 five local epochs"]


def test_the_screen_trains_the_named_settings_only_and_packs_them(tmp_path, monkeypatch, request, capsys):
    import torch

    from fedfrozen.studies import budgets, convergence

    monkeypatch.setattr(convergence, "THRESHOLD", -1.0)  # every setting gets its doubling runs
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine signature names the thread count the notebooks train at
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    tiny = {**TINY, "rounds": 10, "warmup_rounds": 2}
    named = [ff.Config(seed=s, **tiny) for s in (0, 1)]
    other = [ff.Config(seed=5, **tiny)]
    monkeypatch.setattr(budgets, "readme_settings", lambda profile="cpu": [
        dict(rows=["C1 x: accuracy"], cell=None, configs=named), dict(rows=["C1 y: accuracy"], cell=None,
                                                                         configs=other)])
    root, archives = tmp_path / "results", tmp_path / "archives"
    archives.mkdir()
    grid.screen(["C1 x"], 1, str(archives / "s.tar.xz"), root, archives)
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("C1 x: accuracy: last tenth") and "doubling (FedAvg at 2x)" in out[0]
    assert "(2)" in out[0] and out[1] == f"{archives / 's.tar.xz'}: 4 runs, " + out[1].split(", ")[1]
    packed = held(archives / "s.tar.xz")
    assert {e for e, _ in packed} == {"digits_screen"} and len(packed) == 4  # 1x and 2x of seeds 0 and 1
    assert not any((root / "digits_screen" / config_key(c)).exists() for c in other)


def test_an_unknown_cell_is_named(capsys):
    with pytest.raises(SystemExit):
        grid.parse(["sgdd"])
    assert "cells: 'sgdd' is no cell of notebook 15" in capsys.readouterr().err


def test_the_clock_starts_no_unit_that_would_end_past_the_sitting():
    now = [0.0]
    clock = grid.Clock(1.0, now=lambda: now[0])
    assert clock.fits("sgd")  # a first unit always starts
    now[0] = 1000.0
    clock.done("sgd", 1000.0)
    assert clock.fits("sgd") and clock.fits("p4_w48")  # 2000 s of 3600
    now[0] = 2700.0
    assert not clock.fits("sgd")  # 2700 + 1000 > 3600
    clock.done("p4_w48", 500.0)
    assert clock.fits("p4_w48") and not clock.fits("text_scratch")  # its own longest; another's: the longest of all
    assert grid.Clock(None, now=lambda: 1e9).fits("sgd")


def test_with_no_time_left_the_grid_stops_between_seeds(capsys, request):
    import torch

    threads = torch.get_num_threads()
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    assert grid.main(["sgd", "--profile", "smoke", "--seeds", "0", "1", "--workers", "1", "--hours", "1e-9"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[1].startswith("sgd seed 0: ") and out[2] == ("stopping before sgd seed 1: the sitting's time would end "
                                                           "inside it") and len(out) == 3


def test_bad_hours_are_named(capsys):
    with pytest.raises(SystemExit):
        grid.parse(["sgd", "--hours", "0"])
    assert "--hours must be positive" in capsys.readouterr().err
