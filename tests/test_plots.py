import pytest


def test_only_the_committed_profile_writes_figures(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedfrozen import plots

    (tmp_path / "notebooks").mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    fig, _ = plt.subplots()
    assert plots.save_figure(fig, "99_x", "smoke") == ["runs/smoke/figures/99_x.pdf", "runs/smoke/figures/99_x.png"]
    assert plots.save_figure(fig, "99_x", "paper")[0] == "runs/paper/figures/99_x.pdf"  # a GPU run too
    table = __import__("pandas").DataFrame({"a": [1.0]})
    assert plots.save_table(table, "99_x", "paper") == "runs/paper/figures/99_x.csv"
    assert not (tmp_path / "figures").exists()
    assert plots.save_figure(fig, "99_x", "cpu")[1] == "figures/99_x.png"
    assert (tmp_path / "figures" / "99_x.png").exists()
    with pytest.raises(ValueError, match="profile must be one of smoke, cpu, paper"):
        plots.save_figure(fig, "99_x", "gpu")


def test_a_figures_folder_set_in_the_environment_takes_every_profiles_output(tmp_path, monkeypatch):
    import pandas as pd

    from fedfrozen import plots
    from fedfrozen.base.io import FIGURES_ENV

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"  # a temp dir outside the project
    (project / "notebooks").mkdir(parents=True)
    (project / "pyproject.toml").write_text("")
    monkeypatch.chdir(project)
    monkeypatch.setenv(FIGURES_ENV, str(elsewhere))  # `fedfrozen budget`: a timing writes no figures/
    for profile in ("cpu", "smoke"):
        assert plots.save_table(pd.DataFrame({"a": [1.0]}), "99_x", profile) == str(elsewhere / "99_x.csv")
    assert (elsewhere / "99_x.csv").exists()
    assert not (project / "figures").exists() and not (project / "runs").exists()


def test_select_profile_names_a_typo():
    from fedfrozen.studies.profiles import select

    assert select("cpu", smoke=1, cpu=2) == 2
    with pytest.raises(ValueError, match="profile must be one of smoke, cpu, paper"):
        select("gpu", smoke=1)
    with pytest.raises(ValueError, match="no settings given for profile 'paper'"):
        select("paper", smoke=1)


def test_tables_are_written_at_a_fixed_precision(tmp_path, monkeypatch):
    import pandas as pd

    from fedfrozen import plots

    (tmp_path / "notebooks").mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    a = pd.DataFrame({"x": [0.1 + 0.2, 1 / 3]})
    b = pd.DataFrame({"x": [0.3 + 1e-15, 1 / 3 - 1e-16]})   # what another machine's rerun may compute
    plots.save_table(a, "t", "cpu")
    first = (tmp_path / "figures" / "t.csv").read_text()
    plots.save_table(b, "t", "cpu")
    assert (tmp_path / "figures" / "t.csv").read_text() == first == ",x\n0,0.3\n1,0.333333\n"


def test_progress_bar_can_be_silenced(monkeypatch):
    from fedfrozen.base.progress import progress_bar

    items = [1, 2]
    assert progress_bar(items, enabled=False) is items
    monkeypatch.setenv("FEDFROZEN_PROGRESS", "0")
    assert progress_bar(items) is items
    monkeypatch.setenv("FEDFROZEN_PROGRESS", "1")
    bar = progress_bar(items, disable=True)
    assert list(bar) == items and bar is not items


def test_best_by_min_and_max():
    import pandas as pd

    from fedfrozen.studies.plots import best_by

    df = pd.DataFrame({"a": [1, 1, 1, 1, 2, 2], "x": [0, 1, 0, 1, 0, 1], "y": [3.0, 2.0, 5.0, 2.0, 1.0, 4.0]})
    assert best_by(df, "x", "y", "a") == {1: 1, 2: 0}            # mean y at a=1: x0 4.0, x1 2.0
    assert best_by(df, "x", "y", "a", maximize=True) == {1: 0, 2: 1}
