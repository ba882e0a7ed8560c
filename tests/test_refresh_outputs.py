"""tools/refresh_outputs.py: what it removes from reproduce's executed copies before they are committed."""

import importlib.util
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("refresh_outputs", ROOT / "tools" / "refresh_outputs.py")
refresh = importlib.util.module_from_spec(spec)
spec.loader.exec_module(refresh)


def _executed_copy():
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("profile = 'smoke'", metadata={"tags": ["parameters"]})
    injected = nbformat.v4.new_code_cell("profile = 'cpu'", metadata={"tags": ["injected-parameters"],
                                                                     "papermill": {"duration": 0.1}})
    work = nbformat.v4.new_code_cell("print(1)", metadata={"execution": {"iopub.status.busy": "2026"},
                                                            "papermill": {"status": "completed"}, "tags": []})
    work.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    nb.cells = [params, injected, work]
    nb.metadata.update(papermill={"parameters": {"profile": "cpu"}}, widgets={"state": {}})
    return nb


def test_clean_removes_what_papermill_added_and_keeps_the_outputs():
    text = refresh.clean(_executed_copy())
    assert text.endswith("}\n")  # as Jupyter writes it
    nb = nbformat.reads(text, as_version=4)
    assert [c.source for c in nb.cells] == ["profile = 'smoke'", "print(1)"]  # the injected cell is gone
    assert "papermill" not in nb.metadata and "widgets" not in nb.metadata
    assert all("papermill" not in c.metadata and "execution" not in c.metadata for c in nb.cells)
    assert nb.cells[0].metadata["tags"] == ["parameters"]  # the notebook's own parameters cell stays
    assert "tags" not in nb.cells[1].metadata  # papermill's empty tag list is dropped
    assert nb.cells[1].outputs[0].text == "1\n"


def test_leaks_finds_an_absolute_path_of_this_machine():
    assert refresh.leaks(f"saved to {refresh.root}/figures/x.png") and not refresh.leaks("saved to figures/x.png")


def test_every_committed_notebook_is_as_refresh_outputs_writes_it():
    """No committed notebook carries papermill's additions, widget state or timestamps (e.g. one copied straight
    from runs/cpu/ instead of through `--adopt`)."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        text = path.read_text()
        assert refresh.clean(nbformat.reads(text, as_version=4)) == text, f"{path.name}: run tools/refresh_outputs.py"


def test_a_section_is_executed_with_the_opening_cells_and_the_others_keep_their_outputs(tmp_path):
    nb = nbformat.v4.new_notebook()
    md = nbformat.v4.new_markdown_cell
    old = nbformat.v4.new_output("stream", name="stdout", text="old\n")
    cells = [nbformat.v4.new_code_cell("x = 2"), md("## 1 · first"), nbformat.v4.new_code_cell("print('one', x)"),
             md("## 2 · second"), nbformat.v4.new_code_cell("print('two', x)"), md("## Reading"),
             nbformat.v4.new_code_cell("print('reading')")]
    for c in cells:
        if c.cell_type == "code":
            c.outputs = [old]
    nb.cells = cells
    path = tmp_path / "99_x.ipynb"
    nbformat.write(nb, path)
    assert refresh.section_cells(nb, "2") == [0, 3, 4]
    done = refresh.execute_section(path, "2")
    texts = ["".join(o.get("text", "") for o in c.outputs) if c.cell_type == "code" else None for c in done.cells]
    assert texts == ["", None, "old\n", None, "two 2\n", None, "old\n"]  # section 2 after the opening; others kept
    with pytest.raises(SystemExit, match="no one heading"):
        refresh.section_cells(nb, "7")
