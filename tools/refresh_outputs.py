"""Re-execute notebooks in place under the cpu profile, so the committed copies carry its outputs.

    python tools/refresh_outputs.py 02 03      # or no argument: all notebooks

Uses nbclient directly (no papermill parameter cell is injected), drops widget state, and
fails if an output holds an absolute path of this machine.
"""

import os
import sys
import time
from pathlib import Path

import nbclient
import nbformat

from fedfrozen.io import KERNEL_ARGS

root = Path(__file__).resolve().parents[1]
wanted = set(sys.argv[1:])
os.environ["FEDFROZEN_PROFILE"] = "cpu"
os.environ["FEDFROZEN_PROGRESS"] = "0"  # no progress-bar residue in committed outputs
for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
    if wanted and path.name[:2] not in wanted:
        continue
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=4 * 3600, extra_arguments=KERNEL_ARGS,
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    text = nbformat.writes(nb)
    leaks = [line.strip()[:300] for line in text.splitlines()
             if any(bad in line for bad in (str(root), os.path.expanduser("~") + "/"))]
    if leaks:
        print(f"NOT written: {path.name}: outputs contain absolute paths, e.g. {leaks[0]}", flush=True)
        continue
    path.write_text(text)
    print(f"refreshed {path.name} in {time.perf_counter() - start:.0f} s", flush=True)
