"""Ops that move dims around or pick parts: transpose, expand, repeat_interleave, split,
cat, stack, indexing. Each keeps a shard on a dim it does not touch."""

from __future__ import annotations

import torch.fx as fx

from ....errors import GraphsplitError
from ....ir.meta import info
from ....ir.op_kinds import OpKind
from ....ir.sharding import Replicate, Shard
from ..decision import Call, Decision, LayoutView, Local, register, replicated
from ..layout import container_len, index_shard_dim, moved_dim, norm_dim
from ..spellings import arg_of, describe, op_name_of, split_sizes, with_arg
from .pointwise import identity

R = Replicate()


@register(OpKind.TRANSPOSE)
def transpose(node: fx.Node, view: LayoutView) -> Decision:
    src = node.args[0]
    have = view.layout(src)
    if not isinstance(have, Shard):
        return identity(node, view)
    e = moved_dim(node, op_name_of(node), have.dim, len(view.shape(src)))
    if e is None:
        return replicated(node, view, f"{describe(node)} moves dims in a way no rule reads")
    return Decision(have.moved(e))


@register(OpKind.EXPAND)
def expand(node: fx.Node, view: LayoutView) -> Decision:
    """The sharded dim's size argument becomes the local size."""
    src = node.args[0]
    have = view.layout(src)
    if not isinstance(have, Shard):
        return identity(node, view)
    e = have.dim + len(view.shape(node)) - len(view.shape(src))
    if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)):
        sizes = list(node.args[1])
        sizes[e] = Local(sizes[e])
        args = (src, sizes)
    else:
        sizes = list(node.args[1:])
        sizes[e] = Local(sizes[e])
        args = (src, *sizes)
    return Decision(Shard(e, have.chunks), edit=Call(node.target, args, dict(node.kwargs)))


@register(OpKind.REPEAT_INTERLEAVE)
def repeat_interleave(node: fx.Node, view: LayoutView) -> Decision:
    """Repeating each element in place keeps a contiguous block per rank."""
    have = view.layout(node.args[0])
    if isinstance(have, Shard) and not have.chunks and isinstance(arg_of(node, 1, "repeats"), int) \
            and arg_of(node, 2, "dim") is not None:
        return Decision(Shard(have.dim))
    return replicated(node, view, f"{describe(node)} without a dim")


@register(OpKind.SPLIT)
def split(node: fx.Node, view: LayoutView) -> Decision:
    """Along another dim, every part keeps the shard; along a fused dim into exactly its
    chunks (QKV), each part is that chunk's local block and the sizes become local. unbind
    along another dim: every part keeps the shard, on the dim after the removed one moved down."""
    src = node.args[0]
    have = view.layout(src)
    n_out = container_len(node)
    nd = len(view.shape(src))
    if op_name_of(node) == "unbind":
        dim = norm_dim(arg_of(node, 1, "dim", 0), nd)
        if isinstance(have, Shard) and dim != have.dim and not have.chunks and not have.padded:
            return Decision((have.moved(have.dim - (have.dim > dim)),) * n_out)
        return replicated(node, view, f"{describe(node)} along the sharded dim")
    dim = norm_dim(arg_of(node, 2, "dim", 0), nd)
    if isinstance(have, Shard) and dim != have.dim:
        return Decision((have,) * n_out)
    sizes = split_sizes(node, view.shape(src)[dim])
    if isinstance(have, Shard) and have.chunks and sizes is not None and tuple(sizes) == have.chunks:
        edit = None
        if op_name_of(node) != "chunk":
            arg = node.args[1]
            local = arg // view.tp if isinstance(arg, int) else type(arg)(x // view.tp for x in arg)
            edit = Call(node.target, *with_arg(node, 1, "split_size_or_sections", local))
        return Decision((Shard(have.dim),) * n_out, edit=edit)
    for a in view.sharded_inputs(node):
        if isinstance(view.layout(a), Shard) and view.layout(a).chunks:
            raise GraphsplitError(f"internal: fused sharded value {a.name} split differently than its weight")
    return replicated(node, view, f"{describe(node)} splits along the sharded dim")


@register(OpKind.CAT)
def cat(node: fx.Node, view: LayoutView) -> Decision:
    shards = {view.layout(a) for a in node.all_input_nodes if info(a).value == "tensor"}
    dim = norm_dim(arg_of(node, 1, "dim", 0), len(view.shape(node)))
    if len(shards) == 1 and isinstance(only := next(iter(shards)), Shard) and only.dim != dim and not only.chunks:
        return Decision(only)
    return replicated(node, view, f"{describe(node)} concatenates along the sharded dim or mixes layouts")


@register(OpKind.STACK)
def stack(node: fx.Node, view: LayoutView) -> Decision:
    shards = {view.layout(a) for a in node.all_input_nodes if info(a).value == "tensor"}
    dim = norm_dim(arg_of(node, 1, "dim", 0), len(view.shape(node)))
    if len(shards) == 1 and isinstance(only := next(iter(shards)), Shard) and not only.chunks:
        return Decision(Shard(only.dim + (1 if only.dim >= dim else 0)))
    return replicated(node, view, f"{describe(node)} mixes layouts")


@register(OpKind.GETITEM)
def getitem(node: fx.Node, view: LayoutView) -> Decision:
    """An element of a container has its own layout; indexing a tensor keeps a shard on a
    dim the index leaves whole."""
    src, index = node.args[0], node.args[1]
    parent = info(src).sharding
    if isinstance(parent, (list, tuple)):
        return Decision(parent[index] if isinstance(index, int) and index < len(parent) else R)
    have = view.layout(src)
    if have.is_replicate() or info(node).value != "tensor":
        return Decision(R)
    e = index_shard_dim(index, len(view.shape(src)), have.dim) if isinstance(have, Shard) else None
    if e is None:
        return replicated(node, view, f"indexing {src.name} along its sharded dim")
    return Decision(have.moved(e))


@register(OpKind.SLICE)
def slice_rule(node: fx.Node, view: LayoutView) -> Decision:
    """aten.slice(x, dim, start, end, step) / aten.select(x, dim, index) along another dim."""
    src = node.args[0]
    have = view.layout(src)
    dim = norm_dim(arg_of(node, 1, "dim", 0), len(view.shape(src)))
    if not isinstance(have, Shard) or dim == have.dim:
        return replicated(node, view, f"{describe(node)} along the sharded dim")
    if op_name_of(node) == "select":
        return Decision(have.moved(have.dim - (1 if dim < have.dim else 0)))
    return Decision(have)

