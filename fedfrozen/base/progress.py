"""Progress bars for long work: tqdm.auto, quiet when asked.

`progress_bar(iterable, enabled=True, **kw)` returns a tqdm bar (a notebook widget where ipywidgets
is installed, text otherwise, without tqdm's warning about it), or the bare iterable when
disabled or when the environment sets FEDFROZEN_PROGRESS=0 (as tools/refresh_outputs.py does, so
committed notebooks carry no progress-bar residue).
"""

from __future__ import annotations

import os
import warnings


def progress_bar(iterable, enabled: bool = True, **kw):
    if not enabled or os.environ.get("FEDFROZEN_PROGRESS", "1") == "0":
        return iterable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tqdm.auto warns when ipywidgets is missing, then falls back to text
        from tqdm.auto import tqdm
    return tqdm(iterable, **kw)
