"""A user's `torch.autograd.Function` stays one node, so its own backward runs.

torch.fx traces *through* `MyFn.apply(x)`: the Function's `forward` runs on proxies and its ops
land in the graph one by one, while its `backward` is lost. autograd then differentiates the
forward's ops instead, so the gradients upstream of a straight-through estimator, a
gradient-reversal layer or a hand-written fused kernel are silently those of another function.

The tracer lets `forward` run (that is how it learns what the call returns) and then puts the
call back together: the nodes the Function made are replaced by one `call_function` node whose
target is a `FunctionCall`, which runs `MyFn.apply` itself, forward and backward, on real,
meta or fake tensors alike. The place is found by the frame of `Function.apply` on the stack;
the call's end by a profile hook on that one frame (set only while a Function runs, and
restored at once). torch's own Functions (checkpointing, its internal ops) are traced through
as before: they are the framework, not the model.
"""

from __future__ import annotations

import contextlib
import inspect
import operator
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

_APPLY = torch.autograd.Function.apply.__func__.__code__  # type: ignore[attr-defined]


class FunctionCall:
    """`MyFn.apply` as a graph target: calling it runs the user's Function (forward and backward).
    Named after the Function, so stage code reads `MyFn_apply(x, 0.5)`."""

    def __init__(self, cls: type[torch.autograd.Function]) -> None:
        self.cls = cls
        self.__name__ = f"{cls.__name__}_apply"
        self.__qualname__ = self.__name__
        self.__module__ = cls.__module__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.cls.apply(*args, **kwargs)

    def __repr__(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__qualname__}.apply"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FunctionCall) and other.cls is self.cls

    def __hash__(self) -> int:
        return hash(self.cls)


def user_function(node: fx.Node) -> type[torch.autograd.Function] | None:
    """The user's Function a node calls whole, or None."""
    target = node.target
    return target.cls if node.op == "call_function" and isinstance(target, FunctionCall) else None


def _framework(cls: type) -> bool:
    return cls.__module__ == "torch" or cls.__module__.startswith("torch.")


@dataclass
class _Open:
    """A Function call being traced: its frame, its inputs, and the first node it made."""

    frame: FrameType
    cls: type[torch.autograd.Function]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    first: fx.Node
    previous_profile: Any = None


@dataclass
class FunctionCapture:
    """Tracer-side bookkeeping: `on_node` for every node the tracer makes; `error` after tracing."""

    make_proxy: Callable[..., fx.Proxy]  # the tracer's create_proxy
    graph: fx.Graph
    open: _Open | None = None
    closing: bool = False
    error: BaseException | None = None
    kept: list[str] = field(default_factory=list)  # "MyFn at file:line", for the summary

    def on_node(self, node: fx.Node) -> None:
        if self.open is not None or self.closing:
            return
        frame = _outermost_apply(sys._getframe(2))
        if frame is None:
            return
        self.open = _Open(frame, frame.f_locals["cls"], tuple(frame.f_locals.get("args", ())), dict(frame.f_locals.get("kwargs") or {}),
                          node, sys.getprofile())
        sys.setprofile(self._profile)

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        call = self.open
        if call is None or event != "return" or frame is not call.frame:
            return
        sys.setprofile(call.previous_profile)
        self.open = None
        if arg is None:  # the Function raised: the trace fails on its own
            return
        try:
            self._close(call, arg)
        except Exception as exc:  # noqa: BLE001 - reported after the trace, not from inside a profile hook
            self.error = exc

    def finish(self) -> None:
        """After tracing (also when it failed): no hook left behind; a failure to rebuild a call raised."""
        if self.open is not None:
            sys.setprofile(self.open.previous_profile)
            self.open = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def _close(self, call: _Open, out: Any) -> None:
        made = _nodes_from(self.graph, call.first)
        leaves = pytree.tree_flatten_with_path(out)[0]
        own = set(made)
        if any(isinstance(leaf, fx.Proxy) and leaf.node not in own for _, leaf in leaves):
            raise TypeError(f"{call.cls.__qualname__}.forward returns one of its inputs as it is; graphsplit keeps a "
                            "Function whole only when its outputs are values it computes (return x.view_as(x))")
        self.closing = True
        try:
            whole = self.make_proxy("call_function", FunctionCall(call.cls), call.args, call.kwargs)
            if isinstance(out, fx.Proxy):
                out.node = whole.node
            for path, leaf in leaves if not isinstance(out, fx.Proxy) else ():
                if isinstance(leaf, fx.Proxy):  # a tuple (or nested) output: each leaf read with getitem
                    value = whole
                    for key in path:
                        value = self.make_proxy("call_function", operator.getitem,
                                                (value, getattr(key, "idx", getattr(key, "key", None))), {})
                    leaf.node = value.node
        finally:
            self.closing = False
        for node in reversed(made):  # what forward made, now used by nothing
            if node.op in ("call_function", "call_method", "call_module") and not node.users:
                self.graph.erase_node(node)
        self.kept.append(call.cls.__qualname__)


def _nodes_from(graph: fx.Graph, first: fx.Node) -> list[fx.Node]:
    nodes, found = [], False
    for node in graph.nodes:
        found = found or node is first
        if found:
            nodes.append(node)
    return nodes


def _outermost_apply(frame: FrameType | None) -> FrameType | None:
    """The outermost frame of `Function.apply` on the stack that applies a user's Function (one inside
    torch's own, a reentrant checkpoint, counts; torch's inside the user's are swallowed whole)."""
    found = None
    while frame is not None:
        if frame.f_code is _APPLY:
            cls = frame.f_locals.get("cls")
            if isinstance(cls, type) and not _framework(cls):
                found = frame
        frame = frame.f_back
    return found


def _user_function_classes() -> list[type]:
    """Every user-defined (not torch's) Function subclass imported so far."""
    found, todo = [], list(torch.autograd.Function.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if not _framework(cls):
            found.append(cls)
    return found


@contextlib.contextmanager
def functions_applied() -> Iterator[list[type]]:
    """Inside, the user's Functions applied are listed (in the yielded list): for torch.export, which
    traces through them and cannot keep their backward. A profile hook watches for `Function.apply`
    only while some user Function class exists at all."""
    seen: list[type] = []
    if not _user_function_classes():
        yield seen
        return
    previous = sys.getprofile()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if frame.f_code is _APPLY and event == "call":
            cls = frame.f_locals.get("cls")
            if isinstance(cls, type) and not _framework(cls) and cls not in seen:
                seen.append(cls)

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


def defined_at(cls: type) -> str:
    """`file.py:line` of a class's definition (its name alone when its source is not on disk)."""
    try:
        lines, start = inspect.getsourcelines(cls)
        return f"{Path(inspect.getsourcefile(cls) or '?').name}:{start}"
    except (OSError, TypeError):
        return cls.__qualname__
