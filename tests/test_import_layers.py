"""The package's imports form no circle, and the tools never import the servers' entry points.

Every module under ``omnistage/`` is parsed (not imported) and each of its imports, at module level or inside
a function, becomes an edge of the module graph; only ``if TYPE_CHECKING:`` blocks are left out, since they never
run. An import of a package is an edge to its ``__init__``; ``from pkg import name`` is an edge to ``pkg.name``
when that is a module. A parent package's ``__init__`` is not counted as imported by its submodules' importers:
that is how Python runs it, but counting it would make every sibling import inside a package that re-exports
its modules a circle. A circle (a strongly connected component of more than one module) is named module by
module, so its fix can start from the edge that points up.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "omnistage"


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name → file; a package is named by its ``__init__``."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement under ``node`` that can run: all but the body of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _imports(ast.Module(body=[other], type_ignores=[]))
        else:
            yield from _imports(child)


def _base(name: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The module a ``from`` import reads from, relative imports resolved against ``name``."""
    if not node.level:
        return node.module or ""
    parts = name.split(".")
    keep = len(parts) - node.level + (1 if is_package else 0)
    return ".".join(parts[:keep] + ([node.module] if node.module else []))


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``name`` imports."""
    targets = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = _base(name, node, path.name == "__init__.py")
        for alias in node.names:
            targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {t for t in targets if t in modules and t != name}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = module_files(root)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                on_stack.add(step)
                work.append((step, iter(sorted(graph[step]))))
            elif step in on_stack:
                low[node] = min(low[node], index[step])
    return found


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
    inside = set(component)
    edges = [f"    {a} -> {b}" for a in component for b in sorted(graph[a] & inside)]
    return "circle of " + ", ".join(component) + ":\n" + "\n".join(edges)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_no_import_circles(graph: dict[str, set[str]]) -> None:
    found = circles(graph)
    assert not found, "\n".join(_describe(c, graph) for c in found)


def test_tools_do_not_import_entrypoints(graph: dict[str, set[str]]) -> None:
    uphill = sorted(f"{a} -> {b}" for a, targets in graph.items() if a.startswith(f"{PACKAGE}.tools")
                    for b in targets if b.startswith(f"{PACKAGE}.entrypoints"))
    assert not uphill, "tools import the entry points:\n" + "\n".join(uphill)


def test_the_checks_see_circles_and_every_kind_of_import(tmp_path: Path) -> None:
    """The graph reads function-level, relative and ``from pkg import module`` imports, skips TYPE_CHECKING, and a
    circle planted in a toy package is found."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import leaf\n")
    (pkg / "sub" / "leaf.py").write_text("def f():\n    from omnistage import top\n")
    (pkg / "top.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import omnistage.other\n"
                                "from .sub import leaf\n")
    (pkg / "other.py").write_text("import omnistage.top\n")
    toy = import_graph(tmp_path)
    assert toy["omnistage.sub"] == {"omnistage.sub.leaf"}
    assert toy["omnistage.sub.leaf"] == {"omnistage.top"}
    assert toy["omnistage.top"] == {"omnistage.sub.leaf"}
    assert toy["omnistage.other"] == {"omnistage.top"}
    assert circles(toy) == [["omnistage.sub.leaf", "omnistage.top"]]
