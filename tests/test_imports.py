"""The package's import graph has no circle: read with `ast`, module-level imports and
imports inside functions alike (a lazy import hides a circle, it does not remove it)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "graphsplit"  # read, never imported: no torch needed


def modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__) for every module of the package."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def imported(name: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: dict) -> list[str]:
    """The package's modules an import statement imports. `from pkg import sub` imports the
    submodule `pkg.sub`, `from pkg import name` the module `pkg`; a parent package's
    `__init__`, which Python runs first, is not counted (every module would be in a circle
    with the package's own `__init__`)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    if node.level:
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    found = [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]
    return [t for t in found if t in known]


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in known.items():
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(t for t in imported(name, is_package, node, known) if t != name)
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports as a path (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (circle := visit(n)):
                return circle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (circle := visit(m)):
            return circle
    return None


def test_the_reader_sees_every_kind_of_import():
    graph = import_graph()
    assert "graphsplit.passes.tensor_parallel.rules.matrix" in graph["graphsplit.passes.tensor_parallel.rules"]
    assert "graphsplit.ir.op_kinds" in graph["graphsplit.ir.meta"]  # from .op_kinds import OpKind
    assert "graphsplit.passes.pipeline_split" in graph["graphsplit.rewrite"]
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_circle():
    circle = find_circle(import_graph())
    assert circle is None, "import circle: " + " -> ".join(circle)
