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
