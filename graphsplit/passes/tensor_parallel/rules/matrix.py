"""Linears and matmuls: Megatron's column- and row-parallel layers, found from the layout
of the input.

- input whole: column-parallel. The weight is sharded over output features (chunk by
  chunk when the output is split into fused chunks: QKV, gate+up), the input read
  whole through f, the output S(-1). An output layer whose features tp does not divide
  (an LM head over a vocabulary of 50257) is padded internally: its weight and bias
  S(0, size=V) with zero padding rows, its logits S(-1, size=V), whose padding
  columns the cross-entropy masks and a gather cuts off.
- input S(-1): row-parallel. The weight is sharded over input features, the partial
  products summed by g, the bias added once after the sum.
- input sharded on a leading dim: every rank applies the whole weight to its rows; under
  sequence parallelism, where the layer would be column-parallel, the input is gathered
  into it instead (all-gather forward, reduce-scatter backward).
"""

from __future__ import annotations

import operator
from dataclasses import replace

import torch.fx as fx

from ....errors import GraphsplitError
from ....ir.meta import info
from ....ir.op_kinds import OpKind
from ....ir.sharding import Partial, Replicate, Shard
from ..decision import BROADCAST, SELF, Call, Decision, LayoutView, Need, register, replicated
from ..layout import nearest_divisor, paddable
from ..lookahead import chunk_layout, column_stop, feeds_output, view_blocking_shard
from ..spellings import describe, linear_form, op_name_of, param_behind, without_bias

R = Replicate()


@register(OpKind.LINEAR)
def linear(node: fx.Node, view: LayoutView) -> Decision:
    form = linear_form(node)
    if form is None or param_behind(form[1]) is None:
        decision = matmul(node, view)  # a product with a computed weight
        if form is not None and decision.out == R and not decision.reason:  # say why a layer stays whole
            weight = form[1].name if isinstance(form[1], fx.Node) else repr(form[1])
            return replace(decision, reason=f"linear left replicated: its weight is computed in forward ({weight}), "
                                            "not read from a parameter")
        return decision
    x, w, b, out_dim, in_dim = form
    held = param_behind(w)  # the parameter itself, or the one `w` casts
    needs: list[tuple[fx.Node, Need]] = []
    have = view.layout(x)
    if have.is_partial():
        needs.append((x, R))
        have = R
    if have.is_replicate():
        return _column(node, view, needs)
    if have.dim == len(view.shape(x)) - 1:
        want = Shard(in_dim, have.chunks)
        given = view.param_layout(held)
        if given is not None and given != want:
            return replicated(node, view, f"linear weight already sharded as {given}")
        bias = Call(operator.add, (SELF, b)) if b is not None else None
        return Decision(Partial(), params=((held, want),), edit=Call(*without_bias(node)) if b is not None else None,
                        then=bias)
    if view.sequence_parallel and not have.chunks and not have.padded:
        # the tokens split over tp: gathered into a column-parallel layer where it is one (Megatron's
        # sequence parallelism), all-gather forward, reduce-scatter of the input gradient backward
        column = _column(node, view, list(needs))
        if not column.out.is_replicate():
            return column
    # sharded on a leading (batch-like) dim: every rank applies the whole weight to its rows
    if view.param_layout(held) is not None:
        needs.append((w, R))
    else:
        needs += [(w, BROADCAST)] + ([(b, BROADCAST)] if b is not None else [])
    return Decision(have, inputs=tuple(needs))  # chunks of a merged leading dim kept as they are


def _column(node: fx.Node, view: LayoutView, needs: list[tuple[fx.Node, Need]]) -> Decision:
    x, w, b, out_dim, _ = linear_form(node)
    tp = view.tp
    out_features = view.shape(w)[out_dim]
    chunks = chunk_layout(node, out_features, view.tp)
    ok = out_features % tp == 0 and (chunks is None or all(c % tp == 0 for c in chunks))
    # asked even when the features do not divide: a fused QKV whose chunks do not divide is
    # attention whose heads do not, and that is refused, not quietly left whole
    blocker = view_blocking_shard(node, tp)
    if blocker is not None:
        heads, why = blocker
        if heads and heads >= view.max_heads:  # the query heads must split; fewer kv heads may stay whole (0: a view
            # that is no split into heads, a merge: the linear stays whole)
            valid = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
            raise GraphsplitError(
                f"attention in '{info(node).module or '<root>'}': {heads} heads cannot be split over "
                f"tp={tp}; use tp={nearest_divisor(heads, tp)} (tp must divide the number of heads: {valid})"
            )
        return Decision(R, inputs=tuple(needs), reason=f"linear left replicated: {why}")
    # the output layer (the LM head) shards a vocabulary tp does not divide, padded
    pad = paddable(out_features, tp) and chunks is None and feeds_output(node, view.gm)
    stop = column_stop(node, view.gm, view.tp, chunks, out_features if pad and not ok else None) if ok or pad else None
    if stop is not None:
        return Decision(R, inputs=tuple(needs), reason="linear left replicated: its sharded output would be gathered "
                                                       f"before any row-parallel layer: {stop}")
    size = out_features if pad else None
    want = Shard(out_dim, chunks, size)
    given = view.param_layout(param_behind(w))
    bias = param_behind(b) if b is not None else None
    if (ok or pad) and (given is None or given == want) and (b is None or bias is not None):
        params = ((param_behind(w), want),) + (((bias, Shard(0, chunks, size)),) if bias is not None else ())
        return Decision(Shard(len(view.shape(node)) - 1, chunks, size), inputs=(*needs, (x, BROADCAST)), params=params)
    if out_features % tp:
        why = f"out features {out_features} not divisible by tp={tp}"
    elif b is not None and bias is None:
        why = f"its bias is computed in forward ({b.name if isinstance(b, fx.Node) else b!r}), not read from a parameter"
    elif not ok:
        why = f"its fused chunks of {', '.join(map(str, chunks or ()))} features are not divisible by tp={tp}"
    else:
        why = f"its weight is already sharded as {given}"
    if given is not None:
        needs.append((w, R))  # a weight sharded for another use (a tied embedding), gathered here
    return Decision(R, inputs=tuple(needs), reason=f"linear left replicated: {why}")


@register(OpKind.MATMUL)
def matmul(node: fx.Node, view: LayoutView) -> Decision:
    """Batch dims shard like pointwise ops; A[.., m, k] @ B[.., k, n] keeps a shard of m or
    n; a shard of k on both sides gives partial products, summed right after."""
    return _product(node, view, node.args[0], node.args[1])


@register(OpKind.ADD_MATMUL)
def add_matmul(node: fx.Node, view: LayoutView) -> Decision:
    """`baddbmm(input, a, b)`, `beta * input + alpha * (a @ b)` (Megatron's and BLOOM's attention
    scores, ALiBi's bias as `input`): the product keeps a shard as a matmul does, and `input` is added
    as a pointwise operand, taking the product's shard (chunk by chunk too: each rank's heads of a
    merged batch x heads dim), or read whole where it broadcasts along it. A partial product is not
    kept (`input` would be added once per rank), nor addbmm's (it sums over the batch): their sharded
    inputs are gathered."""
    if op_name_of(node) != "baddbmm" or len(node.args) < 3:
        if not view.sharded_inputs(node):
            return Decision(view.whole(node))
        return replicated(node, view, f"{describe(node)} is not known to keep a shard")
    added, a, b = node.args[0], node.args[1], node.args[2]
    if not isinstance(added, fx.Node) or not view.layout(added).is_replicate():
        return replicated(node, view, f"{describe(node)} of a sharded added tensor")
    product = _product(node, view, a, b)
    out = product.out
    if isinstance(out, Partial):
        return replicated(node, view, f"{describe(node)} of a partial product")
    if not isinstance(out, Shard):
        return product
    shape, nd = view.shape(added), len(view.shape(node))
    ad = out.dim - (nd - len(shape))
    need: Need = BROADCAST if ad < 0 or shape[ad] == 1 else out.moved(ad)
    return replace(product, inputs=(*product.inputs, (added, need)))


def _product(node: fx.Node, view: LayoutView, a: fx.Node, b: fx.Node) -> Decision:
    """`a @ b`'s decision (`matmul`), for the node computing it."""
    sa, sb = view.layout(a), view.layout(b)
    if sa.is_partial() or sb.is_partial():
        return replicated(node, view, "matmul of a partial sum")
    if sa.is_replicate() and sb.is_replicate():
        return Decision(R)
    ashape, bshape, oshape = view.shape(a), view.shape(b), view.shape(node)
    if len(ashape) < 2 or len(bshape) < 2:
        return replicated(node, view, f"{describe(node)} on vectors")
    na, nb, no = len(ashape), len(bshape), len(oshape)

    def out_of(x_dim: int, nx: int) -> int:  # batch dims aligned from the right of the batch part
        return x_dim + (no - nx)

    if _chunked(sa) or _chunked(sb):
        # both sharded alike, chunk by chunk, on one batch dim (each rank's heads of every example
        # in a merged batch x heads dim, fairseq's `bmm(q, k.transpose(1, 2))`): rank by rank
        if isinstance(sa, Shard) and sa == sb and sa.dim < na - 2 and sb.dim < nb - 2 \
                and out_of(sa.dim, na) == out_of(sb.dim, nb):
            return Decision(sa.moved(out_of(sa.dim, na)))
        return replicated(node, view, f"{describe(node)} of fused shards")

    def batch(other: fx.Node, e: int, n_other: int, other_shape: tuple[int, ...]) -> Decision:
        """Sharded on batch dim e: the other operand takes the same shard, or is read whole
        where it broadcasts along it."""
        if not view.layout(other).is_replicate():
            return replicated(node, view, f"{describe(node)} with operands sharded as {sa} and {sb}")
        od = e - (no - n_other)
        need = Shard(od) if od >= 0 and other_shape[od] != 1 else BROADCAST
        return Decision(Shard(e), inputs=((other, need),))

    if isinstance(sa, Shard) and sa.dim < na - 2:
        e = out_of(sa.dim, na)
        if isinstance(sb, Shard):
            if out_of(sb.dim, nb) != e:
                return replicated(node, view, "matmul of differently sharded batches")
            return Decision(Shard(e))
        return batch(b, e, nb, bshape)
    if isinstance(sb, Shard) and sb.dim < nb - 2:
        return batch(a, out_of(sb.dim, nb), na, ashape)
    if isinstance(sa, Shard) and sa.dim == na - 2 and sb.is_replicate():
        return Decision(Shard(no - 2), inputs=((b, BROADCAST),))
    if isinstance(sb, Shard) and sb.dim == nb - 1 and sa.is_replicate():
        return Decision(Shard(no - 1), inputs=((a, BROADCAST),))
    if isinstance(sa, Shard) and sa.dim == na - 1 and isinstance(sb, Shard) and sb.dim == nb - 2:
        return Decision(Partial())
    return replicated(node, view, f"{describe(node)} with operands sharded as {sa} and {sb}")


def _chunked(layout: object) -> bool:
    return isinstance(layout, Shard) and bool(layout.chunks)
