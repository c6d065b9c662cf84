"""Decisions that look ahead in the graph before sharding a linear.

Is its output split into fused chunks? Would a view undo the shard (GQA kv
heads)? Does the shard reach a row-parallel layer before something needs it
whole? Does it feed the model's output (an LM head)?
"""

from __future__ import annotations

import torch.fx as fx

from ...ir.meta import info
from ...ir.op_kinds import RESHAPES, OpKind, family
from ...ir.sharding import Shard
from ...ir.walk import reachable
from .elementwise import elementwise_call
from .layout import (
    chunked_view_dim,
    einsum_letters,
    moved_dim,
    norm_dim,
    shape_of,
    split_heads,
    view_keeps_dim,
    view_layout,
    view_shard_dim,
)
from .spellings import (
    ROW_NORMS,
    einsum_operands,
    linear_form,
    op_name_of,
    split_sizes,
    vocab_parallel_loss,
)


def chunk_layout(linear: fx.Node, out_features: int, tp: int) -> tuple[int, ...] | None:
    """If the linear's output is split along its feature dim (fused QKV), the chunk sizes: by a
    split or chunk, or by a view into (chunks, heads, head_dim) (`chunked_view_dim`)."""
    users = list(linear.users)
    value = linear
    # look through views that keep the feature dim whole (HF Conv1D: addmm(...).view(B, T, 3C))
    while len(users) == 1 and op_name_of(users[0]) in RESHAPES and shape_of(users[0]) \
            and shape_of(users[0])[-1] == out_features:
        value = users[0]
        users = list(value.users)
    if len(users) != 1:
        return None
    (user,) = users
    if user.op in ("call_function", "call_method") and op_name_of(user) in _HEAD_VIEWS:
        shape, out = shape_of(value), shape_of(user)
        fused = chunked_view_dim(shape, out, len(shape) - 1, tp) if shape and out else None
        if fused is None and shape and out and _chunk_view(shape, out, tp) and _taken_apart(user, len(shape) - 1):
            fused = (out[-2], len(shape) - 1)
        return (out_features // fused[0],) * fused[0] if fused else None
    if user.op not in ("call_function", "call_method") or op_name_of(user) not in ("split", "chunk", "split_with_sizes"):
        return None
    shape = shape_of(value)
    nd = len(shape)
    dim = user.args[2] if len(user.args) > 2 else user.kwargs.get("dim", 0)
    if norm_dim(dim, nd) != nd - 1:
        return None
    sizes = split_sizes(user, out_features)
    return tuple(sizes) if sizes and len(sizes) > 1 else None


def view_blocking_shard(linear: fx.Node, tp: int) -> tuple[int, str] | None:
    """(heads, why) if sharding this linear's output features would be undone by the view
    right after it (GQA: 2 kv heads cannot split over tp=4), else None. Looks through a
    fused split."""
    shape = shape_of(linear)
    frontier = [(linear, shape)]
    for user in linear.users:
        if op_name_of(user) in ("split", "chunk", "split_with_sizes"):
            frontier = [(g, shape_of(g)) for g in user.users if shape_of(g) is not None]
            break
    for value, vshape in frontier:
        for user in value.users:
            if user.op in ("call_function", "call_method") and op_name_of(user) in _HEAD_VIEWS:
                out = shape_of(user)
                last = len(vshape) - 1
                if out is not None and view_shard_dim(vshape, out, last, tp) is None \
                        and view_keeps_dim(vshape, out, last) is None \
                        and chunked_view_dim(vshape, out, last, tp) is None \
                        and not (_chunk_view(vshape, out, tp) and _taken_apart(user, last)):  # a view keeping the features whole keeps the shard
                    heads = split_heads(vshape, out) if len(out) > len(vshape) else 0
                    return heads, f"its output is viewed as {list(out)}, which cannot be split over tp={tp}"
    return None


# the reshapes that can cut a dim into (chunks or heads, the rest)
_HEAD_VIEWS = ("view", "reshape", "_unsafe_view", "_reshape_alias", "_reshape_copy", "view_copy", "unflatten")


def _chunk_view(shape: tuple[int, ...], out: tuple[int, ...], tp: int) -> bool:
    """A view of the last dim into (2 or 3, m) that a plain shard does not survive: fused
    projections (nn.MultiheadAttention's in_proj: `unflatten(-1, (3, E))`), or heads tp does
    not divide, which only what follows tells apart (`_taken_apart`)."""
    d = len(shape) - 1
    return len(out) == len(shape) + 1 and tuple(out[:d]) == tuple(shape[:d]) and out[d] in (2, 3) \
        and out[d + 1] % tp == 0 and view_shard_dim(shape, out, d, tp) is None


def _taken_apart(node: fx.Node, dim: int, depth: int = 8) -> bool:
    """Whether every use of `node` picks dim `dim` apart index by index (select, unbind, an integer
    index) after ops that only move dims (unsqueeze, squeeze, transpose, permute, contiguous):
    the dim holds fused chunks (q, k, v), not heads, which attention keeps together."""
    if depth == 0 or not node.users:
        return False
    nd = len(shape_of(node) or ())
    for user in node.users:
        name = op_name_of(user)
        if name == "select" or name == "unbind":
            if norm_dim(user.args[1] if len(user.args) > 1 else user.kwargs.get("dim", 0), nd) != dim:
                return False
            continue
        if name == "getitem" and isinstance(user.args[1], int) and dim == 0:
            continue
        moved = moved_dim(user, name, dim, nd)
        if moved is None or not _taken_apart(user, moved, depth - 1):
            return False
    return True


def heads_views(graph: fx.Graph) -> list[int]:
    """Head counts of views that split a feature dim into (heads, head_dim)."""
    found = []
    for node in graph.nodes:
        if node.op in ("call_function", "call_method") and op_name_of(node) in _HEAD_VIEWS:
            src = node.args[0] if node.args else None
            ins, out = shape_of(src), shape_of(node)
            if ins and out and len(out) in (len(ins) + 1, len(ins) + 2) and out[: len(ins) - 1] == ins[:-1]:
                found.append(split_heads(ins, out))
    return found


def feeds_output(node: fx.Node, gm: fx.GraphModule) -> bool:
    """Whether `node`'s value reaches the model's output through layout-only ops (an LM head)."""
    return any(n.op == "output" for n in reachable(
        [node], lambda n: [u for u in n.users if u.op == "output" or family(u, gm).layout_only]))


def column_stop(linear: fx.Node, gm: fx.GraphModule, tp: int, chunks: tuple[int, ...] | None = None,
                size: int | None = None, limit: int = 500) -> str | None:
    """None if a column-parallel output would reach a row-parallel layer (or the model's output) before
    anything that needs it whole; else what stops it, for the report: the op that would gather it, named
    with its line in the model. The shard is followed as the rules would move it (views, transposes,
    broadcasts), so a norm or a reduction over other dims lets it through (QK-norm: each head's vector
    normalized on its rank). `chunks`: the linear's fused output (QKV), sharded chunk by chunk; `size`:
    its features' real size, padded (a vocabulary tp does not divide)."""
    out = shape_of(linear)
    if out is None:
        return "its output has no shape"
    todo, seen, reached = [(linear, Shard(len(out) - 1, chunks, size))], {linear}, False
    while todo and len(seen) < limit:
        n, have = todo.pop()
        for user in n.users:
            if user in seen:
                continue
            seen.add(user)
            if user.op == "output":
                reached = True
                continue
            if info(user).value == "scalar":  # a size query: read, not gathered
                todo.append((user, have))
                continue
            kind = family(user, gm)
            if kind == OpKind.LINEAR and linear_form(user) is not None or kind == OpKind.GROUPED_LINEAR:
                reached = True
                continue
            if kind == OpKind.CROSS_ENTROPY and user.args and user.args[0] is n and vocab_parallel_loss(user, have, shape_of(n)):
                reached = True  # a loss in the model's forward over logits sharded by vocabulary (nanoGPT's)
                continue
            after = _shard_after(user, kind, n, have, tp)
            if after is None:
                src = info(user).source
                return f"{op_name_of(user)} ({user.name}{f', {src}' if src is not None else ''}) needs it whole"
            todo.append((user, after))
    return None if reached else "it reaches no row-parallel layer"


def _shard_after(node: fx.Node, kind: OpKind, src: fx.Node, have: Shard, tp: int) -> Shard | None:
    """Where `have`, a shard of `src`, is in `node`'s output if `node` keeps it; None if it needs the
    value whole (the rules' own answers, in brief)."""
    ins, out = shape_of(src), shape_of(node)
    d = have.dim
    name = op_name_of(node)
    if kind == OpKind.SPLIT and ins is not None:  # along another dim the parts keep it; into its chunks, plain
        if name == "unbind":
            dim = norm_dim(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0), len(ins))
            return None if dim == d or have.chunks else have.moved(d - (dim < d))
        dim = norm_dim(node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0), len(ins))
        return have if dim != d else Shard(d) if have.chunks else None
    if kind == OpKind.FUNCTION:  # a user's autograd Function: one that computes elementwise keeps it
        return have if elementwise_call(node) else None
    if kind == OpKind.EINSUM:  # its letter, where the output names it (rules/einsum.py)
        found = einsum_operands(node)
        if found is None or have.padded or src not in found[1]:
            return None
        shapes = [shape_of(a) if isinstance(a, fx.Node) else None for a in found[1]]
        parsed = einsum_letters(found[0], [len(s) for s in shapes]) if all(s is not None for s in shapes) else None
        if parsed is None:
            return None
        letter = parsed[0][found[1].index(src)][have.dim]
        return Shard(parsed[1].index(letter), have.chunks) if letter in parsed[1] else None
    if ins is None or out is None:  # a container's element, or a value with no shape: as the rules keep it
        return have if kind.passes_shard else None
    if kind == OpKind.VIEW:
        found = view_layout(ins, out, have, tp)
        if found is None and (have.chunks or have.padded):  # only where the view keeps the dim whole
            e = view_keeps_dim(ins, out, d)
            found = have.moved(e) if e is not None else None
        if found is None and have.chunks and name in _HEAD_VIEWS:  # fused chunks viewed as (k, heads, hd)
            fused = chunked_view_dim(ins, out, d, tp)
            found = Shard(fused[1]) if fused is not None and fused[0] == len(have.chunks) else None
        return found
    if kind == OpKind.TRANSPOSE or name in ("contiguous", "clone"):
        e = moved_dim(node, name, d, len(ins))
        return have.moved(e) if e is not None else None
    if have.chunks or have.padded:
        return have if kind.passes_shard and len(out) == len(ins) else None
    if kind == OpKind.REDUCTION:
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        if dim is None:
            return None
        dims = {norm_dim(x, len(ins)) for x in (dim if isinstance(dim, (list, tuple)) else [dim])}
        keep = len(out) == len(ins)
        return None if d in dims else have if keep else have.moved(d - sum(1 for x in dims if x < d))
    if kind == OpKind.NORM:
        if node.op != "call_function" or node.target not in ROW_NORMS or node.args[0] is not src:
            return None
        normalized = node.args[1] if len(node.args) > 1 else node.kwargs.get("normalized_shape")
        n = len(normalized) if isinstance(normalized, (list, tuple)) else 1
        return have if d < len(ins) - n else None
    if name == "select":
        dim = norm_dim(node.args[1], len(ins))
        return None if dim == d else have.moved(d - (dim < d))
    if kind.passes_shard and len(out) >= len(ins):
        return have.moved(d + len(out) - len(ins))  # broadcast against more dims: aligned from the right
    return None
