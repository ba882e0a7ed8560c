"""Tiny helper to write a notebook from (kind, source) cells: `python tools/nbbuild.py` is not needed
by users; notebooks are the sources. Kept so that new notebooks start with the same conventions."""

import nbformat


def build(path, cells):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    out = []
    for kind, src in cells:
        if kind == "md":
            out.append(nbformat.v4.new_markdown_cell(src.strip("\n")))
        else:
            c = nbformat.v4.new_code_cell(src.strip("\n"))
            if kind == "params":
                c.metadata["tags"] = ["parameters"]
            out.append(c)
    nb.cells = out
    nbformat.write(nb, path)
