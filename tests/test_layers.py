"""The package's import layers: no cycles, no upward imports (tools/check_imports.py)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("check_imports", ROOT / "tools" / "check_imports.py")
check_imports = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_imports)


def test_the_package_imports_only_downwards():
    assert check_imports.check() == []


def test_the_checker_catches_upward_lazy_and_unlayered_imports(tmp_path):
    pkg = tmp_path / "fedfrozen"
    (pkg / "methods").mkdir(parents=True)
    (pkg / "io.py").write_text("def f():\n    from .loop import run\n")          # lazy upward import
    (pkg / "loop.py").write_text("from . import io\n")                          # fine: downwards
    (pkg / "methods" / "base.py").write_text("from ..config import Config\n")   # methods -> config: upwards
    (pkg / "methods" / "x.py").write_text("from .base import Config\n")         # same package: fine
    (pkg / "newthing.py").write_text("")                                        # on no layer
    problems = check_imports.check(pkg)
    assert any("io.py:2" in p and "loop" in p for p in problems)
    assert any("methods/base.py:1" in p and "config" in p for p in problems)
    assert any("newthing" in p and "no layer" in p for p in problems)
    assert not any("loop.py" in p or "methods/x.py" in p for p in problems)
    assert len(problems) == 3
