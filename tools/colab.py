"""The notebooks' Colab badge and install cell, from the one repository URL in pyproject.toml.

    python tools/colab.py            # rewrite every notebook's badge and first code cell from the URL
    python tools/colab.py --check    # exit 1, naming the notebooks, if one differs (tests/test_colab.py)

A notebook opened in Colab cannot learn which repository it came from (the kernel sees its cells, not the page's
address), so the repository is one constant: `[project.urls] Repository` in pyproject.toml. A fork changes that
line and runs this script; the badges and install cells then point at the fork (the README's Colab link and
mkdocs.yml's repo_url are checked against the same URL by tests/test_colab.py).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
INSTALL = '''# On Colab, install the package first (a no-op anywhere else, also under papermill and nbval)
import sys

if "google.colab" in sys.modules:
    %pip install -q "fedfrozen{extras} @ git+{repo}"'''
EXTRAS = re.compile(r'"fedfrozen(\[[a-z,]+\])? @ git\+')


def repository(root: Path = ROOT) -> str:
    """The repository URL the notebooks install from: pyproject.toml's [project.urls] Repository."""
    # read by pattern, not tomllib: the project supports Python 3.10, which has no tomllib
    text = (root / "pyproject.toml").read_text()
    section = re.search(r"^\[project\.urls\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    found = section and re.search(r'^Repository\s*=\s*"([^"]+)"', section.group(1), re.M)
    if not found:
        raise ValueError("pyproject.toml has no [project.urls] Repository: the notebooks' Colab cells need it")
    return found.group(1).rstrip("/")


def badge(repo: str, name: str) -> str:
    """The 'Open in Colab' badge of notebooks/<name> on the repository's main branch."""
    path = repo.removeprefix("https://github.com/")
    return f"[![Open In Colab]({BADGE_IMAGE})](https://colab.research.google.com/github/{path}/blob/main/notebooks/{name})"


def install_cell(repo: str, extras: str = "") -> str:
    """The first code cell of every notebook: installs fedfrozen (with `extras`, e.g. "[flower]") on Colab only."""
    return INSTALL.format(extras=extras, repo=repo)


def expected(nb, name: str, repo: str) -> tuple[str, str]:
    """The badge line and install cell notebook `nb` should carry (its own extras kept)."""
    code = next(c for c in nb.cells if c.cell_type == "code")
    found = EXTRAS.search(code.source)
    return badge(repo, name), install_cell(repo, (found.group(1) or "") if found else "")


def differs(path: Path, repo: str) -> list[str]:
    """What in notebook `path` does not match the repository URL (empty when it all does)."""
    nb = nbformat.read(path, as_version=4)
    want_badge, want_cell = expected(nb, path.name, repo)
    wrong = []
    if nb.cells[0].cell_type != "markdown" or nb.cells[0].source.splitlines()[:1] != [want_badge]:
        wrong.append("badge (the first line of the first cell)")
    if next(c for c in nb.cells if c.cell_type == "code").source != want_cell:
        wrong.append("install cell (the first code cell)")
    return wrong


def rewrite(path: Path, repo: str) -> bool:
    """Set notebook `path`'s badge and install cell from `repo`; True if the file changed."""
    nb = nbformat.read(path, as_version=4)
    want_badge, want_cell = expected(nb, path.name, repo)
    first = nb.cells[0]
    lines = first.source.splitlines()
    if first.cell_type == "markdown" and lines and "colab-badge" in lines[0]:
        lines[0] = want_badge
    else:
        nb.cells.insert(0, nbformat.v4.new_markdown_cell(want_badge))
        lines = None
    if lines is not None:
        first.source = "\n".join(lines)
    next(c for c in nb.cells if c.cell_type == "code").source = want_cell
    text = nbformat.writes(nb)
    if text.rstrip("\n") == path.read_text().rstrip("\n"):
        return False
    path.write_text(text)
    return True


def main(argv: list[str]) -> int:
    repo = repository()
    books = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if "--check" in argv:
        bad = {p.name: differs(p, repo) for p in books}
        bad = {k: v for k, v in bad.items() if v}
        for name, what in bad.items():
            print(f"{name}: {', '.join(what)} does not use {repo}")
        return 1 if bad else 0
    for p in books:
        if rewrite(p, repo):
            print(f"rewrote {p.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
