"""Grad-mode regions as the tracers see them.

torch.fx records no node for `with torch.no_grad():` and its kin; torch.export records
its regions as calls of a submodule. Both tracers run under `training_grad_mode()`, so the
regions the model opens are the only grad-disabled ones; the fx tracer records each op's
mode (its proxy records `y += 1` in place where that matters), export's regions are
inlined with their mode (`inline_grad_regions`) and the values it made in inference mode
marked (`mark_inference_mode`). passes/grad_mode.py keeps what they record.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from ..errors import GraphsplitError
from .meta import META_KEY, NodeInfo, info


@contextlib.contextmanager
def training_grad_mode() -> Iterator[None]:
    """Trace as training runs the model: grad enabled, outside inference mode, whatever the
    caller's mode; the regions the model itself opens are then the only grad-disabled ones."""
    with torch.inference_mode(False), torch.enable_grad():
        yield


class GradModeProxy(fx.Proxy):
    """fx's Proxy has no `__iadd__`, so Python runs `y += 1` as `y = y + 1`. That is the same
    computation, except under no_grad: there the in-place form leaves y needing a gradient and
    the other does not. In grad-disabled code the in-place form is recorded as written."""


def _in_place_operator(op: Any) -> Any:
    def method(self: GradModeProxy, other: Any) -> Any:
        if torch.is_grad_enabled():
            return NotImplemented  # Python falls back to the out-of-place operator
        return self.tracer.create_proxy("call_function", op, (self, other), {})

    return method


for _name in ("iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand", "ior", "ixor",
              "ilshift", "irshift", "imatmul"):
    setattr(GradModeProxy, f"__{_name}__", _in_place_operator(getattr(operator, _name)))


# torch.export records `with torch.no_grad():` (and enable_grad, set_grad_enabled) as
# wrap_with_set_grad_enabled(enabled, submodule, *operands) -> tuple
_SET_GRAD_REGION = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)


# torch.export records an autocast block the model opens (`@autocast('cuda', enabled=False)` around
# x-transformers' rotary embedding) as wrap_with_autocast(device, dtype, enabled, cache, submodule, *operands)
_AUTOCAST_REGION = getattr(torch.ops.higher_order, "wrap_with_autocast", None)
# NodeInfo.extra: the op lies in a block the model runs with autocast off (--autocast leaves it as written)
AUTOCAST_OFF = "autocast_off"
_OWN_MODE = "grad_mode_of_region"  # the grad mode set by the innermost grad region around the op


def inline_grad_regions(gm: fx.GraphModule) -> None:
    """Replace each of export's grad-mode regions by its nodes, each marked with the region's mode, and
    each region the model runs with autocast off by its nodes, each marked so (`AUTOCAST_OFF`).

    The region call runs correctly as it is, but as one opaque node no pass can split, shard
    or cost; inlined, the frozen ops are ordinary nodes and passes/grad_mode.py keeps their mode.
    An autocast region that turns autocast on stays one node (it runs as written).
    """
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if _SET_GRAD_REGION is not None and node.target is _SET_GRAD_REGION:
            enabled, sub_node, *operands = node.args

            def mark(inner: NodeInfo | None, enabled: bool = bool(enabled)) -> NodeInfo:
                own = inner is not None and inner.extra.get(_OWN_MODE, False)
                return NodeInfo(grad_enabled=inner.grad_enabled if own else enabled,
                                extra={**(inner.extra if inner is not None else {}), _OWN_MODE: True})
        elif _AUTOCAST_REGION is not None and node.target is _AUTOCAST_REGION and len(node.args) > 4 \
                and node.args[2] is False:
            sub_node, operands = node.args[4], list(node.args[5:])

            def mark(inner: NodeInfo | None) -> NodeInfo:
                return NodeInfo(grad_enabled=inner.grad_enabled if inner is not None else True,
                                extra={**(inner.extra if inner is not None else {}), AUTOCAST_OFF: True})
        else:
            continue
        _inline(gm, node, sub_node, operands, mark)
    gm.recompile()


def _inline(gm: fx.GraphModule, node: fx.Node, sub_node: fx.Node, operands: list[Any],
            mark: Any) -> None:
    """The region call `node` replaced by its submodule's nodes, each annotated by `mark(its own info)`."""
    graph = gm.graph
    sub = gm.get_submodule(str(sub_node.target))
    inline_grad_regions(sub)  # regions inside it first: their nodes keep their own mode
    env: dict[fx.Node, Any] = {}
    feed = iter(operands)
    results: Any = ()
    with graph.inserting_before(node):
        for n in sub.graph.nodes:
            if n.op == "placeholder":
                env[n] = next(feed)
            elif n.op == "output":
                results = fx.node.map_arg(n.args[0], env.__getitem__)
            elif n.op == "get_attr":
                env[n] = graph.get_attr(_adopt(gm, sub, str(n.target)))
            else:
                new = graph.node_copy(n, env.__getitem__)
                new.meta[META_KEY] = mark(n.meta.get(META_KEY))
                env[n] = new
    for user in list(node.users):
        if user.op != "call_function" or user.target is not operator.getitem:
            raise GraphsplitError(f"internal: export's region {node.name} is used whole by {user.name}")
        user.replace_all_uses_with(results[user.args[1]])
        graph.erase_node(user)
    graph.erase_node(node)
    if not sub_node.users:
        graph.erase_node(sub_node)
        if not any(n.op == "get_attr" and n.target == sub_node.target for n in graph.nodes):
            gm.delete_submodule(str(sub_node.target))


def _adopt(gm: fx.GraphModule, sub: nn.Module, target: str) -> str:
    """Give the parent a region's attribute (a lifted constant) under a fresh name."""
    owner_name, _, leaf = target.rpartition(".")
    owner = sub.get_submodule(owner_name) if owner_name else sub
    value = getattr(owner, leaf)
    i = 0
    while hasattr(gm, f"_grad_region_attr{i}"):
        i += 1
    name = f"_grad_region_attr{i}"
    if isinstance(value, nn.Module):
        gm.add_submodule(name, value)
    elif isinstance(value, nn.Parameter):
        gm.register_parameter(name, value)
    elif leaf in owner._buffers:
        gm.register_buffer(name, value, persistent=leaf not in owner._non_persistent_buffers_set)
    else:
        setattr(gm, name, value)
    return name


def mark_inference_mode(gm: fx.GraphModule, model_name: str) -> None:
    """export keeps no node for `torch.inference_mode()`, but the values it made there are
    inference tensors: their ops ran grad-disabled. A grad toggle export left in the graph
    as a plain call (not a region) cannot be kept per node: refused."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target in (torch._C._set_grad_enabled, torch.set_grad_enabled):
            where = info(node).source
            raise GraphsplitError(
                f"{model_name} switches grad mode at {where or 'an unknown line'} in a way graphsplit cannot "
                "keep per operation; write it as a `with torch.no_grad():` (or enable_grad) block"
            )
        values = [v for v in pytree.tree_leaves(node.meta.get("val")) if isinstance(v, torch.Tensor)]
        if values and all(v.is_inference() for v in values):
            info(node).grad_enabled = False
