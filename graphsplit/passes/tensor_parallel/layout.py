"""Layout reasoning for tensor parallelism: where a shard goes under views and indexing.

Pure functions over global shapes (from the meta analysis); no graph edits.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch.fx as fx

from ...ir.meta import info
from ...ir.sharding import Layout, Placement, Replicate, Shard
from ...plan import divisors
from .spellings import arg_of


def norm_dim(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


def layout_of(value: Any) -> Layout:
    """The layout decided for a value so far; anything undecided (or not a node) is whole."""
    found = info(value).sharding if isinstance(value, fx.Node) else None
    return found if isinstance(found, Placement) else Replicate()


def shape_of(node: Any) -> tuple[int, ...] | None:
    if isinstance(node, fx.Node):
        spec = info(node).tensor
        return tuple(int(s) for s in spec.shape) if spec is not None else None
    return None


def container_len(node: fx.Node) -> int:
    idx = [u.args[1] for u in node.users if u.op == "call_function" and u.target is operator.getitem and isinstance(u.args[1], int)]
    return (max(idx) + 1) if idx else 0


def round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def paddable(n: int, tp: int) -> bool:
    """Whether a dim of `n` tp does not divide is worth padding: every rank then holds real rows
    (an output of 1 feature, or 5 over tp 4, stays whole rather than ranks holding only padding)."""
    return n % tp != 0 and (tp - 1) * -(-n // tp) < n


def nearest_divisor(n: int, tp: int) -> int:
    return min(divisors(n), key=lambda d: (abs(d - tp), -d))


def view_shard_dim(in_shape: tuple[int, ...], out_shape: tuple[int, ...], d: int, tp: int) -> int | None:
    """The output dim that inherits input dim d's shard under a view, if the view keeps it local.

    The shard survives when an output dim e starts where input dim d starts (same
    product of the dims before) and tp divides it: each rank's block of d, with
    everything inside it, is then exactly a block of e.
    """
    prefix_in = 1
    for x in in_shape[:d]:
        prefix_in *= x
    prefix = 1
    for e, x in enumerate(out_shape):
        if prefix == prefix_in and x % tp == 0 and x > 1:
            inner_in = 1
            for y in in_shape[d:]:
                inner_in *= y
            inner_out = 1
            for y in out_shape[e:]:
                inner_out *= y
            if inner_in == inner_out and (x >= in_shape[d] or in_shape[d] % x == 0):
                # x < in[d]: the dim was split; its outer factor x carries the shard only if
                # each rank's block of d covers whole blocks of x
                if x >= in_shape[d] or (in_shape[d] // x) * x == in_shape[d] and (in_shape[d] // tp) % (in_shape[d] // x) == 0:
                    return e
        prefix *= x
        if prefix > prefix_in:
            break
    return None


def view_layout(in_shape: tuple[int, ...], out_shape: tuple[int, ...], have: Shard, tp: int) -> Shard | None:
    """Where a shard goes under a view, plain or of equal chunks, as the part of the flat index it
    holds: dim d is (outer, inner) with inner sharded (outer = the number of chunks, 1 if plain),
    inner's stride being the product of the dims after d. The view keeps it when one output dim
    holds inner's top part with each rank's block whole: that dim is sharded plainly if nothing
    else of it lies above inner, else as chunks, one per index above (DTensor's strided shard).
    `q.view(T, B * heads, hd)` of q sharded by heads gives chunks (heads,) * B on dim 1, and
    `view(B, heads, T, hd)` of that a plain shard of the heads again (nn.MultiheadAttention)."""
    if have.padded or (have.chunks and len(set(have.chunks)) != 1):
        return None
    if not have.chunks and (e := view_shard_dim(in_shape, out_shape, have.dim, tp)) is not None:
        return Shard(e)  # a plain block that stays a block of one output dim (not always a factor of it)
    outer = len(have.chunks) if have.chunks else 1
    if in_shape[have.dim] % outer:
        return None
    inner = in_shape[have.dim] // outer
    stride = math.prod(in_shape[have.dim + 1:])
    if inner % tp or math.prod(in_shape) != math.prod(out_shape):
        return None
    for e, n in enumerate(out_shape):
        below = math.prod(out_shape[e + 1:])  # the stride of dim e
        if stride >= below:  # inner lies inside dim e, with stride // below of e's lower part under it
            if stride % below or (below * n) % (stride * inner):
                continue
            top, part = below * n // (stride * inner), inner * (stride // below)
        elif stride * inner > below:  # inner's top part in dim e, its lower part in the dims after
            low = below // stride
            if below % stride or inner % low or (inner // low) % tp or n % (inner // low):
                continue
            top, part = n // (inner // low), inner // low
        else:
            continue
        return Shard(e) if top == 1 else Shard(e, (part,) * top)
    return None


def chunked_view_dim(in_shape: tuple[int, ...], out_shape: tuple[int, ...], d: int, tp: int) -> tuple[int, int] | None:
    """(k, d + 1) if the view splits the last dim d, and only it, into (k, n, head_dim): k fused
    chunks of n heads each, tp dividing n, where the view keeps no plain shard of d (ModernBERT's
    `qkv.view(B, T, 3, heads, head_dim)`). Sharded chunk by chunk, each rank's block of d is its
    heads of every chunk, and the view keeps a shard of the heads dim. A split into two dims
    (heads, head_dim) is never read as chunks: kv heads tp does not divide stay whole."""
    if d != len(in_shape) - 1 or len(out_shape) != len(in_shape) + 2 or tuple(out_shape[:d]) != tuple(in_shape[:d]):
        return None
    k, n, head_dim = out_shape[d:]
    if k < 2 or n % tp or k * n * head_dim != in_shape[d]:
        return None
    if view_shard_dim(in_shape, out_shape, d, tp) is not None:
        return None
    return k, d + 1


def split_heads(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> int:
    """How many heads a view splitting the last dim makes: (heads, head_dim) -> heads; a fused
    projection's (chunks, heads, head_dim), 2 or 3 chunks (kv, qkv) -> heads."""
    d = len(in_shape) - 1
    if len(out_shape) == len(in_shape) + 2 and out_shape[d] in (2, 3):
        return out_shape[d + 1]
    return out_shape[d] if len(out_shape) > d else 0


def view_keeps_dim(in_shape: tuple[int, ...], out_shape: tuple[int, ...], d: int) -> int | None:
    """The output dim that is input dim d unchanged under a view (same size, same products
    before and after it), if any: the only way a padded shard survives a view, since its
    blocks are not 1/tp of anything else."""
    before = 1
    for x in in_shape[:d]:
        before *= x
    prefix = 1
    for e, x in enumerate(out_shape):
        if prefix == before and x == in_shape[d]:
            return e
        prefix *= x
        if prefix > before:
            break
    return None


def moved_dim(node: fx.Node, name: str, dim: int, nd: int) -> int | None:
    """Where dim `dim` of `node`'s input (of `nd` dims) is in its output, for the ops that only move or
    add dims (`name`: the op's name, as `spellings.op_name_of` gives it); None for any other op."""
    if name in ("contiguous", "clone"):
        return dim
    if name == "unsqueeze":
        at = norm_dim(arg_of(node, 1, "dim"), nd + 1)
        return dim + 1 if at <= dim else dim
    if name == "squeeze" and isinstance(arg_of(node, 1, "dim"), int):
        at = norm_dim(arg_of(node, 1, "dim"), nd)
        return None if at == dim else dim - 1 if at < dim else dim
    if name == "t":
        return 1 - dim if nd == 2 else dim
    if name in ("transpose", "swapaxes", "swapdims"):
        a, b = norm_dim(arg_of(node, 1, "dim0"), nd), norm_dim(arg_of(node, 2, "dim1"), nd)
        return b if dim == a else a if dim == b else dim
    if name == "permute":
        dims = list(node.args[1]) if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)) \
            else list(node.args[1:]) or list(node.kwargs.get("dims", ()))
        return [norm_dim(x, nd) for x in dims].index(dim)
    return None


def index_shard_dim(index: Any, nd: int, d: int) -> int | None:
    """Where dim d goes under `tensor[index]`; None if the index touches it."""
    items = list(index) if isinstance(index, tuple) else [index]
    if any(isinstance(i, fx.Node) for i in items):
        return None
    n_ellipsis = sum(1 for i in items if i is Ellipsis)
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
    in_dim, out_dim = 0, 0
    for item in items:
        if item is Ellipsis:
            span = nd - consumed
            if in_dim <= d < in_dim + span:
                return out_dim + (d - in_dim)
            in_dim += span
            out_dim += span
        elif item is None:
            out_dim += 1
        elif isinstance(item, int):
            if in_dim == d:
                return None
            in_dim += 1
        elif isinstance(item, slice):
            if in_dim == d:
                return out_dim if item == slice(None) else None
            in_dim += 1
            out_dim += 1
        else:
            return None
    if n_ellipsis == 0 and d >= in_dim:
        return out_dim + (d - in_dim)
    return None


def einsum_letters(equation: str, ndims: list[int]) -> tuple[list[str], str] | None:
    """Each operand's dims as letters, and the output's, of `torch.einsum(equation, ...)` on operands of
    `ndims` dims: spaces dropped, an ellipsis spelled out as letters of its own aligned from the right (it
    broadcasts so), an implicit output (no `->`) the letters met once, sorted. None where the equation does
    not match the operands."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ndims):
        return None
    spare = [chr(c) for c in range(0x3B1, 0x3B1 + 24)]  # Greek letters: never an equation's own
    widest = 0
    letters = []
    for term, nd in zip(terms, ndims):
        if "..." in term:
            width = nd - (len(term) - 3)
            if width < 0:
                return None
            widest = max(widest, width)
            term = term.replace("...", "".join(spare[24 - width:]) if width else "")
        if len(term) != nd:
            return None
        letters.append(term)
    if not arrow:
        counts = "".join(letters)
        out = "".join(sorted(c for c in set(counts) if counts.count(c) == 1 and c not in spare))
        out = "".join(spare[24 - widest:]) + out if widest else out
    elif "..." in out:
        out = out.replace("...", "".join(spare[24 - widest:]) if widest else "")
    return letters, out
