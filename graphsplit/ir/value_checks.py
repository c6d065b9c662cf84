"""Checks on tensor values in a model's forward, kept as checks.

Libraries validate their inputs: `if labels.max() >= self.config.vocab_size: raise ValueError(...)`
(HF's CTC heads), `assert torch.isfinite(x).all()`. torch.fx cannot branch on a traced value, and
torch.export cannot either ("could not guard on data-dependent expression"), so such a model was
refused whole. But a check whose only effect is to raise does not change what the model computes:
the trace takes the branch that does not raise, and records the condition in the graph as a
`ValueCheck` node, which raises (the model's exception type, naming its line) when the values break
it and does nothing on meta or fake tensors, where the analysis runs. torch.fx asks at `to_bool`
(ir/trace.py); torch.export, through `ExportChecks`, at `bool()` of a value it cannot know.

A statement is such a check when it is an `assert`, or an `if` whose body only raises (calls before
the raise, a log line, are allowed) and which has no `else`; and the operand being tested must have
one truth value for it not to raise: `assert E`, `assert not E`, `assert E1 and E2` (each must hold),
`if E: raise`, `if E1 or E2: raise` (each must not), `if A and E: raise` at its last operand (read
from the span of the instruction that asked, Python 3.11+), never `if E and A: raise` at E.
Any other use of a tensor's value in Python (`if x.sum() > 0: y = a else: y = b`) still is a
data-dependent branch, refused in one line. Under micro-batches a check runs on each piece: a check
that the whole batch passes, each piece of it passes, for the checks that bound values (`max`, `any`,
`all`, `isfinite`); a check on an average may differ (said in the guide).
"""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import itertools
import linecache
import os
import sys
import textwrap
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.fx.node import has_side_effect
from torch.overrides import TorchFunctionMode

from .meta import info

# NodeInfo.extra key of a value_check node: it and what only it reads are left out of batch discovery
VALUE_CHECK = "value_check"


@dataclass(frozen=True)
class Check:
    """What the check at a condition requires: the value its operand must have, and what to raise."""

    holds: bool  # the truth value the condition's operand must have for the model not to raise
    error: type[BaseException]
    place: str  # `file.py:12 \`if labels.max() >= V:\``


class ValueCheck:
    """A graph target: `check(condition)` raises the model's exception when the condition's truth value
    is not `holds`, and does nothing on meta and fake tensors (no values there: the analysis) or
    while torch.compile traces. Each is registered as having a side effect, so no dead-code
    elimination drops it."""

    __name__ = "value_check"
    __qualname__ = "value_check"

    def __init__(self, holds: bool, error: type[BaseException], message: str) -> None:
        self.holds = holds
        self.error = error
        self.message = message
        has_side_effect(self)

    def __call__(self, condition: object) -> None:
        if isinstance(condition, torch.Tensor):
            if condition.device.type == "meta" or _fake(condition) or torch.compiler.is_compiling():
                return
        if bool(condition) != self.holds:
            raise self.error(self.message)

    def __repr__(self) -> str:
        return f"value_check(holds={self.holds}, {self.error.__name__})"


def _fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def check_at(frame: FrameType | None) -> Check | None:
    """The check the condition being evaluated in `frame` belongs to, or None when its statement is
    not a check (an ordinary data-dependent branch) or which value its operand must have is unclear."""
    if frame is None:
        return None
    found = _statement(frame.f_code, frame.f_lineno)
    if found is None:
        return None
    statement, indent = found
    file, line = frame.f_code.co_filename, frame.f_lineno
    text = linecache.getline(file, line).strip()
    place = f"{os.path.basename(file)}:{line} `{text}`"
    # an assert must come out true, a raising `if` false; which operand is being tested: the span of the
    # instruction that asked (Python 3.11+), so `if labels is not None and labels.max() >= V:` is read right
    at = _position(frame, indent)
    if isinstance(statement, ast.Assert):
        holds = _required(statement.test, True, at)
        return Check(holds, AssertionError, place) if holds is not None else None
    holds = _required(statement.test, False, at)
    raised = statement.body[-1]
    assert isinstance(raised, ast.Raise)
    return Check(holds, _exception(raised, frame), place) if holds is not None else None


Span = tuple[int, int, int, int]  # first line, last line, first column, end column (the parsed source's)


def _position(frame: FrameType, indent: int) -> Span | None:
    positions = getattr(frame.f_code, "co_positions", None)
    if positions is None:
        return None
    found = list(positions())[frame.f_lasti // 2]
    if None in found:
        return None
    line, end, col, end_col = found
    return line, end, col - indent, end_col - indent


def _span(expr: ast.expr) -> Span:
    return expr.lineno, expr.end_lineno or expr.lineno, expr.col_offset, expr.end_col_offset or 0


def _required(expr: ast.expr, want: bool, at: Span | None) -> bool | None:
    """The truth value the operand being tested must have for `expr` to come out `want`; None when that
    depends on operands not yet seen (`if a and b: raise` tested at `a`)."""
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        return _required(expr.operand, not want, at)
    if not isinstance(expr, ast.BoolOp):
        return want
    values = expr.values
    every = isinstance(expr.op, ast.And)  # the value all operands must have for `and` / `or` to give it
    k = next((i for i, v in enumerate(values) if at is not None and _contains(_span(v), at)), None)
    if k is None:  # which operand is unknown: only when each must be `want`, and each is one plain test
        plain = all(not isinstance(v, ast.BoolOp | ast.UnaryOp) for v in values)
        return want if every == want and plain else None
    # operand k is tested: those before it were each `every`. All `want`: k must be; else only the last decides
    if every == want or k == len(values) - 1:
        return _required(values[k], want, at)
    return None


def _contains(outer: Span, inner: Span) -> bool:
    return (outer[0], outer[2]) <= (inner[0], inner[2]) and (inner[1], inner[3]) <= (outer[1], outer[3])


def _exception(raised: ast.Raise, frame: FrameType) -> type[BaseException]:
    """The exception class the statement raises when it names one (`raise ValueError(...)`), else
    RuntimeError."""
    target = raised.exc.func if isinstance(raised.exc, ast.Call) else raised.exc
    if isinstance(target, ast.Name):
        found = frame.f_globals.get(target.id, getattr(builtins, target.id, None))
        if isinstance(found, type) and issubclass(found, BaseException):
            return found
    return RuntimeError


def _statement(code: CodeType, line: int) -> tuple[ast.Assert | ast.If, int] | None:
    """The `assert` or raising `if` whose condition spans `line` in `code`'s function, and how far its
    source was dedented to parse."""
    checks, indent = _checks(code)
    for node in checks:
        if node.test.lineno <= line <= (node.test.end_lineno or node.test.lineno):
            return node, indent
    return None


@functools.lru_cache(maxsize=512)
def _checks(code: CodeType) -> tuple[tuple[ast.Assert | ast.If, ...], int]:
    """The checks of a function, with absolute line numbers, and its source's indent."""
    try:
        lines, start = inspect.getsourcelines(code)
        source = "".join(lines)
        dedented = textwrap.dedent(source)
        tree = ast.parse(dedented)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return (), 0
    indent = len(lines[0]) - len(lines[0].lstrip()) - (len(dedented.splitlines()[0]) - len(dedented.splitlines()[0].lstrip()))
    ast.increment_lineno(tree, start - 1)
    found: list[ast.Assert | ast.If] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            found.append(node)
        elif isinstance(node, ast.If) and not node.orelse and node.body and isinstance(node.body[-1], ast.Raise) \
                and all(isinstance(s, ast.Expr) for s in node.body[:-1]):
            found.append(node)
    return tuple(found), indent


def check_message(check: Check) -> str:
    return (f"the check at {check.place} failed on this batch (graphsplit keeps the model's checks on tensor "
            "values as checks of each micro-batch)")


# checks met while torch.export traced, by key: each recorded in the graph as `aten._assert_async.msg` with
# a message naming its key, made a ValueCheck afterwards (`checks_as_calls`)
_MARK = "graphsplit value check "
_EXPORT_CHECKS: dict[int, Check] = {}
_KEYS = itertools.count(1)


class ExportChecks(TorchFunctionMode):
    """While torch.export traces: `bool()` of a tensor whose value export cannot know (a data-dependent
    guard) at a check of the model's (`check_at`) takes the way that does not raise, and records the
    condition in the graph as an assert of what must hold; any other such `bool()` fails as export fails it."""

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not torch.Tensor.__bool__:
            return func(*args, **kwargs)
        try:
            return func(*args, **kwargs)
        except GuardOnDataDependentSymNode:
            check = check_at(_model_frame(sys._getframe(1)))
            if check is None:
                raise
            key = next(_KEYS)
            _EXPORT_CHECKS[key] = check
            # recorded as an assert of the condition itself; `checks_as_calls` makes it the check of `holds`
            torch.ops.aten._assert_async.msg(args[0], f"{_MARK}{key}")
            return check.holds


def _model_frame(frame: FrameType | None) -> FrameType | None:
    from .user_source import internal

    while frame is not None and internal(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def checks_as_calls(gm: fx.GraphModule) -> list[str]:
    """Each check export recorded (`ExportChecks`) becomes a ValueCheck node; where they are. What export
    recorded of the `bool()` it could not decide (an `item()` whose value only its own range asserts
    read) is dropped with it."""
    places = []
    for node in list(gm.graph.nodes):
        message = node.args[1] if node.op == "call_function" and len(node.args) == 2 else None
        if node.target is torch.ops.aten._assert_async.msg and isinstance(message, str) and message.startswith(_MARK):
            check = _EXPORT_CHECKS.pop(int(message.removeprefix(_MARK)))
            node.target = ValueCheck(check.holds, check.error, check_message(check))
            node.args = (node.args[0],)
            info(node).extra[VALUE_CHECK] = True
            places.append(check.place)
    if places:
        _drop_undecided_reads(gm.graph)
    return places


_SCALAR_ASSERTS = {torch.ops.aten._assert_scalar.default, torch.ops.aten.sym_constrain_range_for_size.default}


def _drop_undecided_reads(graph: fx.Graph) -> None:
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (torch.ops.aten.item.default,
                                                             torch.ops.aten._local_scalar_dense.default):
            continue
        reached, stack = [node], list(node.users)
        while stack:
            user = stack.pop()
            if user in reached:
                continue
            if user.op != "call_function" or isinstance(user.target, torch._ops.OpOverload) and \
                    user.target not in _SCALAR_ASSERTS:
                break  # the value is used: keep all of it
            reached.append(user)
            stack.extend(user.users)
        else:
            inputs = node.all_input_nodes
            for dead in sorted(reached, key=lambda n: -_order(graph, n)):
                graph.erase_node(dead)
            for used in inputs:  # the comparison that fed it, now read by nothing
                if not used.users and used.op == "call_function":
                    graph.erase_node(used)


def _order(graph: fx.Graph, node: fx.Node) -> int:
    return next(i for i, n in enumerate(graph.nodes) if n is node)


def kept_checks(places: list[str]) -> str:
    """The summary's words for the checks on values kept (empty when none)."""
    found = "; ".join(dict.fromkeys(places))
    return f" (checks on tensor values kept as checks: {found})" if found else ""
