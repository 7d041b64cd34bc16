"""The package's shape, checked from its source: no import circles, and no product module that
needs a test fixture (issue 37: boundaries that show the architecture)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "ggspec"


def _import_cycles():
    spec = importlib.util.spec_from_file_location("import_cycles", REPO / "scripts" / "import_cycles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _package(root: Path, modules: dict[str, str]) -> Path:
    """A package `pkg` under `root` holding these modules (name -> source)."""
    pkg = root / "pkg"
    pkg.mkdir()
    for name, source in {"__init__": "", **modules}.items():
        (pkg / f"{name}.py").write_text(source)
    return pkg


def test_the_script_finds_a_cycle(tmp_path):
    ic = _import_cycles()
    pkg = _package(tmp_path, {
        "a": "from pkg import b\n",
        "b": "def f():\n    from pkg.c import g\n",  # a lazy import counts too
        "c": "import pkg.a\n",
        "d": "from . import a\n",  # depends on the circle, is not in it
    })
    assert ic.cycles(ic.import_graph(pkg)) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert ic.main(["import_cycles.py", str(pkg)]) == 1


def test_the_script_sees_import_module(tmp_path):
    """A literal import_module is an edge like an import; a computed one is reported."""
    ic = _import_cycles()
    pkg = _package(tmp_path, {
        "a": "from importlib import import_module\nimport_module('pkg.b')\n",
        "b": "import importlib\ndef f():\n    importlib.import_module('pkg.a')\n",
        "c": "from importlib import import_module\nfor m in ('a',):\n    import_module(f'pkg.{m}')\n",
    })
    assert ic.cycles(ic.import_graph(pkg)) == [["pkg.a", "pkg.b"]]
    assert ic.hidden_imports(pkg) == ["pkg/c.py:3"]


def test_no_import_cycles():
    ic = _import_cycles()
    assert ic.cycles(ic.import_graph(PACKAGE)) == []
    assert ic.hidden_imports(PACKAGE) == []


def _imports_of(folder: Path, tops: set[str]) -> list[str]:
    """`file:line` of each absolute import, in the .py files below `folder`, of a module whose first
    name is one of `tops` (lazy imports count: they are still a dependency)."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            else:
                continue
            if any(n.split(".")[0] in tops for n in names):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_no_product_module_imports_the_tests():
    """The test-only generators live in tests/helpers/fixtures, outside the shipped package; what
    the product makes (named pairs, dummy and tiny models) lives in ggspec.catalogue. Nothing in
    ggspec/ imports tests' modules."""
    assert _imports_of(PACKAGE, {"helpers", "tests", "conftest"}) == []
    assert not (PACKAGE / "fixtures").exists()


def test_no_test_module_imports_another():
    """What test modules share lives in tests/helpers (or conftest): a test module imported by
    another would run its tests' module-level setup for it, and tie the two together."""
    tests = REPO / "tests"
    assert _imports_of(tests, {p.stem for p in tests.glob("test_*.py")}) == []
