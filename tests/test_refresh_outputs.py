"""tools/refresh_outputs.py: what it removes from reproduce's executed copies before they are committed."""

import importlib.util
from pathlib import Path

import nbformat

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
                                                            "papermill": {"status": "completed"}})
    work.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    nb.cells = [params, injected, work]
    nb.metadata.update(papermill={"parameters": {"profile": "cpu"}}, widgets={"state": {}})
    return nb


def test_clean_removes_what_papermill_added_and_keeps_the_outputs():
    nb = nbformat.reads(refresh.clean(_executed_copy()), as_version=4)
    assert [c.source for c in nb.cells] == ["profile = 'smoke'", "print(1)"]  # the injected cell is gone
    assert "papermill" not in nb.metadata and "widgets" not in nb.metadata
    assert all("papermill" not in c.metadata and "execution" not in c.metadata for c in nb.cells)
    assert nb.cells[0].metadata["tags"] == ["parameters"]  # the notebook's own parameters cell stays
    assert nb.cells[1].outputs[0].text == "1\n"


def test_leaks_finds_an_absolute_path_of_this_machine():
    assert refresh.leaks(f"saved to {refresh.root}/figures/x.png") and not refresh.leaks("saved to figures/x.png")
