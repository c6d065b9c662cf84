"""Modules run as their author wrote them: a submodule whose forward branches on tensor values (`if
mask.any():` around an expert of a hand-written mixture of experts, a one-hot sized by `indexes.max()`)
has no one graph, so torch.fx cannot trace it and torch.export refuses it. Where both tracers fail, and
fx failed inside a submodule, graphsplit keeps that module as one `call_module` node (`run_as_written`),
which runs the module's own forward on each micro-batch, whatever it branches on; the rest of the model
is traced as usual. The analyses run such a
module on CPU stand-ins of its inputs' shapes (cpu_stand_ins.py); a pipeline stage holds it whole; tensor
parallelism leaves its weights whole.

What such a module writes to itself in forward (`self.aux_loss = ...`, a load-balancing loss the model
sums over its layers afterwards) is read after the call by a node of its own (`written_attribute`), so
the graph carries it as a value, as it carries the module's output.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Iterator
from functools import cache
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
import torch.nn as nn

from .cpu_stand_ins import wrote_on_cpu

if TYPE_CHECKING:
    from .traced_model import Traced


def failed_in(exc: BaseException) -> str | None:
    """The innermost submodule whose forward raised `exc` while torch.fx traced it (None: forward itself)."""
    return getattr(exc, FAILED_IN, None) or None


FAILED_IN = "graphsplit_failed_in"  # the attribute trace.py's tracer sets on an exception leaving a module


def run_as_written(model: nn.Module, error: BaseException, attempt: Callable[[frozenset[str]], Traced],
                   place: Callable[[BaseException], str]) -> Traced:
    """Traced again (`attempt(eager)`) with the submodule fx failed in kept as one call_module node, and
    with it every module of its class (one class's modules fail alike), until a trace holds. A failure in
    forward itself, or in a module already kept, raises it. `place(exc)`: the model's line it names."""
    eager: dict[str, str] = {}  # module -> where its class failed
    path = failed_in(error)
    while path is not None and path not in eager:
        kind = type(model.get_submodule(path))
        where = place(error)
        eager.update({name: where for name, m in model.named_modules() if type(m) is kind})
        try:
            traced = attempt(frozenset(eager))
        except Exception as again:  # noqa: BLE001 - the next module fx cannot trace, or the same failure
            error, path = again, failed_in(again)
            continue
        # a module kept inside another one kept is never called by the trace: the outer one stands for it
        outer = {name: at for name, at in eager.items() if not any(name.startswith(f"{o}.") for o in eager)}
        places = {f"{type(model.get_submodule(name)).__name__} at {at}" for name, at in outer.items()}
        traced.reason += f" ({len(outer)} module(s) run as written, one op each, where neither tracer follows " \
                         f"their forward: {'; '.join(sorted(places))})"
        traced.eager = tuple(outer)
        return traced
    raise error


def written_attribute(module: nn.Module, name: str, after: Any) -> Any:
    """What `module`'s forward, run as written just before (`after` is its output), left in `module.name`
    (where the analyses ran it on CPU stand-ins, what that run left: cpu_stand_ins.py)."""
    on_cpu = wrote_on_cpu(after, module, name)
    return getattr(module, name) if on_cpu is None else on_cpu


def is_written_read(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is written_attribute


def state_spans(graph: fx.Graph) -> Iterator[tuple[fx.Node, fx.Node]]:
    """(the module's call, the read of what it wrote) for each such read: both run on the module object
    one rank holds, so a pipeline stage holds both (another stage's copy of the module never ran)."""
    for node in graph.nodes:
        if is_written_read(node) and isinstance(node.args[2], fx.Node):
            yield node.args[2], node


def carry_written(tracer: fx.Tracer, module: nn.Module, path: str, call: fx.Proxy) -> None:
    """After the call of a module run as written: each tensor attribute its class writes outside
    `__init__` reads, in the graph, what this call left there (the trace's `left_as_found` puts the
    module's attributes back afterwards)."""
    registered = {*module._parameters, *module._buffers, *module._modules}  # a buffer stays a buffer
    names = [n for n in written_names(type(module)) if n not in registered
             and isinstance(vars(module).get(n, torch.empty(0)), (torch.Tensor, fx.Proxy))]
    if not names:
        return
    owner = tracer.create_proxy("get_attr", path, (), {})
    for name in names:
        vars(module)[name] = tracer.create_proxy("call_function", written_attribute, (owner, name, call), {})


def drop_unread(graph: fx.Graph) -> None:
    """The reads `carry_written` made that the model never used (its class writes the attribute only
    on some paths, `if self.aux:`), and the module references they held."""
    for node in list(graph.nodes):
        if is_written_read(node) and not node.users:
            owner = node.args[0]
            graph.erase_node(node)
            if isinstance(owner, fx.Node) and owner.op == "get_attr" and not owner.users:
                graph.erase_node(owner)


@cache
def written_names(cls: type) -> tuple[str, ...]:
    """`self.X = ...` (or `+=`) targets in the methods of `cls` and its own bases, `__init__` aside."""
    names: dict[str, None] = {}
    for klass in cls.__mro__:
        if klass.__module__.startswith("torch.") or klass is object:
            continue
        for attr, fn in vars(klass).items():
            if attr == "__init__" or not inspect.isfunction(fn):
                continue
            try:
                tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
            except (OSError, TypeError, SyntaxError):
                continue
            args = tree.body[0].args.args if tree.body and isinstance(tree.body[0], ast.FunctionDef) else []
            if not args:
                continue
            me = args[0].arg
            for node in ast.walk(tree):
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
                for t in [e for g in targets for e in (g.elts if isinstance(g, ast.Tuple) else [g])]:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == me:
                        names[t.attr] = None
    return tuple(names)
