"""nn.Module -> torch.fx GraphModule with flat tensor inputs and flat outputs.

`torch.fx.symbolic_trace` first: it keeps the user's modules as `call_module`
nodes and is fast. When it fails (data-dependent control flow, HF-style code)
we fall back to `torch.export.export(..., strict=False)` (trace_export.py), whose
module is also a GraphModule, with ATen ops. Either way the result (traced_model.py) has:

- one placeholder per tensor input (non-tensor inputs are baked in as constants),
- an output node returning a flat tuple: the leaves of the model's output.

`Traced.flatten_inputs(args, kwargs)` turns a call's inputs into the flat
tensor tuple; `Traced.unflatten_output(leaves)` rebuilds the model's output.
Each node's `NodeInfo.source` is the line of the model's code that made it
(report.html shows it), and `NodeInfo.grad_enabled` the grad mode it ran in
(grad_regions.py).
"""

from __future__ import annotations

import contextlib
import inspect
import operator
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from importlib import import_module
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.fx._lazy_graph_module import _LazyGraphModule

from ..errors import GraphsplitError
from .autograd_functions import (
    FunctionCapture,
    kept_whole,
    recomputed_through,
    recomputing_traced_through,
)
from .devices import explicit_devices
from .eager_modules import (
    FAILED_IN,
    carry_written,
    drop_unread,
    failed_in,
    run_as_written,
    written_names,
)
from .grad_regions import (
    training_grad_mode,
)
from .meta import info
from .module_state import attributes_as_buffers, left_as_found
from .size_conditions import (
    SizeValues,
    Unknown,
    hoist_checks,
)
from .trace_decisions import DecidingTracer, Proxy
from .trace_export import quiet_torch_logs, trace_export
from .traced_model import Traced, bake, flat_output, mark_constants
from .user_source import (
    READS_VALUES,
    first_line,
    model_frame,
    raised_by_model,
    user_frame,
    user_source,
)
from .value_checks import kept_checks
from .var_args import named_only, takes_var_args

_SPECIALIZED = ("has been specialized",)
_FX_BRANCH = "symbolically traced variables cannot be used as inputs to control flow"


def trace_model(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    source: Path | None = None,
    leaves: frozenset[str] = frozenset(),
    watch: frozenset[str] = frozenset(),
    batch_dims: dict[int, Any] | None = None,
    buffers: Callable[[], Mapping[str, torch.Tensor]] | None = None,
) -> Traced:
    """Trace `model` called as `model(*args, **kwargs)`. `leaves`: submodules (qualified names) kept
    as one call_module node each, not traced through (fx only); `watch`: submodules whose calls are
    recorded in `Traced.calls`; `batch_dims`: id of an input tensor -> its batch dim (or a tuple of
    dims: the batch's and the sequence's), which export leaves symbolic (default: dim 0 of each);
    `buffers`: the model's buffers' real values where it is on meta, read only where a branch reads them."""
    try:
        with training_grad_mode(), left_as_found(model):
            return _trace_fx(model, args, kwargs, leaves, watch, buffers)
    except GraphsplitError:
        raise
    except Exception as fx_exc:  # any tracer failure: try the other tracer
        fx_error = fx_exc
    try:
        with quiet_torch_logs(), training_grad_mode(), left_as_found(model):
            traced = trace_export(model, args, kwargs, batch_dims)
        fx_at = user_frame(fx_error, source) or model_frame(fx_error)
        traced.reason = f"torch.export: torch.fx failed{f' at {fx_at}' if fx_at else ''}: {first_line(fx_error)}" + \
            traced.reason
        return traced
    except GraphsplitError:
        raise
    except Exception as export_exc:
        fx_further = False
        named = False
        if takes_var_args(model) and not isinstance(fx_error, GraphsplitError):
            # `forward(self, input_ids, ..., **kwargs)` called with named inputs only (minimind, many
            # HF-style models): fx on the named parameters alone, the var-args empty, as the call has them.
            # Tried last, so that no model export traces today changes tracer.
            try:
                with training_grad_mode(), left_as_found(model):
                    traced = _trace_fx(model, args, kwargs, leaves, watch, buffers, empty_var_args=True)
                traced.reason += f" (forward's *args/**kwargs empty, as called; torch.export said '{first_line(export_exc)}')"
                return traced
            except GraphsplitError:
                raise
            except Exception as named_exc:
                fx_error, named = named_exc, True
                # fx went past export's stop (a branch on the model's buffers) to a branch on the data: its line
                fx_further = first_line(named_exc).startswith(_FX_BRANCH) and user_frame(named_exc, source) is not None
        if failed_in(fx_error) is not None:  # fx failed in a submodule: that module runs as written
            def attempt(eager: frozenset[str]) -> Traced:
                with training_grad_mode(), left_as_found(model):
                    return _trace_fx(model, args, kwargs, leaves, watch, buffers, empty_var_args=named, eager=eager)

            with contextlib.suppress(Exception):
                return run_as_written(model, fx_error, attempt, lambda e: user_frame(e, source) or model_frame(e) or "")
        own = raised_by_model(export_exc)
        if own is not None:  # the model's own raise or assert, on these inputs: not a tracing limit
            raise GraphsplitError(
                f"{type(model).__name__}.forward raised {type(export_exc).__name__} at {own} on the example inputs: "
                f"'{first_line(export_exc)}'; make example_inputs() give what the model expects (or fix the model there)"
            ) from export_exc
        where = (user_frame(fx_error, source) if fx_further else None) or user_frame(export_exc, source) \
            or user_frame(fx_error, source) or model_frame(fx_error)
        at = f" at {where}" if where else ""
        said = f"torch.fx said '{first_line(fx_error)}' and torch.export said '{first_line(export_exc)}'"
        if any(word in first_line(export_exc) for word in READS_VALUES) \
                or first_line(fx_error).startswith(_FX_BRANCH):  # shapes or branches would follow the data
            raise GraphsplitError(
                f"cannot trace {type(model).__name__}{at}: it reads tensor values into Python ({said}), so "
                "what follows depends on the data and no one graph holds it; graphsplit needs shapes and "
                "control flow fixed by the input sizes: keep such values as tensors (torch.where, torch.cond, "
                "masks) or run this model unsplit"
            ) from export_exc
        raise GraphsplitError(
            f"cannot trace {type(model).__name__}{at}: {said}; "
            "make that code traceable: no Python control flow on tensor values (torch.where "
            "or torch.cond instead of if/else on a tensor)"
        ) from export_exc


def _trace_fx(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
              leaves: frozenset[str] = frozenset(), watch: frozenset[str] = frozenset(),
              buffers: Callable[[], Mapping[str, torch.Tensor]] | None = None, empty_var_args: bool = False,
              eager: frozenset[str] = frozenset()) -> Traced:
    """`empty_var_args`: trace forward's named parameters only, its *args/**kwargs empty (they must be);
    `eager`: modules run as written (eager_modules.py)."""
    sig = inspect.signature(model.forward)
    var = [k for k, p in sig.parameters.items() if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if var and not empty_var_args:
        raise TypeError("forward takes *args/**kwargs")
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    if any(bound.arguments.get(k) for k in var):
        raise TypeError(f"the call gives forward's {', '.join('*' + k for k in var)} values")
    for k in var:
        bound.arguments.pop(k, None)
    tensor_names = [k for k, v in bound.arguments.items() if isinstance(v, torch.Tensor)]
    concrete = {k: v for k, v in bound.arguments.items() if k not in tensor_names}
    for k, v in concrete.items():
        if pytree.tree_any(lambda x: isinstance(x, torch.Tensor), v):
            raise TypeError(f"input {k!r} is a container of tensors")
    # graph values, as buffers are; put back by left_as_found
    attributes = attributes_as_buffers(model, lambda owner, attr: owner in eager and attr in
                                       written_names(type(model.get_submodule(owner))))
    if "einops" in sys.modules:  # the model uses einops: its calls on proxies traced as torch ops
        import_module(".einops_proxies", __package__)
    tracer = _Tracer(leaves, watch, SizeValues(model, {k: bound.arguments[k] for k in tensor_names}, buffers), eager)
    if var:
        tracer.root_forward = named_only(type(model).forward, list(bound.arguments))
    graph = tracer.trace(model, concrete_args=concrete or None)
    drop_unread(graph)
    _bake_constants(graph, {name: concrete[name] for name in concrete})
    explicit_devices(graph)  # `torch.arange(T)`: on the rank's device, not the default one
    hoist_checks(graph)
    spec = flat_output(graph)
    if tracer.output_spec is not None and tracer.output_spec.num_leaves == spec.num_leaves:
        spec = tracer.output_spec
    # Python code is generated on the first call, not here: the planner reads the graph of a deep
    # model and never runs it whole (0.4-0.6 s of a 405B's 2 s trace is that code)
    gm = _LazyGraphModule(model, graph, class_name=type(model).__name__)
    mark_constants(gm, model, frozenset(attributes))  # no weights: the program carries their values
    names = [n.target for n in graph.nodes if n.op == "placeholder"]
    if names != tensor_names:
        raise TypeError(f"unexpected placeholders {names}")

    def flatten(call_args: tuple[Any, ...], call_kwargs: dict[str, Any]) -> list[torch.Tensor]:
        b = sig.bind(*call_args, **call_kwargs)
        b.apply_defaults()
        return [b.arguments[k] for k in tensor_names]

    places = "; ".join(dict.fromkeys(tracer.conditions))  # a block's condition once, not once per block
    decided = f" (sizes decided on the example inputs: {places})" if places else ""
    decided += kept_whole(tracer.functions.kept if tracer.functions is not None else [])
    decided += recomputed_through(tracer.recomputed)
    decided += kept_checks(tracer.value_checks)
    if tracer.state_branches:
        places = "; ".join(dict.fromkeys(tracer.state_branches))
        decided += f" (branches on the model's buffers taken as the constructor left them, checked on every call: {places})"
    return Traced(gm, "fx", list(tensor_names), spec, flatten, tracer.calls, f"torch.fx{decided}")


def _no_state_rebound(root: nn.Module) -> None:
    """Raise where forward rebound a module's buffer to a value it computed (`self.calls += 1`,
    performer-pytorch's redraw counter): torch.fx records no such write (the graph would drop it,
    and the GraphModule would hold the proxy), where torch.export keeps it as the buffer's update."""
    for path, module in root.named_modules():
        # a registered buffer only: a plain attribute (a causal mask cached from sizes) is traced as read
        for name, value in module._buffers.items():
            if isinstance(value, fx.Proxy):
                where = f"{path}.{name}" if path else name
                raise TypeError(f"forward rebinds the module attribute {where!r} to a value it computes")


def _as_nodes(value: Any) -> Any:
    return pytree.tree_map_only(fx.Proxy, lambda p: p.node, value)


class _Tracer(DecidingTracer):
    # Buffers become graph values, so `self.rope_cos[:T]` with a traced T is traceable.
    proxy_buffer_attributes = True

    def __init__(self, leaves: frozenset[str] = frozenset(), watch: frozenset[str] = frozenset(),
                 sizes: SizeValues | None = None, eager: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.leaves = leaves | eager
        self.eager = eager
        self.watch = watch
        self.calls: dict[str, tuple[Any, Any, Any]] = {}
        self.sizes = sizes
        self.conditions: list[str] = []  # where each decided condition is (size_conditions.py)
        self.functions: FunctionCapture | None = None  # the user's autograd Functions, kept whole
        self.recomputed: list[str] = []  # the checkpointing Functions traced through (autograd_functions.py)
        self.value_checks: list[str] = []  # where each check on tensor values is (value_checks.py)
        self.state_branches: list[str] = []  # where each branch on the model's own buffers is
        self.root_forward: Callable[..., Any] | None = None  # forward without its *args/**kwargs (_named_only)
        self.output_spec: pytree.TreeSpec | None = None  # the tree forward returned, its own types kept
        # while a size is evaluated on meta tensors (SizeValues), modules run plainly: no node is made
        self._untraced = False
        if sizes is not None:
            sizes.untraced = self.untraced

    @contextlib.contextmanager
    def untraced(self) -> Iterator[None]:
        was, self._untraced = self._untraced, True
        try:
            yield
        finally:
            self._untraced = was

    def create_args_for_root(self, root_fn: Callable[..., Any], is_module: bool,
                             concrete_args: Any = None) -> tuple[Any, list[Any]]:
        fn, args = super().create_args_for_root(self.root_forward or root_fn, is_module, concrete_args)

        def keeping_output_type(*a: Any) -> Any:
            # fx turns a dict subclass it returns (HF's ModelOutput) into a plain dict: keep its tree
            out = fn(*a)
            self.output_spec = pytree.tree_flatten(out)[1]
            return out

        return keeping_output_type, args

    def call_module(self, m: nn.Module, forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._untraced or self._made_in_forward(m):
            return forward(*args, **kwargs)
        try:
            out = super().call_module(m, forward, args, kwargs)
        except Exception as exc:
            if not hasattr(exc, FAILED_IN):  # the innermost module fx failed in (eager_modules.py)
                with contextlib.suppress(AttributeError):
                    setattr(exc, FAILED_IN, self.path_of_module(m))
            raise
        if self.eager and (path := self.path_of_module(m)) in self.eager:
            carry_written(self, m, path, out)
        if self.watch:
            name = self.path_of_module(m)
            if name in self.watch:
                self.calls[name] = (_as_nodes(args), _as_nodes(kwargs), _as_nodes(out))
        return out

    def _made_in_forward(self, m: nn.Module) -> bool:
        """A module forward makes and calls (litgpt's `nn.Identity()` as its head's clamp, `nn.Softmax(-1)(x)`):
        no submodule of the model, so fx cannot call it by name; with no weights of its own it is traced
        through. One with weights stays fx's error (they would be new each call)."""
        try:
            self.path_of_module(m)
            return False
        except NameError:
            return next(iter(m.parameters()), None) is None and next(iter(m.buffers()), None) is None

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return Proxy(node, self)

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        if isinstance(root, nn.Module):
            self._names = ({id(p): n for n, p in root.named_parameters()},
                           {id(b): n for n, b in root.named_buffers()})
        try:
            with recomputing_traced_through() as self.recomputed:
                graph = super().trace(root, concrete_args)
        finally:
            if self.functions is not None:
                self.functions.finish()
        if isinstance(root, nn.Module):
            _no_state_rebound(root)
        return graph

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        # fx finds an attribute's name by walking every parameter of the model at each access, which
        # is quadratic in depth (seconds for a 126-layer model): look it up in tables made once.
        # Anything they lack (registered during forward) goes the walk.
        if self._untraced:
            return attr_val
        if isinstance(attr_val, torch.Tensor) and hasattr(self, "_names"):
            params, buffers = self._names
            name = params.get(id(attr_val)) if isinstance(attr_val, nn.Parameter) else None
            if name is None and self.proxy_buffer_attributes:
                name = buffers.get(id(attr_val))
            if name is not None:
                if name not in parameter_proxy_cache:
                    factory = None
                    if self.param_shapes_constant:
                        def factory(node: fx.Node, n: str = name) -> fx.Proxy:
                            return fx.proxy.ParameterProxy(self, node, n, attr_val)
                    parameter_proxy_cache[name] = self.create_proxy("get_attr", name, (), {},
                                                                    proxy_factory_fn=factory)
                return parameter_proxy_cache[name]
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        if self._untraced:  # a size's evaluation reached a proxy: it stays unknown, the graph untouched
            raise Unknown("a traced value")
        node = super().create_node(*args, **kwargs)
        ni = info(node)
        # fx's own record_stack_traces formats the whole stack per node, and its text lands
        # in the stage code; the report needs only the user's line, found by a frame walk.
        ni.source = user_source(sys._getframe(1))
        # tracing runs the model's Python, so its no_grad / inference_mode regions are in force
        # here; the graph has no other record of them (passes/grad_mode.py keeps them)
        ni.grad_enabled = torch.is_grad_enabled()
        if self.functions is None or self.functions.graph is not self.graph:
            self.functions = FunctionCapture(self.create_proxy, self.graph)
        self.functions.on_node(node)
        return node

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name in self.leaves:
            return True
        # A leaf module's parameters are not graph values, so no pass could keep a no_grad
        # region from training them: trace through such modules there (their parameters
        # become get_attr nodes). Frozen or parameter-free modules stay leaves.
        if not torch.is_grad_enabled() and any(p.requires_grad for p in m.parameters()):
            return False
        return super().is_leaf_module(m, module_qualified_name)


def _bake_constants(graph: fx.Graph, constants: dict[str, Any]) -> None:
    """Replace placeholders of concrete (non-tensor) inputs by their values."""
    by_name: dict[str, Any] = {}
    for node in list(graph.nodes):
        if node.op == "placeholder":
            # symbolic_trace renames placeholders of concrete args (`mask` -> `mask_1`)
            # (one suffix: `input_pos_maxp1` -> `input_pos_maxp1_1`, whose own digits stay)
            base = re.sub(r"_\d+$", "", str(node.target)) if node.target not in constants else node.target
            name = node.target if node.target in constants else (base if base in constants else None)
            if name is not None:
                by_name[node.name] = constants[name]
    for node in list(graph.nodes):
        if node.op == "call_function" and (
            node.target is fx._symbolic_trace._assert_is_none
            or (node.target is torch._assert and any(s in str(node.args[1:]) for s in _SPECIALIZED))
        ):
            graph.erase_node(node)
    for node in list(graph.nodes):
        if node.op == "placeholder" and node.name in by_name:
            bake(node, by_name[node.name])
    # drop now-unused comparisons left from specialization checks, then the placeholders
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and not node.users and node.target is operator.eq:
            graph.erase_node(node)
    for node in list(graph.nodes):
        if node.op == "placeholder" and node.name in by_name:
            graph.erase_node(node)
