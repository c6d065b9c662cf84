"""Grouped linears (a mixture of experts' weights as one [E, ..] parameter): Megatron's
column and row parallelism applied to every expert at once, as to any MLP.

- input whole: column-parallel. Every expert's weight is sharded over its output
  features (chunk by chunk for a fused gate+up), the input read whole through f, the
  output S(-1).
- input S(-1): row-parallel. Every expert's weight is sharded over its input features,
  the partial products summed by g (one all-reduce for the whole expert layer).

The router (an ordinary linear whose logits feed softmax and top-k) is left whole by
the linear rule: its output meets a reduction before any row-parallel layer. Routing,
sorting and the scatter of the expert outputs back to tokens then run on whole values,
the same on every rank, so every rank sends the same tokens to the same experts.
"""

from __future__ import annotations

import torch.fx as fx

from ....ir.op_kinds import OpKind
from ....ir.sharding import Partial, Replicate, Shard
from ..decision import BROADCAST, Decision, LayoutView, Need, register, replicated
from ..lookahead import chunk_layout, column_stop
from ..spellings import describe, grouped_linear_form

R = Replicate()


@register(OpKind.GROUPED_LINEAR)
def grouped_linear(node: fx.Node, view: LayoutView) -> Decision:
    form = grouped_linear_form(node)
    if form is None:
        return replicated(node, view, f"{describe(node)} with a computed weight")
    x, w, out_dim, in_dim = form
    needs: list[tuple[fx.Node, Need]] = []
    have = view.layout(x)
    if have.is_partial():
        needs.append((x, R))
        have = R
    given = view.param_layout(w)
    if have.is_replicate():
        out_features = view.shape(w)[out_dim]
        chunks = chunk_layout(node, out_features, view.tp)
        if out_features % view.tp or any(c % view.tp for c in chunks or ()):
            return replicated(node, view, f"{describe(node)}: out features {out_features} (chunks {chunks}) "
                                          f"not divisible by tp={view.tp}")
        if (stop := column_stop(node, view.gm, view.tp, chunks)) is not None:
            return Decision(R, inputs=tuple(needs), reason=f"{describe(node)} left replicated: its sharded output "
                                                           f"would be gathered before any row-parallel layer: {stop}")
        want = Shard(out_dim, chunks)
        if given is not None and given != want:
            return replicated(node, view, f"{describe(node)}: its weight is already sharded as {given}")
        return Decision(Shard(len(view.shape(node)) - 1, chunks), inputs=(*needs, (x, BROADCAST)),
                        params=((w, want),))
    if isinstance(have, Shard) and have.dim == len(view.shape(x)) - 1 and not have.chunks:
        want = Shard(in_dim)
        if given is not None and given != want:
            return replicated(node, view, f"{describe(node)}: its weight is already sharded as {given}")
        return Decision(Partial(), params=((w, want),))
    return replicated(node, view, f"{describe(node)} with its input sharded as {have}")
