"""Every import runs down the package's floors (docs/architecture.md), none back up.

The floors, from the top: the command line; the Python API; launching and reports; the planner; the
transform (`rewrite.py`); the passes and the backends; the runtime and the analyses; the ops; the IR;
the plan and the model loader; errors. A module may import its own floor and the floors below it: a
lower floor that reached up (the IR cutting stages with a pass's helpers) would make it depend on what
is built from it. Imports read only by type checkers (`if TYPE_CHECKING:`) are not run and not counted.
"""

from __future__ import annotations

import ast

from .test_imports import imported, modules

# from the top floor down: a module's floor is the first entry its dotted name falls under
FLOORS: list[tuple[str, ...]] = [
    ("graphsplit.__main__",),
    ("graphsplit.cli", "graphsplit.cli_inspect"),
    ("graphsplit.api", "graphsplit.pipelined", "graphsplit.lightning", "graphsplit.cli_errors", "graphsplit.cli_options"),
    ("graphsplit.launch", "graphsplit.report"),
    ("graphsplit.planner",),
    ("graphsplit.rewrite", "graphsplit.front_end"),
    ("graphsplit.passes", "graphsplit.backends"),
    ("graphsplit.runtime", "graphsplit.analysis"),
    ("graphsplit.ops",),
    ("graphsplit.ir",),
    ("graphsplit.plan", "graphsplit.loader"),
    ("graphsplit.errors",),
]


def floor(module: str) -> int | None:
    """How high `module` stands (0: the ground), None for the package's face (`graphsplit/__init__`)."""
    for height, names in enumerate(reversed(FLOORS)):
        if any(module == n or module.startswith(n + ".") for n in names):
            return height
    return None


def _run_time_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run: not those under `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def arrows_back_up() -> list[str]:
    known = modules()
    found = []
    for name, (path, is_package) in sorted(known.items()):
        here = floor(name)
        if here is None:
            continue
        for node in _run_time_imports(ast.parse(path.read_text(encoding="utf-8"))):
            for target in imported(name, is_package, node, known):
                there = floor(target)
                if there is not None and there > here:
                    found.append(f"{name} (floor {here}) imports {target} (floor {there}), line {node.lineno}")
    return found


def test_every_module_has_a_floor():
    assert [m for m in modules() if floor(m) is None] == ["graphsplit"]


def test_no_import_runs_back_up():
    assert arrows_back_up() == []


def test_the_reader_sees_an_import_back_up():
    assert floor("graphsplit.ir.program") < floor("graphsplit.passes.stage_programs")
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\nimport b\n")
    assert [n.names[0].name for n in _run_time_imports(tree) if isinstance(n, ast.Import)] == ["b"]
