"""Fail on an import cycle or an upward import among fedfrozen's modules.

    python tools/check_imports.py        # prints the layers; exit 1 and the offending imports if any

The package is laid out by layer: each layer is a subpackage (or a module at the root), LAYERS lists them bottom
first, and a module may import only (a) the layers below its own, or (b) within its own subpackage, the modules
listed before it (LAYERS gives each subpackage's modules in order; `methods` and `flower` keep their own order,
unchecked). Imports inside functions count too: a lazy import that goes upwards is still a cycle. Package code
names modules by their paths (`from ..inputs import data`), never by the short names `fedfrozen/__init__.py` offers
users (`from fedfrozen import data`): such an import is reported as on no layer. The root `__init__` re-exports, and
is not checked; nothing is exempt.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "fedfrozen"

# (what the layer is, its subpackage or root module, the subpackage's modules in import order: None = unchecked)
LAYERS = [
    ("the version", "_version", None),
    ("ground: files, progress, seeds, a run's History", "base", ["rng", "progress", "io", "history"]),
    ("the data", "inputs", ["shakespeare", "data", "partition", "augment", "shift"]),
    ("models, their Q/K/V split, flat parameters, the update rule", "nets",
     ["layouts", "models", "qkv", "flat", "update"]),
    ("the executable theory", "theory", ["linear_attention", "attention_sim"]),
    ("methods", "methods", None),
    ("a run", "engine", ["config", "checkpoint", "pretrain", "local", "batched", "setup", "messages", "metrics",
                         "clients", "server", "round", "loop"]),
    ("many runs: the cache, its archives, clusters, the dry run", "runs",
     ["cluster", "experiments", "archive", "dryrun", "timing"]),
    ("flower apps", "flower", None),
    ("the studies behind the notebooks", "studies",
     ["profiles", "verdicts", "plots", "measures", "convergence", "tables", "selection", "study", "controls", "paper",
      "regime", "families", "recipes", "roles", "report", "budgets", "verification"]),
    ("command line", "cli", None),
    ("entry point", "__main__", None),
]
LEVEL = {unit: i for i, (_, unit, _) in enumerate(LAYERS)}
ORDER = {unit: {m: j for j, m in enumerate(mods)} for _, unit, mods in LAYERS if mods is not None}


def _parts(path: Path, pkg: Path) -> tuple:
    """A file's module path under fedfrozen/: ("engine", "loop"), ("cli",), ("engine", "__init__")."""
    return path.relative_to(pkg).with_suffix("").parts


def _targets(path: Path, pkg: Path, tree: ast.AST):
    """(line, module path under fedfrozen/) for every import of a fedfrozen module in `tree`."""
    here = _parts(path, pkg)[:-1]  # the file's package, under fedfrozen/
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("fedfrozen."):
                    yield node.lineno, tuple(a.name.split(".")[1:])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module and node.module.startswith("fedfrozen."):
                    yield node.lineno, tuple(node.module.split(".")[1:])
                elif node.module == "fedfrozen":
                    for a in node.names:
                        yield node.lineno, (a.name,)
                continue
            up = node.level - 1  # levels above the file's own package
            if up > len(here):
                continue
            base = here[:len(here) - up] + (tuple(node.module.split(".")) if node.module else ())
            if node.module:
                yield node.lineno, base
            else:  # "from . import a, b": modules of that package
                for a in node.names:
                    yield node.lineno, base + (a.name,)


def check(pkg: Path = PKG) -> list[str]:
    """Every upward, same-layer-out-of-order or unlayered import among the modules under `pkg` (empty: none)."""
    problems = []
    for path in sorted(Path(pkg).rglob("*.py")):
        parts = _parts(path, pkg)
        unit, where = parts[0], path.relative_to(pkg.parent)
        if parts == ("__init__",):
            continue  # the package root re-exports everything
        if unit not in LEVEL:
            problems.append(f"{where}: module {unit!r} is on no layer (add it to LAYERS)")
            continue
        order, own = ORDER.get(unit), parts[1] if len(parts) > 1 else None
        if order is not None and own != "__init__" and own not in order:
            problems.append(f"{where}: module {own!r} is not listed in its layer {unit!r} (add it to LAYERS)")
            continue
        for line, target in _targets(path, pkg, ast.parse(path.read_text(), str(path))):
            if target[0] not in LEVEL:
                problems.append(f"{where}:{line}: imports {'.'.join(target)!r}, which is on no layer")
            elif target[0] != unit:
                if LEVEL[target[0]] >= LEVEL[unit]:
                    problems.append(f"{where}:{line}: {unit} ({LAYERS[LEVEL[unit]][0]}) imports {target[0]} "
                                    f"({LAYERS[LEVEL[target[0]]][0]}): not a lower layer")
            elif order is not None and own != "__init__" and len(target) > 1:
                if target[1] not in order or order[target[1]] >= order[own]:
                    problems.append(f"{where}:{line}: {unit}.{own} imports {unit}.{target[1]}, which is not listed "
                                    f"before it in its layer")
    return problems


if __name__ == "__main__":
    problems = check()
    for i, (name, unit, mods) in enumerate(LAYERS):
        print(f"layer {i} {unit}/ ({name}): {', '.join(mods)}" if mods else f"layer {i} {unit} ({name})")
    print("\n".join(problems) if problems else "imports: every module imports only lower layers (no cycles)")
    sys.exit(1 if problems else 0)
