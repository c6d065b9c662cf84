"""The fallback tracer: torch.export (non-strict), for what torch.fx cannot trace (data-dependent code
such as MoE routing, HF's models). Its module is a GraphModule of ATen ops with flat placeholders; the
batch dim of every input is left symbolic where export allows, so the graph runs on micro-batches."""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.fx.graph import CodeGen

from .aliasing import buffer_writes_early
from .autograd_functions import functions_as_calls, functions_as_ops, kept_whole, recomputed_through
from .export_views import views_to_reshapes
from .grad_regions import inline_grad_regions, mark_inference_mode
from .meta import info
from .meta_kernels import missing_kernels
from .size_conditions import check_export_ranges
from .trace_device import as_if_on_cpu, back_to_meta, fake_inputs, on_meta
from .traced_model import Traced, bake, flat_output, mark_constants
from .user_source import source_from_stack_trace
from .value_checks import ExportChecks, checks_as_calls, kept_checks


@contextlib.contextmanager
def quiet_torch_logs() -> Iterator[None]:
    """torch.export logs (and prints to stderr) graph dumps and guard warnings on failure;
    our error message says what matters."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if name.startswith("torch")]
    loggers.append(logging.getLogger("torch"))
    saved = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, saved):
            lg.setLevel(level)


def _to_model_device(model: nn.Module, value: Any) -> Any:
    """Export traces with fake tensors; inputs only need to sit where the weights do."""
    first = next(iter((*model.parameters(), *model.buffers())), None)
    device = first.device if first is not None else torch.device("cpu")
    return pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), value)


def _batch_dynamic(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                   batch_dims: dict[int, Any] | None = None) -> dict[str, Any]:
    """dynamic_shapes for export: the batch dim of every tensor input left symbolic (`batch_dims`:
    by the tensor's id, a dim or a tuple of dims; default dim 0), so the graph runs on micro-batches
    (and, with the sequence's dim too, on a context-parallel rank's shard of the sequence)."""
    from torch.export import Dim

    def spec(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            return None
        dim = batch_dims.get(id(x), 0) if batch_dims is not None else 0
        dims = dim if isinstance(dim, tuple) else (dim,)  # the batch's and (context parallelism) the sequence's
        found = {d: Dim.AUTO for d in dims if d is not None and d < x.dim()}
        return found or None

    bound = inspect.signature(model.forward).bind(*args, **kwargs)
    return {name: pytree.tree_map(spec, value) for name, value in bound.arguments.items()}


def trace_export(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                  batch_dims: dict[int, Any] | None = None) -> Traced:

    with contextlib.ExitStack() as stack:
        if on_meta(model):  # device-dependent branches take the CPU's side: trace_device.py
            mode = stack.enter_context(as_if_on_cpu(model))
            meta_args, meta_kwargs = pytree.tree_map_only(
                torch.Tensor, functools.partial(fake_inputs, mode), (args, kwargs))
        else:
            meta_args, meta_kwargs = _to_model_device(model, (args, kwargs))
        recomputing = stack.enter_context(functions_as_ops())  # each of the model's own autograd Functions one op
        stack.enter_context(ExportChecks())  # the model's checks on values kept as checks
        stack.enter_context(missing_kernels())  # CTC's shapes (meta_kernels.py)
        try:
            ep = torch.export.export(
                model, meta_args, meta_kwargs, dynamic_shapes=_batch_dynamic(model, args, kwargs, batch_dims),
                strict=False
            )
        except Exception:  # a symbolic batch dim is a bonus: retry fully static
            ep = torch.export.export(model, meta_args, meta_kwargs, strict=False)
        gm = ep.module()
        kept = functions_as_calls(gm)  # ... and each op the Function's own call, its backward with it
        recomputed = list(recomputing)
        checks = checks_as_calls(gm)
        ranges = ep.range_constraints
    if on_meta(model):
        back_to_meta(gm, model)
    graph = gm.graph
    in_spec, out_spec = gm._in_spec, gm._out_spec
    graph._codegen = CodeGen()  # plain flat placeholders instead of pytree flattening
    for node in list(graph.nodes):
        if node.op == "call_module" and str(node.target).startswith("_guards"):
            graph.erase_node(node)
    flat_example = torch.fx._pytree.tree_flatten_spec((args, kwargs), in_spec)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    keep: list[int] = []
    for i, (ph, value) in enumerate(zip(placeholders, flat_example)):
        if isinstance(value, torch.Tensor):
            keep.append(i)
        else:  # a non-tensor input: export specialized the graph to it
            bake(ph, value)
            graph.erase_node(ph)
    flat_output(graph)  # already flat: the structure is export's out_spec
    inline_grad_regions(gm)
    views_to_reshapes(gm)  # views that relied on the trace device's strides: export_views.py
    buffer_writes_early(gm)  # a buffer's update where its value is made, not at the graph's end
    check_export_ranges(gm, ranges)
    mark_constants(gm, model)
    for node in graph.nodes:
        info(node).source = source_from_stack_trace(node.meta.get("stack_trace"))
    mark_inference_mode(gm, type(model).__name__)
    spec = out_spec
    for name in ("_guards_fn",):
        if hasattr(gm, name):
            delattr(gm, name)
    gm.recompile()
    names = [n.name for n in graph.nodes if n.op == "placeholder"]

    def flatten(call_args: tuple[Any, ...], call_kwargs: dict[str, Any]) -> list[torch.Tensor]:
        flat = torch.fx._pytree.tree_flatten_spec((call_args, call_kwargs), in_spec)
        return [flat[i] for i in keep]

    return Traced(gm, "export", names, spec, flatten, reason=kept_whole(kept) + recomputed_through(recomputed) + kept_checks(checks))
