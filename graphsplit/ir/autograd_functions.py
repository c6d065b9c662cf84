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
restored at once). torch.export sees each call as one `graphsplit::function_call` op while it
traces (`functions_as_ops`), made the same FunctionCall afterwards (`functions_as_calls`).
torch's own Functions (checkpointing, its internal ops) are traced through: they are
the framework, not the model.

A Function given a callable that it runs under `no_grad` in forward and runs again under
`enable_grad` in backward to differentiate it is activation checkpointing written by hand
(Megatron-LM's and DeepSpeed's `checkpoint`, the CheckpointFunction of guided/improved-diffusion and
latent diffusion): its gradient is the callable's own, so it is traced through, the callable's ops
with their gradients in the graph (`recomputes`), and graphsplit's `--checkpoint` does the
recomputing where the plan asks for it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
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
    Named after the Function, so stage code reads `MyFn_apply(x, 0.5)`.

    With a `template` (torch.export's calls, `functions_as_ops`), the node passes the call's tensors
    alone and gets the outputs as a flat list: the template holds the rest of the arguments."""

    def __init__(self, cls: type[torch.autograd.Function],
                 template: tuple[pytree.TreeSpec, tuple[Any, ...]] | None = None) -> None:
        self.cls = cls
        self.template = template
        self.__name__ = f"{cls.__name__}_apply"
        self.__qualname__ = self.__name__
        self.__module__ = cls.__module__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.template is None:
            return self.cls.apply(*args, **kwargs)
        spec, values = self.template
        tensors = iter(args)
        call_args, call_kwargs = pytree.tree_unflatten([next(tensors) if v is _TENSOR else v for v in values], spec)
        return [v for v in pytree.tree_leaves(self.cls.apply(*call_args, **call_kwargs)) if isinstance(v, torch.Tensor)]

    def __repr__(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__qualname__}.apply"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FunctionCall) and other.cls is self.cls and other.template is self.template

    def __hash__(self) -> int:
        return hash((self.cls, id(self.template)))


class _Tensor:
    """Where a tensor goes in a template's leaves."""

    def __repr__(self) -> str:
        return "<tensor>"


_TENSOR = _Tensor()
# what a Function may take besides tensors and stay one node: values a graph can hold as constants
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)


def _given_callable(leaf: Any) -> bool:
    return callable(leaf) and not isinstance(leaf, torch.Tensor | type | fx.Proxy)


@functools.cache
def _recomputing(cls: type) -> bool:
    try:
        forward, backward = inspect.getsource(cls.forward), inspect.getsource(cls.backward)
    except (OSError, TypeError):
        return False
    return "no_grad" in forward and "enable_grad" in backward and ("autograd.grad" in backward or
                                                                  "backward(" in backward)


def recomputes(cls: type, leaves: list[Any]) -> bool:
    """Whether a Function call is activation checkpointing by hand: given a callable, the Function's
    forward runs under `no_grad` and its backward under `enable_grad`, differentiating what it runs
    again (`torch.autograd.grad` or `.backward(`). Its gradient is then the callable's own."""
    return any(_given_callable(leaf) for leaf in leaves) and _recomputing(cls)


class _TraceContext:
    """The `ctx` a recomputing Function's forward gets when it runs as plain code in a trace: what it
    keeps for its backward is kept nowhere (autograd differentiates the callable's ops instead)."""

    needs_input_grad: tuple[bool, ...] = ()
    materialize_grads = True

    def save_for_backward(self, *tensors: Any) -> None:
        pass

    def mark_non_differentiable(self, *tensors: Any) -> None:
        pass

    def mark_dirty(self, *tensors: Any) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass


def _with_grad(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.enable_grad():
            return fn(*args, **kwargs)

    return run


def run_forward_with_grad(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A recomputing Function's forward run as plain code, the callables it is given run with
    gradients on (its `no_grad` would hide their ops' gradients from the trace)."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    args, kwargs = pytree.tree_unflatten([_with_grad(v) if _given_callable(v) else v for v in leaves], spec)
    return cls.forward(_TraceContext(), *args, **kwargs)


@contextlib.contextmanager
def recomputing_traced_through() -> Iterator[list[str]]:
    """While torch.fx traces: a call of a hand-written checkpointing Function (`recomputes`) runs its
    forward as plain code, the callable it is given under `enable_grad` (torch.fx would record the
    callable's ops under the forward's `no_grad`). Yields the names of the Functions traced through;
    each class's `apply` is redirected for the trace alone, as `functions_as_ops` does for export."""
    names: list[str] = []
    saved: dict[type, Any] = {}

    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        if recomputes(cls, pytree.tree_leaves((args, kwargs))):
            names.append(cls.__qualname__)
            return run_forward_with_grad(cls, args, kwargs)
        own = saved[cls]
        if own is not _NONE:
            return own.__get__(None, cls)(*args, **kwargs)
        return torch.autograd.Function.apply.__func__(cls, *args, **kwargs)  # type: ignore[attr-defined]

    for cls in _user_function_classes():
        if _recomputing(cls):
            saved[cls] = cls.__dict__.get("apply", _NONE)
            cls.apply = classmethod(apply)  # type: ignore[method-assign,assignment]
    try:
        yield names
    finally:
        for cls, original in saved.items():
            if original is _NONE:
                del cls.apply
            else:
                cls.apply = original  # type: ignore[method-assign]


def recomputed_through(names: list[str]) -> str:
    """The summary's words for the checkpointing Functions traced through (empty when none)."""
    traced = ", ".join(dict.fromkeys(names))
    return (f" (autograd Functions that recompute a callable, activation checkpointing by hand, traced through: "
            f"{traced}; --checkpoint recomputes where the plan asks)") if traced else ""


def plain_arguments(cls: type, leaves: list[Any], is_value: Any) -> None:
    """Refuse a Function call with an argument a graph cannot hold (a module, a callable): kept whole,
    it would run the model's own objects outside the program (a checkpointing Function given
    `self._forward`)."""
    for leaf in leaves:
        if not is_value(leaf) and not isinstance(leaf, _PLAIN):
            raise TypeError(f"the autograd Function {cls.__qualname__} ({defined_at(cls)}) takes a "
                            f"{type(leaf).__name__} among its arguments; graphsplit keeps a Function whole when it "
                            "takes tensors and plain values (numbers, strings, dtypes); if it checkpoints activations, "
                            "switch it off in the model and give --checkpoint blocks")


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
    kept: list[str] = field(default_factory=list)  # the Functions kept whole, for the summary

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
        plain_arguments(call.cls, pytree.tree_leaves((call.args, call.kwargs)),
                        lambda v: isinstance(v, fx.Proxy | torch.Tensor))
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


def defined_at(cls: type) -> str:
    """`file.py:line` of a class's definition (its name alone when its source is not on disk)."""
    try:
        lines, start = inspect.getsourcelines(cls)
        return f"{Path(inspect.getsourcefile(cls) or '?').name}:{start}"
    except (OSError, TypeError):
        return cls.__qualname__


# torch.export's calls of the user's Functions, by key: (class, arguments' spec, leaves with the tensors
# marked), filled while export traces and read back when the graph is rewritten (`functions_as_calls`);
# and each call's output: its spec and leaves with the tensors marked (the op returns the tensors alone)
_EXPORTED: dict[int, tuple[type, pytree.TreeSpec, tuple[Any, ...]]] = {}
_OUTPUTS: dict[int, tuple[pytree.TreeSpec, tuple[Any, ...]]] = {}
_ORIGINAL: dict[type, Any] = {}  # while `functions_as_ops` holds: each class's own `apply`, if it had one
_KEYS = itertools.count(1)
_RECOMPUTED: list[str] = []  # while `functions_as_ops` holds: the checkpointing Functions traced through
_NONE = object()  # a class with no `apply` of its own (it inherits Function's)


@torch.library.custom_op("graphsplit::function_call", mutates_args=())
def _function_call(tensors: list[torch.Tensor], key: int) -> list[torch.Tensor]:
    """Stands for one call of a user's Function while torch.export traces; replaced by a FunctionCall
    node in the graph before anything runs it."""
    raise RuntimeError("graphsplit::function_call stands for a Function while torch.export traces; it does not run")


@_function_call.register_fake
def _function_call_shapes(tensors: list[torch.Tensor], key: int) -> list[torch.Tensor]:
    cls, spec, values = _EXPORTED[key]
    with torch.no_grad():
        leaves, out_spec = pytree.tree_flatten(_apply_original(cls, spec, values, tensors))
    _OUTPUTS[key] = (out_spec, tuple(_TENSOR if isinstance(v, torch.Tensor) else v for v in leaves))
    return [torch.empty_like(v) for v in leaves if isinstance(v, torch.Tensor)]


def _apply_original(cls: type, spec: pytree.TreeSpec, values: tuple[Any, ...], tensors: Any) -> Any:
    it = iter(tensors)
    args, kwargs = pytree.tree_unflatten([next(it) if v is _TENSOR else v for v in values], spec)
    own = _ORIGINAL.get(cls)
    if own is not None:
        return own.__get__(None, cls)(*args, **kwargs)
    return torch.autograd.Function.apply.__func__(cls, *args, **kwargs)  # type: ignore[attr-defined]


@contextlib.contextmanager
def functions_as_ops() -> Iterator[list[str]]:
    """While torch.export traces, each user Function call is one `graphsplit::function_call` op (its
    forward runs only to give the op's shapes), so the graph keeps where the Function was; its
    `apply` is redirected for the trace alone and restored after, as torch.fx's own `wrap` patches
    a module's globals while it traces. `functions_as_calls` then makes each op a FunctionCall.
    Yields the names of the checkpointing Functions traced through instead (`recomputes`)."""
    saved: dict[type, Any] = {}
    _RECOMPUTED.clear()
    for cls in _user_function_classes():
        saved[cls] = cls.__dict__.get("apply", _NONE)
        if saved[cls] is not _NONE:
            _ORIGINAL[cls] = saved[cls]
        cls.apply = classmethod(_export_apply)  # type: ignore[method-assign,assignment]
    try:
        yield _RECOMPUTED
    finally:
        for cls, original in saved.items():
            _ORIGINAL.pop(cls, None)
            if original is _NONE:
                del cls.apply
            else:
                cls.apply = original  # type: ignore[method-assign]


def _export_apply(cls: type, *args: Any, **kwargs: Any) -> Any:
    leaves, spec = pytree.tree_flatten((args, kwargs))
    if recomputes(cls, leaves):
        _RECOMPUTED.append(cls.__qualname__)
        return run_forward_with_grad(cls, args, kwargs)
    values = tuple(_TENSOR if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves)
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    if not tensors:  # nothing traced flows through it
        return _apply_original(cls, spec, values, ())
    plain_arguments(cls, leaves, lambda v: isinstance(v, torch.Tensor))
    key = next(_KEYS)
    _EXPORTED[key] = (cls, spec, values)
    outs = iter(torch.ops.graphsplit.function_call(tensors, key))
    out_spec, out_values = _OUTPUTS[key]
    return pytree.tree_unflatten([next(outs) if v is _TENSOR else v for v in out_values], out_spec)


def functions_as_calls(gm: fx.GraphModule) -> list[str]:
    """Each `graphsplit::function_call` op of an exported graph becomes the FunctionCall it stands for
    (the same tensors in, the same flat list out); the names of the Functions kept."""
    kept = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.graphsplit.function_call.default:
            tensors, key = node.args
            cls, spec, values = _EXPORTED.pop(key)
            _OUTPUTS.pop(key, None)
            node.target = FunctionCall(cls, (spec, values))
            node.args = tuple(tensors)
            kept.append(cls.__qualname__)
    return kept


def kept_whole(names: list[str]) -> str:
    """The summary's words for the Functions kept as one node each (empty when none)."""
    kept = ", ".join(dict.fromkeys(names))
    return f" (autograd Functions kept whole, each with its own backward: {kept})" if kept else ""

