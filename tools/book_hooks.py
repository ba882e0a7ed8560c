"""MkDocs hook of the book (mkdocs.yml): the front page is the repository's README.md.

The README's links are written for the repository (docs/x.md, notebooks/..., figures/...); on the site the
docs pages sit at the root and notebooks/ and figures/ are links into docs/, so `docs/` is dropped from a link, and
files that are not pages (LICENSE, CITATION.cff, pyproject.toml) link to the repository instead.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\((?!https?://|#)([^)\s]+)\)")


def front_page(readme: str, repo: str) -> str:
    """README.md with its repository-relative links rewritten for the site."""

    def fix(m: re.Match) -> str:
        target = m.group(1)
        if target.startswith("docs/"):
            return f"]({target[len('docs/'):]})"
        if target.split("#")[0].endswith((".md", ".ipynb", ".png", ".pdf", ".svg", ".csv")):
            return m.group(0)
        return f"]({repo}/blob/main/{target})"

    return LINK.sub(fix, readme)


@event_priority(100)  # before mkdocs-jupyter and search see the files
def on_files(files, config):
    files.append(File.generated(config, "index.md",
                                content=front_page((ROOT / "README.md").read_text(), config["repo_url"].rstrip("/"))))
    return files
