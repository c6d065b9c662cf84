"""Views and reshapes keep a shard when each rank's block stays whole inside one output dim
(`layout.view_layout`: a plain block, or one block per chunk where the view merges the sharded
dim into the one before it); the size argument of that dim becomes the local size (a constant,
a computed size or -1).
A padded shard (a vocabulary tp does not divide) survives only views that keep its dim
whole (`logits.view(-1, V)`); its local size is rounded up."""

from __future__ import annotations

from typing import Any

import torch.fx as fx

from ....errors import GraphsplitError
from ....ir.op_kinds import OpKind
from ....ir.sharding import Replicate, Shard
from ..decision import Call, Decision, LayoutView, Local, register, replicated
from ..layout import norm_dim, view_keeps_dim, view_layout
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
    out = view_layout(in_shape, out_shape, have, view.tp)
    if out is None and (have.padded or have.chunks):
        # a padded dim, or chunks of unequal sizes (GQA's fused QKV), only where the view leaves the dim whole
        e = view_keeps_dim(in_shape, out_shape, have.dim)
        out = have.moved(e) if e is not None else None
    if out is None:
        return replicated(
            node, view, f"{describe(node)} {list(in_shape)} -> {list(out_shape)} moves the sharded dim {have.dim}"
        )
    return Decision(out, edit=local_view_sizes(node, view, out))


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
