"""Print every import cycle among ggspec's modules; exit 1 when there is one.

Layers should point one way (internals.md: native <- runtime <- speculative <- cli), and a circle
hides which module is the lower one. The graph counts every `import` and `from ... import` of a
ggspec module, at module level and inside functions alike: a lazy import still makes the two
modules depend on each other, it only postpones the failure; so does `import_module("ggspec.x")`
with a literal name. An `import_module` whose name is computed (an f-string, a variable that starts
"ggspec.") hides its edge, and is reported as an error of its own. A cycle is a strongly connected
component of more than one module (Tarjan's algorithm).

    python scripts/import_cycles.py [PACKAGE_DIR]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "ggspec"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module name of a `from X import ...` (relative imports included)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[:len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path, module: str, known: set[str]) -> set[str]:
    """The ggspec modules `path` imports (`from pkg import mod` counts mod when it is a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):  # `if TYPE_CHECKING:` imports never run: annotations only
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            node.body = []
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, module, path.name == "__init__.py")
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif _is_import_module(node) and isinstance(node.args[0], ast.Constant):
            names = [str(node.args[0].value)]
        else:
            continue
        for name in names:
            while name and name not in known:  # `import a.b.c` depends on the deepest known module
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def _is_import_module(node: ast.AST) -> bool:
    """A call of importlib's import_module (by either spelling) with an argument."""
    if not isinstance(node, ast.Call) or not node.args:
        return False
    f = node.func
    return (isinstance(f, ast.Name) and f.id == "import_module") or (isinstance(f, ast.Attribute) and f.attr == "import_module")


def hidden_imports(root: Path = ROOT) -> list[str]:
    """`file:line` of each import_module of a ggspec module whose name is computed (the graph
    cannot see where it points)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if _is_import_module(node) and not isinstance(node.args[0], ast.Constant):
                text = ast.unparse(node.args[0])
                if root.name in text:
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    known = set(files)
    return {m: imports_of(p, m, known) for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # recursive Tarjan: the graph is a few hundred modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def main(argv: list[str]) -> int:
    root = Path(argv[1]).resolve() if len(argv) > 1 else ROOT
    found = cycles(import_graph(root))
    for component in found:
        print(" <-> ".join(component))
    hidden = hidden_imports(root)
    for where in hidden:
        print(f"{where}: import_module of a computed name (the import graph cannot see it)")
    if not found and not hidden:
        print(f"no import cycles in {root.name}/")
    return 1 if found or hidden else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
