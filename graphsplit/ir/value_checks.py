"""Checks on tensor values in a model's forward, kept as checks.

Libraries validate their inputs: `if labels.max() >= self.config.vocab_size: raise ValueError(...)`
(HF's CTC heads), `assert torch.isfinite(x).all()`. torch.fx cannot branch on a traced value, and
torch.export cannot either ("could not guard on data-dependent expression"), so such a model was
refused whole. But a check whose only effect is to raise does not change what the model computes:
the trace takes the branch that does not raise, and records the condition in the graph as a call of
`value_check`, which raises (the model's exception type, naming its line) when the values break it
and does nothing on meta or fake tensors, where the analysis runs.

A statement is such a check when it is
- `assert E`, `assert not E`, `assert E1 and E2 ...` (each operand must hold), or
- `if E: raise`, `if not E: raise`, `if E1 or E2 ...: raise` (each operand must not hold), whose body
  only raises (calls before the raise, a log line, are allowed) and which has no `else`.
Any other use of a tensor's value in Python (`if x.sum() > 0: y = a else: y = b`) still is a
data-dependent branch, refused as before. Under micro-batches a check runs on each piece: a check
that the whole batch passes, each piece of it passes, for the checks that bound values (`max`, `any`,
`all`, `isfinite`); a check on an average may differ (said in the guide).
"""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import linecache
import os
import textwrap
from dataclasses import dataclass
from types import CodeType, FrameType

import torch
from torch.fx.node import has_side_effect


@dataclass(frozen=True)
class Check:
    """What the check at a condition requires: the value its operand must have, and what to raise."""

    holds: bool  # the truth value the condition's operand must have for the model not to raise
    error: type[BaseException]
    place: str  # `file.py:12 \`if labels.max() >= V:\``


@has_side_effect
def value_check(condition: object, holds: bool, error: type[BaseException], message: str) -> None:
    """Raise `error(message)` when `condition`'s truth value is not `holds`; nothing on meta and fake
    tensors (no values there: the analysis) or under torch.compile's tracing."""
    if isinstance(condition, torch.Tensor):
        if condition.device.type == "meta" or _fake(condition) or torch.compiler.is_compiling():
            return
    if bool(condition) != holds:
        raise error(message)


def _fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def check_at(frame: FrameType | None) -> Check | None:
    """The check the condition being evaluated in `frame` belongs to, or None when its statement is
    not a check (an ordinary data-dependent branch)."""
    if frame is None:
        return None
    statement = _statement(frame.f_code, frame.f_lineno)
    if statement is None:
        return None
    file, line = frame.f_code.co_filename, frame.f_lineno
    text = linecache.getline(file, line).strip()
    place = f"{os.path.basename(file)}:{line} `{text}`"
    if isinstance(statement, ast.Assert):
        holds = _polarity(statement.test, ast.And)
        return Check(holds, AssertionError, place) if holds is not None else None
    raised = statement.body[-1]
    assert isinstance(raised, ast.Raise)
    holds = _polarity(statement.test, ast.Or)
    return Check(not holds, _exception(raised, frame), place) if holds is not None else None


def _polarity(test: ast.expr, joiner: type[ast.boolop]) -> bool | None:
    """True when each operand the condition tests is the test itself (`E`, `E1 <joiner> E2`), False
    for `not E`; None for any other form (mixed `and`/`or`, `not` on some operands)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return None if _compound(test.operand) else False
    if isinstance(test, ast.BoolOp):
        if not isinstance(test.op, joiner) or any(_compound(v) for v in test.values):
            return None
        return True
    return True


def _compound(expr: ast.expr) -> bool:
    return isinstance(expr, ast.BoolOp) or (isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not))


def _exception(raised: ast.Raise, frame: FrameType) -> type[BaseException]:
    """The exception class the statement raises when it names one (`raise ValueError(...)`), else
    RuntimeError."""
    target = raised.exc.func if isinstance(raised.exc, ast.Call) else raised.exc
    if isinstance(target, ast.Name):
        found = frame.f_globals.get(target.id, getattr(builtins, target.id, None))
        if isinstance(found, type) and issubclass(found, BaseException):
            return found
    return RuntimeError


def _statement(code: CodeType, line: int) -> ast.Assert | ast.If | None:
    """The `assert` or raising `if` whose condition spans `line` in `code`'s function."""
    for node in _checks(code):
        if node.test.lineno <= line <= (node.test.end_lineno or node.test.lineno):
            return node
    return None


@functools.lru_cache(maxsize=512)
def _checks(code: CodeType) -> tuple[ast.Assert | ast.If, ...]:
    """The checks of a function, with absolute line numbers."""
    try:
        lines, start = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return ()
    ast.increment_lineno(tree, start - 1)
    found: list[ast.Assert | ast.If] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            found.append(node)
        elif isinstance(node, ast.If) and not node.orelse and node.body and isinstance(node.body[-1], ast.Raise) \
                and all(isinstance(s, ast.Expr) for s in node.body[:-1]):
            found.append(node)
    return tuple(found)


def check_message(check: Check) -> str:
    return (f"the check at {check.place} failed on this batch (graphsplit keeps the model's checks on tensor "
            "values as checks of each micro-batch)")
