"""Give the committed notebooks the cpu profile's outputs.

    python tools/refresh_outputs.py 02 03      # execute in place (or no argument: all notebooks)
    python tools/refresh_outputs.py --adopt 03 04   # take `fedfrozen reproduce --profile cpu`'s copies
    python tools/refresh_outputs.py 03 --section 3  # execute the cells before section 1 and section 3's only

Executing in place uses nbclient directly (no papermill parameter cell is injected). `--section N` executes the
notebook's opening cells (those before its first "## " heading: parameters and set-up) and the cells of its section
"## N · ..." (to the next "## " heading), and gives only those cells their new outputs: for a section added to a
notebook whose other sections' runs are not in this machine's cache (its markdown says so). `--adopt` executes
nothing: it takes the copies that `FEDFROZEN_PROGRESS=0 fedfrozen reproduce --profile cpu` wrote to
runs/cpu/ (so the committed outputs and the measured reproduce time come from the same run) and removes
what papermill added (its injected parameter cell, its metadata). Both drop widget state and execution
timestamps, and refuse to write a notebook whose outputs hold an absolute path of this machine.
"""

import argparse
import os
import time
from pathlib import Path

import nbclient
import nbformat

from fedfrozen.base.io import KERNEL_ARGS

root = Path(__file__).resolve().parents[1]


def clean(nb) -> str:
    """The notebook's text without papermill's additions, widget state or execution timestamps."""
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    nb.metadata.pop("widgets", None)
    nb.metadata.pop("papermill", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("papermill", None)
        if cell.metadata.get("tags") == []:  # papermill gives every cell an empty tag list
            cell.metadata.pop("tags")
    return nbformat.writes(nb) + "\n"  # Jupyter's own files end with a newline


def section_cells(nb, number: str) -> list[int]:
    """The indices of the notebook's opening cells (before its first "## " heading) and of section `number`'s."""
    heads = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith("## ")]
    starts = [i for i in heads if nb.cells[i].source.startswith(f"## {number} ·")]
    if not heads or len(starts) != 1:
        raise SystemExit(f"--section {number}: the notebook has no one heading '## {number} · ...'")
    end = next((i for i in heads if i > starts[0]), len(nb.cells))
    return [*range(heads[0]), *range(starts[0], end)]


def execute_section(path: Path, number: str):
    """The notebook with the outputs of its opening cells and section `number` executed now, the others' kept."""
    nb = nbformat.read(path, as_version=4)
    keep = section_cells(nb, number)
    part = nbformat.v4.new_notebook(metadata=nb.metadata)
    part.cells = [nb.cells[i] for i in keep]
    nbclient.NotebookClient(part, kernel_name="python3", timeout=4 * 3600, extra_arguments=KERNEL_ARGS,
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    for i, cell in zip(keep, part.cells):
        nb.cells[i] = cell
    return nb


def leaks(text: str) -> list[str]:
    return [line.strip()[:300] for line in text.splitlines()
            if any(bad in line for bad in (str(root), os.path.expanduser("~") + "/"))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("numbers", nargs="*", help="two-digit notebook numbers (default: all)")
    ap.add_argument("--adopt", action="store_true", help="take runs/cpu/'s executed copies instead of executing")
    ap.add_argument("--section", help="execute the opening cells and this section only (e.g. 3); one notebook")
    args = ap.parse_args()
    if args.section and (args.adopt or len(args.numbers) != 1):
        ap.error("--section executes one notebook's section: give one notebook number, without --adopt")
    os.environ["FEDFROZEN_PROFILE"] = "cpu"
    os.environ["FEDFROZEN_PROGRESS"] = "0"  # no progress-bar residue in committed outputs
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        if args.numbers and path.name[:2] not in args.numbers:
            continue
        start = time.perf_counter()
        if args.adopt:
            source = root / "runs" / "cpu" / path.name
            if not source.is_file():
                print(f"NOT adopted: {path.name}: no {source.relative_to(root)} "
                      f"(run `fedfrozen reproduce --profile cpu` first)")
                continue
            nb = nbformat.read(source, as_version=4)
        elif args.section:
            nb = execute_section(path, args.section)
        else:
            nb = nbformat.read(path, as_version=4)
            nbclient.NotebookClient(nb, kernel_name="python3", timeout=4 * 3600, extra_arguments=KERNEL_ARGS,
                                    resources={"metadata": {"path": str(path.parent)}}).execute()
        text = clean(nb)
        found = leaks(text)
        if found:
            print(f"NOT written: {path.name}: outputs contain absolute paths, e.g. {found[0]}", flush=True)
            continue
        path.write_text(text)
        done = "adopted" if args.adopt else f"refreshed section {args.section} of" if args.section else "refreshed"
        print(f"{done} {path.name} in {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
