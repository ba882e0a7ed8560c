"""The package's import layers: no cycles, no upward imports (tools/check_imports.py)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("check_imports", ROOT / "tools" / "check_imports.py")
check_imports = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_imports)


def test_the_package_imports_only_downwards():
    assert check_imports.check() == []


def test_the_checker_catches_upward_lazy_out_of_order_and_unlayered_imports(tmp_path):
    pkg = tmp_path / "fedfrozen"
    for sub in ("methods", "base", "engine"):
        (pkg / sub).mkdir(parents=True)
    (pkg / "base" / "io.py").write_text("def f():\n    from ..engine.loop import run\n")  # lazy upward import
    (pkg / "base" / "rng.py").write_text("from . import io\n")                     # io is listed after rng
    (pkg / "base" / "history.py").write_text("from .io import atomic_write\n")     # fine: listed before it
    (pkg / "engine" / "loop.py").write_text("from ..base import io\n")             # fine: downwards
    (pkg / "methods" / "base.py").write_text("from ..engine.config import Config\n")  # methods -> engine: upwards
    (pkg / "methods" / "x.py").write_text("from .base import Config\n")            # own package, unchecked: fine
    (pkg / "studies").mkdir()
    (pkg / "studies" / "roles.py").write_text("from fedfrozen import data\n")      # a user's short name
    (pkg / "newthing.py").write_text("")                                           # on no layer
    problems = check_imports.check(pkg)
    assert any("base/io.py:2" in p and "engine" in p for p in problems)
    assert any("base/rng.py:1" in p and "not listed before it" in p for p in problems)
    assert any("methods/base.py:1" in p and "engine" in p for p in problems)
    assert any("studies/roles.py:1" in p and "'data', which is on no layer" in p for p in problems)
    assert any("newthing" in p and "no layer" in p for p in problems)
    assert not any("loop.py" in p or "methods/x.py" in p or "history.py" in p for p in problems)
    assert len(problems) == 5


def test_every_layered_module_has_its_short_name_and_nothing_else_sits_at_the_root():
    import fedfrozen

    listed = {unit: mods for _, unit, mods in check_imports.LAYERS if mods is not None}
    assert {k: tuple(v) for k, v in listed.items() if k in fedfrozen.MODULES} == fedfrozen.MODULES
    assert all(getattr(fedfrozen, m).__name__ == f"fedfrozen.{unit}.{m}" for unit, ms in listed.items() for m in ms)
    root = {p.stem for p in check_imports.PKG.glob("*.py")}
    assert root == {"__init__", "__main__", "_version", "cli"}


def test_every_layer_folder_is_a_package_that_git_tracks():
    """A folder without a tracked `__init__.py` still imports (a namespace package) but is a different thing: the API
    book cannot collect it and a clean clone differs from the working tree (`runs/` in .gitignore once hid
    fedfrozen/runs/__init__.py). Every layer folder's `__init__.py` exists and no ignore rule matches it."""
    import shutil
    import subprocess

    folders = sorted(p for p in check_imports.PKG.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    assert {p.name for p in folders} >= {unit for _, unit, mods in check_imports.LAYERS if mods is not None}
    assert all((p / "__init__.py").is_file() for p in folders), [p.name for p in folders]
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return  # an installed copy: nothing to ignore
    inits = [str((p / "__init__.py").relative_to(ROOT)) for p in folders]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *inits], cwd=ROOT, capture_output=True, text=True)
    assert ignored.stdout.strip() == "", f"ignored by .gitignore: {ignored.stdout}"
