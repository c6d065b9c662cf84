"""Python conditions on sizes, decided while fx traces, each kept as a check in the graph.

torch.fx cannot follow `assert t <= block_size`, `if x.size(1) > 1:` or `len(src)`: a Proxy has no
value. The values such code reads are often known before any op runs: the sizes of the example
inputs and of the model's parameters and buffers. HF's HFTracer (transformers/utils/fx.py) answers
the same question by running every op on meta tensors as it traces; reading only those sizes, and
arithmetic on them, is enough here and never evaluates anything that depends on data or device
(conditions on values send the model to torch.export).

A decided condition specializes the graph to the branch the example inputs took. So that a later
call which decides it the other way (a micro-batch, a dp share, another sequence length) fails
with the model's line instead of silently running the traced branch, the condition is recorded in
the graph as `torch._assert(cond, message)` on the recomputed size expression: an impure node, so
no dead-code elimination drops it, and a scalar one, so every pass places it like the size reads
it consumes.
"""

from __future__ import annotations

import contextlib
import linecache
import operator
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from .cpu_stand_ins import on_cpu_stand_ins, runs_on_cpu
from .meta import SourceLine, info
from .param_grads import in_place

# what a size expression may be made of: sizes of a tensor, then arithmetic and comparisons
_SIZE_METHODS = frozenset({"size", "dim", "ndimension", "numel"})
_SIZE_ATTRS = frozenset({"shape", "ndim"})
# what reads where a tensor is: meta while sizes are evaluated, not where the program runs
_ON_DEVICE = frozenset({"device", "is_cuda", "is_cpu", "is_meta", "is_mps", "is_xpu", "get_device"})
_OPERATORS: frozenset[Callable[..., Any]] = frozenset({
    operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv, operator.mod,
    operator.pow, operator.neg, operator.pos, operator.abs, operator.not_, operator.and_, operator.or_,
    operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne, operator.getitem,
})

# NodeInfo.extra key marking a recorded check: its failure is the whole message (analysis/shapes.py)
DECIDED = "decided_condition"

# torch.fx's proxy and graphsplit's subclass of it stand between a condition and the tracer
_PROXY_CODE = (os.path.dirname(os.path.realpath(fx.__file__)) + os.sep,
               os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep)


class Unknown(Exception):
    """The expression reads something other than sizes known before tracing."""


class SizeValues:
    """The value of a size expression node, from the example inputs' and the model's tensors.

    Placeholders and get_attr nodes evaluate to their tensors (only their sizes are ever read);
    everything else must be a Python int, bool, float or tuple of ints, or it is `Unknown`."""

    def __init__(self, root: torch.nn.Module, inputs: dict[str, torch.Tensor],
                 buffers: Callable[[], Mapping[str, torch.Tensor]] | None = None) -> None:
        self.root = root
        self.inputs = inputs
        self.memo: dict[fx.Node, Any] = {}
        self._buffers = buffers  # the model's buffers' real values, where `root` is on meta (read lazily)
        self._real: Mapping[str, torch.Tensor] | None = None
        self.state_memo: dict[fx.Node, Any] = {}
        # the tracer's: runs modules plainly while a computed tensor is evaluated on meta
        self.untraced: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext

    def state(self, node: fx.Node) -> Any:
        """The node's value computed from the model's own buffers alone (a RoPE table, a step counter),
        any op on them run for real: `if self.freqs_cos[0, 0] == 0:` is decided by what the constructor
        put there. `Unknown` where it reads an input, a parameter (its values are the init's, not the
        run's) or a buffer that has no real value here."""
        if node in self.state_memo:
            return self.state_memo[node]
        if node.op == "get_attr":
            value = self._buffer(str(node.target))
        elif node.op in ("call_function", "call_method"):
            if in_place(node):  # `self.count += 1`: run now, it would change the model's buffers while tracing
                raise Unknown(node.name)
            args = fx.node.map_arg(node.args, self.state)
            kwargs = fx.node.map_arg(node.kwargs, self.state)
            try:
                if node.op == "call_method":
                    value = getattr(args[0], str(node.target))(*args[1:], **kwargs)
                else:
                    value = node.target(*args, **kwargs)  # type: ignore[operator]
            except Exception as exc:  # the model's own error, where it runs
                raise Unknown(node.name) from exc
        else:
            raise Unknown(node.name)  # an input's value: data, not state
        self.state_memo[node] = value
        return value

    def _buffer(self, target: str) -> torch.Tensor:
        owner_name, _, attr = target.rpartition(".")
        owner = self.root.get_submodule(owner_name) if owner_name else self.root
        value = owner._buffers.get(attr)
        if value is None:
            raise Unknown(target)  # a parameter or a plain attribute
        if value.device.type != "meta":
            return value
        if self._real is None and self._buffers is not None:
            self._real = self._buffers()
        real = (self._real or {}).get(target)
        if real is None:
            raise Unknown(target)
        return real

    def __call__(self, node: fx.Node) -> Any:
        if node not in self.memo:
            try:
                self.memo[node] = self._evaluate(node)
            except Unknown:
                raise
            except Exception as exc:  # `x.size(5)`, `t // 0`: the model's own error, where it runs
                raise Unknown(node.name) from exc
        return self.memo[node]

    def plain(self, node: fx.Node) -> Any:
        """The node's value, which must be a size, a number or a truth value (not a tensor)."""
        return _plain(self(node))

    def _evaluate(self, node: fx.Node) -> Any:
        if node.op == "placeholder" and node.target in self.inputs:
            return self.inputs[str(node.target)]
        if node.op == "get_attr":
            return self._attribute(str(node.target))
        if node.op not in ("call_method", "call_function", "call_module"):
            raise Unknown(node.name)
        args = fx.node.map_arg(node.args, self)
        kwargs = fx.node.map_arg(node.kwargs, self)
        if node.op == "call_method" and node.target in _SIZE_METHODS and isinstance(args[0], torch.Tensor):
            return _plain(getattr(args[0], str(node.target))(*args[1:], **kwargs))
        if node.target is getattr and isinstance(args[0], torch.Tensor) and args[1] in _SIZE_ATTRS:
            return _plain(getattr(args[0], args[1]))
        if node.target in _OPERATORS and not any(isinstance(a, torch.Tensor) for a in (*args, *kwargs.values())):
            value = node.target(*args, **kwargs)  # a size, or one tensor of a module's tuple
            return value if isinstance(value, torch.Tensor) else _plain(value)
        return self._on_meta(node, args, kwargs)

    def _on_meta(self, node: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A computed tensor, as a meta tensor: its sizes are known (`bsz, seq_len, _ = x.shape` of a
        block's hidden states), its values never (an op on them gives another meta tensor; `.item()`,
        `bool()` and `nonzero` fail, and the condition stays `Unknown`)."""
        if (node.target is getattr and args[1] in _ON_DEVICE) or (node.op == "call_method" and node.target in _ON_DEVICE):
            raise Unknown(node.name)  # meta here, the rank's device when it runs
        args, kwargs = pytree.tree_map_only(torch.Tensor, _as_meta, (args, kwargs))
        try:
            with self.untraced():
                value = _run(self.root, node, args, kwargs)
        except Exception as exc:
            raise Unknown(node.name) from exc
        if isinstance(value, torch.Tensor) or (isinstance(value, (tuple, list)) and value
                                               and pytree.tree_all(lambda v: isinstance(v, torch.Tensor), value)):
            return value
        if isinstance(value, torch.dtype):
            return value  # `x.to(h.dtype)`: the same on meta
        return _plain(value)  # a size (`x.size()` of a meta tensor), else Unknown

    def _attribute(self, target: str) -> torch.Tensor:
        # read the registries, not getattr: while fx traces, Module.__getattr__ returns proxies
        owner_name, _, attr = target.rpartition(".")
        owner = self.root.get_submodule(owner_name) if owner_name else self.root
        for table in (owner._parameters, owner._buffers, vars(owner)):
            value = table.get(attr)
            if isinstance(value, torch.Tensor):
                return value
        raise Unknown(target)


def _run(root: torch.nn.Module, node: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if node.op == "call_module":
        module = root.get_submodule(str(node.target))
        state = dict(module.named_parameters()) | dict(module.named_buffers())
        try:
            if all(t.device.type == "meta" for t in state.values()):
                return module(*args, **kwargs)
            # a model with real weights (parallelize() of a built model): run on meta copies of them
            return torch.func.functional_call(module, {k: _as_meta(t) for k, t in state.items()}, args, kwargs)
        except Exception as exc:  # a module that reads values: its shapes on CPU stand-ins (ir/cpu_stand_ins.py)
            if not runs_on_cpu(module, args, kwargs, exc):
                raise
            return on_cpu_stand_ins(module, args, kwargs)
    if node.op == "call_method":
        return getattr(args[0], str(node.target))(*args[1:], **kwargs)
    return node.target(*args, **kwargs)  # type: ignore[operator]


def _as_meta(t: torch.Tensor) -> torch.Tensor:
    return t if t.device.type == "meta" else t.to("meta")


def _plain(value: Any) -> Any:
    """Sizes as Python ints (torch.Size is a tuple of them); anything else is not a size."""
    if isinstance(value, torch.Size):
        return tuple(value)
    if isinstance(value, (bool, int, float)) or (isinstance(value, tuple) and all(isinstance(v, int) for v in value)):
        return value
    raise Unknown(type(value).__name__)


def condition_frame(frame: Any) -> Any:
    """The frame whose code asked for the value: the first one outside the proxy's code."""
    while frame is not None and os.path.realpath(frame.f_code.co_filename).startswith(_PROXY_CODE):
        frame = frame.f_back
    return frame


def where(frame: Any, source: SourceLine | None) -> str:
    """`model.py:33 in forward \\`assert t <= 64\\``: the line that holds the condition, and the model's
    line that reached it when the condition is in library code (torch's own asserts)."""
    file, line = (frame.f_code.co_filename, frame.f_lineno) if frame is not None else (None, None)
    text = linecache.getline(file, line).strip() if file else ""
    code = f" `{text}`" if text else ""
    if source is not None and (file, line) == (source.file, source.line):
        return f"{source}{code}"
    reached = f" (reached from {source})" if source is not None else ""
    at = f"{os.path.basename(file)}:{line}{code}" if file else "a condition on sizes"
    return f"{at}{reached}"


_KEEP = ("graphsplit traced only the branch the example inputs took; keep every call's sizes as they were "
         "(a condition on the batch size: pick --microbatches and --dp so each micro-batch keeps it), or "
         "branch without Python (torch.where)")


def check_message(place: str, decided: bool) -> str:
    """What the recorded check of a condition says when a later call decides it the other way."""
    return f"{place} was {decided} on the example inputs and is {not decided} here: {_KEEP}"


def length_message(place: str, length: int) -> str:
    """What the recorded check of a `len()` says when a later call has another length."""
    return (f"{place} took len() = {length} on the example inputs and another length here: graphsplit traced "
            f"the model at that length; {_KEEP.split('; ', 1)[1]}")


def count_message(place: str, count: int) -> str:
    """What the recorded check of a size used as a count (`range(t)`) says when a later call has another."""
    return (f"{place} counted {count} on the example inputs and another count here: graphsplit traced the "
            f"loop {count} times; {_KEEP.split('; ', 1)[1]}")


_HOISTED_AT_MOST = 64  # ops of a size expression moved with its check (sizes of inputs take a few)


def hoist_checks(graph: fx.Graph) -> None:
    """Move each check that reads only the inputs' sizes (and its size expression) to just after the
    inputs. Where the model wrote it (`if b >= 2:` after the blocks), it would make the inputs live to a
    later pipeline stage only to be measured there; at the top it runs in stage 0, on the values stage 0
    has. A check that reads a parameter's size stays where it is: moved, it would clone that parameter
    into another stage."""
    placeholders = list(graph.find_nodes(op="placeholder"))
    if not placeholders:
        return
    order = {n: i for i, n in enumerate(graph.nodes)}
    anchor = placeholders[-1]
    hoisted: set[fx.Node] = set()  # with the placeholders, all that precedes `anchor`
    seen: set[Any] = set()
    for check in [n for n in graph.nodes if info(n).extra.get(DECIDED)]:
        expression: set[fx.Node] = set()
        stack = list(check.all_input_nodes)
        while stack:
            node = stack.pop()
            if node.op != "placeholder" and node not in expression:
                if node.op != "call_method" and node.op != "call_function" or len(expression) >= _HOISTED_AT_MOST:
                    break  # a size of a weight or of a computed tensor: checked where it is
                expression.add(node)
                stack.extend(node.all_input_nodes)
        else:
            key = _spelling(check)
            if key in seen:  # the same check in every block: once is enough
                _erase_with_unused_inputs(graph, check)
                continue
            seen.add(key)
            for node in sorted(expression - hoisted, key=order.__getitem__) + [check]:
                anchor.append(node)
                anchor = node
                hoisted.add(node)


def _spelling(node: fx.Node) -> Any:
    """What a node computes, as a hashable tree of its ops down to the placeholders and attributes."""
    if node.op in ("placeholder", "get_attr"):
        return (node.op, node.target)
    return (node.op, node.target, _hashable(fx.node.map_arg((node.args, tuple(node.kwargs.items())), _spelling)))


def _hashable(value: Any) -> Any:
    """Slices (`shape[:-1]`) are unhashable before Python 3.12: spelled as tuples."""
    if isinstance(value, slice):
        return ("slice", value.start, value.stop, value.step)
    if isinstance(value, tuple | list):
        return tuple(_hashable(v) for v in value)
    return value


def _erase_with_unused_inputs(graph: fx.Graph, node: fx.Node) -> None:
    inputs = node.all_input_nodes
    graph.erase_node(node)
    for used in inputs:
        if not used.users and used.op in ("call_method", "call_function"):
            _erase_with_unused_inputs(graph, used)


def check_export_ranges(gm: fx.GraphModule, ranges: dict[Any, Any]) -> int:
    """torch.export keeps what a condition on a symbolic size decided as that size's range
    (`if h.size(0) > 2:` leaves the batch dim in [3, inf]) and checks it in a guard function the
    flat graph does not keep: record each narrowed range of an input's size as checks in the graph,
    as the fx path does. Export's own floor of 2 (it specializes sizes 0 and 1) is no condition of
    the model's and is not checked. Returns how many checks were added."""
    import sympy
    from torch.utils._sympy.numbers import int_oo

    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    added = 0
    for ph in placeholders:
        val = ph.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for dim, size in enumerate(val.shape):
            expr = size.node.expr if isinstance(size, torch.SymInt) else None
            bounds = ranges.get(expr) if isinstance(expr, sympy.Symbol) else None
            if bounds is None:
                continue
            lower, upper = int(bounds.lower), (None if bounds.upper in (int_oo, sympy.oo) else int(bounds.upper))
            limits = [(operator.ge, lower)] if lower > 2 else []
            limits += [(operator.le, upper)] if upper is not None else []
            for compare, limit in limits:
                # after every placeholder: the stage code's signature is the placeholders, in order
                with gm.graph.inserting_after(placeholders[-1]):
                    got = gm.graph.call_function(torch.ops.aten.sym_size.int, (ph, dim))
                with gm.graph.inserting_after(got):
                    holds = gm.graph.call_function(compare, (got, limit))
                with gm.graph.inserting_after(holds):
                    check = gm.graph.call_function(torch._assert, (holds, (
                        f"input '{ph.name}' had a size {'>=' if compare is operator.ge else '<='} {limit} in dim "
                        f"{dim} when torch.export traced the model (a condition on that size) and not here: {_KEEP}")))
                info(check).extra[DECIDED] = True
                added += 1
    if added:
        gm.recompile()
    return added
