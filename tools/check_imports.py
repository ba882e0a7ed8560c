"""Fail on an import cycle or an upward import among fedfrozen's modules.

    python tools/check_imports.py        # prints the layers; exit 1 and the offending imports if any

Every module of the package sits on a layer (LAYERS, bottom first); a module may import only
modules on lower layers, a module of its own package (fedfrozen.methods.*), or nothing of the
package. Imports inside functions count too: a lazy import that goes upwards is still a cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "fedfrozen"

LAYERS = [
    ("ground", ["progress", "io", "rng"]),
    ("attention layouts", ["layouts"]),
    ("raw texts", ["shakespeare"]),
    ("data and models", ["data", "augment", "partition", "shift", "models", "qkv", "history", "linear_attention",
                         "attention_sim"]),
    ("buffers", ["flat"]),
    ("the local update rule", ["update"]),
    ("methods", ["methods"]),
    ("config", ["config"]),
    ("checkpoints", ["checkpoint"]),
    ("pretraining", ["pretrain"]),
    ("local training", ["local"]),
    ("batched engine", ["batched"]),
    ("a run's start", ["setup"]),
    ("the round", ["round"]),
    ("loop", ["loop"]),
    ("cluster", ["cluster"]),
    ("experiments", ["experiments", "profiles"]),
    ("flower apps", ["flower"]),
    ("the paired rule", ["verdicts"]),
    ("analysis", ["plots", "tables", "selection", "dryrun"]),
    ("regime map", ["regime", "controls"]),
    ("past the paper", ["beyond"]),
    ("beyond one recipe", ["recipes"]),
    ("a second modality", ["roles"]),
    ("verification", ["verification"]),
    ("command line", ["cli"]),
    ("entry point", ["__main__"]),
]
LEVEL = {m: i for i, (_, mods) in enumerate(LAYERS) for m in mods}


def _unit(path: Path, pkg: Path) -> str:
    """The layered unit of a file: its top-level module or subpackage under fedfrozen/."""
    return path.relative_to(pkg).with_suffix("").parts[0]


def _targets(path: Path, pkg: Path, tree: ast.AST):
    """(line, unit) for every import of a fedfrozen module in `tree`."""
    depth = len(path.relative_to(pkg).parts) - 1  # 0 for fedfrozen/x.py, 1 for fedfrozen/methods/x.py
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("fedfrozen."):
                    yield node.lineno, a.name.split(".")[1]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module and node.module.startswith("fedfrozen."):
                    yield node.lineno, node.module.split(".")[1]
                elif node.module == "fedfrozen":
                    for a in node.names:
                        yield node.lineno, a.name
                continue
            up = node.level - 1  # levels above the file's own package
            if up > depth:
                continue
            base = list(path.relative_to(pkg).parts[:depth - up])
            parts = base + (node.module.split(".") if node.module else [])
            if parts:
                yield node.lineno, parts[0]
            else:  # "from . import a, b" at the package root
                for a in node.names:
                    yield node.lineno, a.name


def check(pkg: Path = PKG) -> list[str]:
    """Every upward, same-layer or unlayered import among the modules under `pkg` (empty: none)."""
    problems = []
    for path in sorted(Path(pkg).rglob("*.py")):
        unit = _unit(path, pkg)
        if unit == "__init__":
            continue  # the package root re-exports everything
        if unit not in LEVEL:
            problems.append(f"{path.relative_to(pkg.parent)}: module {unit!r} is on no layer (add it to LAYERS)")
            continue
        tree = ast.parse(path.read_text(), str(path))
        for line, target in _targets(path, pkg, tree):
            if target == unit or target == "__version__":
                continue
            if target not in LEVEL:
                problems.append(f"{path.relative_to(pkg.parent)}:{line}: imports {target!r}, which is on no layer")
            elif LEVEL[target] >= LEVEL[unit]:
                problems.append(f"{path.relative_to(pkg.parent)}:{line}: {unit} ({LAYERS[LEVEL[unit]][0]}) imports "
                                f"{target} ({LAYERS[LEVEL[target]][0]}): not a lower layer")
    return problems


if __name__ == "__main__":
    problems = check()
    for i, (name, mods) in enumerate(LAYERS):
        print(f"layer {i} {name}: {', '.join(mods)}")
    print("\n".join(problems) if problems else "imports: every module imports only lower layers (no cycles)")
    sys.exit(1 if problems else 0)
