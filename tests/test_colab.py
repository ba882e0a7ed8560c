"""Every notebook's Colab badge and install cell use the one repository URL (pyproject.toml; tools/colab.py)."""

import importlib.util
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("colab", ROOT / "tools" / "colab.py")
colab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(colab)
BOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", BOOKS, ids=[p.name[:2] for p in BOOKS])
def test_every_notebook_installs_from_the_one_repository_url(path):
    assert colab.differs(path, colab.repository()) == []


def test_the_install_cell_runs_only_on_colab_and_names_the_repository():
    cell = colab.install_cell("https://github.com/someone/fork", "[flower]")
    assert 'if "google.colab" in sys.modules:' in cell
    assert '%pip install -q "fedfrozen[flower] @ git+https://github.com/someone/fork"' in cell


def test_a_fork_rewrites_every_badge_and_install_cell_from_its_url(tmp_path):
    (tmp_path / "notebooks").mkdir()
    fork = "https://github.com/someone/fork"
    (tmp_path / "pyproject.toml").write_text(f'[project]\nname = "x"\n[project.urls]\nRepository = "{fork}/"\n')
    src = tmp_path / "notebooks" / "08_x.ipynb"
    nbformat.write(nbformat.read(ROOT / "notebooks" / "08_flower_deployment.ipynb", as_version=4), src)
    repo = colab.repository(tmp_path)
    assert repo == fork  # the trailing slash dropped
    assert colab.differs(src, repo) == ["badge (the first line of the first cell)",
                                        "install cell (the first code cell)"]
    assert colab.rewrite(src, repo) and colab.differs(src, repo) == []
    nb = nbformat.read(src, as_version=4)
    assert "github/someone/fork/blob/main/notebooks/08_x.ipynb" in nb.cells[0].source
    assert '"fedfrozen[flower] @ git+https://github.com/someone/fork"' in nb.cells[1].source  # its extras kept
    assert not colab.rewrite(src, repo)  # a second rewrite changes nothing


def test_a_pyproject_without_the_url_is_a_clear_error(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    with pytest.raises(ValueError, match=r"\[project.urls\] Repository"):
        colab.repository(tmp_path)


def test_the_readme_and_the_book_point_at_the_same_repository():
    repo = colab.repository()
    path = repo.removeprefix("https://github.com/")
    readme = (ROOT / "README.md").read_text()
    assert f"https://colab.research.google.com/github/{path}/blob/main/notebooks/00_quickstart.ipynb" in readme
    assert f"repo_url: {repo}\n" in (ROOT / "mkdocs.yml").read_text()
