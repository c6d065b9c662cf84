"""Views and reshapes keep a shard when it stays a contiguous block of one output dim;
the size argument of that dim becomes the local size (a constant, a computed size or -1).
A padded shard (a vocabulary tp does not divide) survives only views that keep its dim
whole (`logits.view(-1, V)`); its local size is rounded up."""

from __future__ import annotations

from typing import Any

import torch.fx as fx

from ....errors import GraphsplitError
from ....ir.optable import OpKind
from ....ir.sharding import Replicate, Shard
from ..decision import Call, Decision, LayoutView, Local, register, replicated
from ..layout import chunked_view_dim, norm_dim, view_keeps_dim, view_shard_dim
from ..spellings import arg_of, describe, op_name_of, with_arg


@register(OpKind.VIEW)
def view_rule(node: fx.Node, view: LayoutView) -> Decision:
    src = node.args[0]
    have = view.layout(src)
    if have.is_partial():
        return Decision(Replicate(), inputs=((src, Replicate()),))
    in_shape, out_shape = view.shape(src), view.shape(node)
    if not isinstance(have, Shard):  # view_as / reshape_as a sharded value
        return replicated(node, view, f"{describe(node)} of a whole value as a sharded one")
    if have.padded:
        e = view_keeps_dim(in_shape, out_shape, have.dim)
    else:
        e = view_shard_dim(in_shape, out_shape, have.dim, view.tp)
    if have.chunks and len(set(have.chunks)) == 1:  # equal fused chunks viewed as (chunks, heads, ...)
        fused = chunked_view_dim(in_shape, out_shape, have.dim, view.tp)
        if fused is not None and fused[0] == len(have.chunks):
            heads = Shard(fused[1])  # each rank's heads of every chunk: a plain shard of the heads dim
            return Decision(heads, edit=local_view_sizes(node, view, heads))
    if e is not None and have.chunks and out_shape[e] != in_shape[have.dim]:
        e = None  # a fused dim keeps its chunk layout only if the view leaves it whole
    if e is None:
        return replicated(
            node, view, f"{describe(node)} {list(in_shape)} -> {list(out_shape)} moves the sharded dim {have.dim}"
        )
    return Decision(have.moved(e), edit=local_view_sizes(node, view, have.moved(e)))


def local_view_sizes(node: fx.Node, view: LayoutView, out: Shard) -> Call | None:
    """The view with the size argument of its sharded output dim made local (None: nothing to rewrite)."""
    e = out.dim
    name = op_name_of(node)
    if name in ("flatten", "squeeze", "unsqueeze"):
        return None
    if name in ("view_as", "reshape_as"):
        if view.layout(node.args[1]) != out:
            raise GraphsplitError(f"internal: {node.name} views as a differently sharded value")
        return None
    if name == "unflatten":
        dim = norm_dim(arg_of(node, 1, "dim"), len(view.shape(node.args[0])))
        sizes = list(arg_of(node, 2, "sizes"))
        sizes[e - dim] = Local(sizes[e - dim], out.padded)
        return Call(node.target, *with_arg(node, 2, "sizes", tuple(sizes)))
    # view/reshape: sizes either as varargs (Tensor.view(a, b, c)) or one list
    args: tuple[Any, ...] = tuple(node.args)
    kwargs = dict(node.kwargs)
    if len(args) == 2 and isinstance(args[1], (list, tuple)):
        sizes = list(args[1])
        sizes[e] = Local(sizes[e], out.padded)
        args = (args[0], type(args[1])(sizes))
    elif "shape" in kwargs or "size" in kwargs:
        key = "shape" if "shape" in kwargs else "size"
        sizes = list(kwargs[key])
        sizes[e] = Local(sizes[e], out.padded)
        kwargs[key] = tuple(sizes)
    else:
        args = (*args[: 1 + e], Local(args[1 + e], out.padded), *args[2 + e:])
    return Call(node.target, args, kwargs)
