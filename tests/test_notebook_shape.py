"""Every notebook ends the same way: one closing section, `## Verdict`, the last of its sections; a `headline:` line
printed (the line `fedfrozen reproduce` shows in its summary); no changelog in its markdown (the history is git's)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def sections(nb) -> list[str]:
    return [line for c in nb.cells if c.cell_type == "markdown" for line in c.source.splitlines()
            if re.match(r"^## ", line)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_a_notebook_closes_with_its_verdict_and_prints_its_headline(path):
    nb = nbformat.read(path, as_version=4)
    heads = sections(nb)
    assert heads.count("## Verdict") == 1 and heads[-1] == "## Verdict", heads[-3:]
    markdown = "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert not re.search(r"^\*\*What changed", markdown, re.M), "a changelog in the markdown"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert any('"headline:' in c.source or "'headline:" in c.source for c in code), "no headline: line printed"
    outputs = [o for c in code for o in c.get("outputs", [])]
    if any(c.get("execution_count") for c in code):  # executed (committed with its outputs): the line is in them
        text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
        assert re.search(r"^headline: ", text, re.M), "the committed outputs show no headline: line"

