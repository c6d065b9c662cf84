"""Sequence parallelism's column-parallel linears keep the tokens' shard, not the gathered input.

The walk leaves `gathered = gather_for_column(x, dim)` (all-gather forward, reduce-scatter of the
summed input gradients backward) before the column-parallel layers reading the tokens' shard `x`
`[b, s/tp, h]`. A linear reading `gathered` `[b, s, h]` would save it for its weight's gradient:
tp times the shard, kept until backward. `keep_shards_for_column_linears(gm)` makes each such
linear `column_linear_from_seq_shard(gathered, x, weight, bias, dim)` (ops/tp.py), which saves `x`
and all-gathers it again in backward for the weight's gradient (Megatron's
`LinearWithGradAccumulationAndAsyncCommunication` with `sequence_parallel=True`).

The gathered value stays shared: the linears reading one value (separate q, k, v; gate and up; a
parallel-residual block's attention and MLP) take it from one all-gather forward and send their
input gradients, summed by autograd, into one reduce-scatter; each re-gathers the shard for its
own weight's gradient in backward (as Megatron does per linear). They all save the same shard
tensor, kept once. Other consumers of the gathered value read the gathered tensor.
"""

from __future__ import annotations

import torch.fx as fx

from ...ir.meta import replace_node
from ...ir.op_kinds import OpKind, family
from ...ops import tp as tpops
from .spellings import linear_form


def keep_shards_for_column_linears(gm: fx.GraphModule) -> int:
    """Each linear `F.linear(gather_for_column(x, dim), w, b)` as
    `column_linear_from_seq_shard(gathered, x, w, b, dim)`; returns how many were rewritten."""
    rewritten = 0
    for gather in list(gm.graph.nodes):
        if gather.op != "call_function" or gather.target is not tpops.gather_for_column:
            continue
        x, dim, comm = gather.args
        for user in list(gather.users):
            form = linear_form(user) if family(user, gm) == OpKind.LINEAR else None
            # weight [out, in] (F.linear, aten.linear): mm / addmm read 2-D inputs, never the
            # gathered tokens [.., s, h] themselves
            if form is None or form[0] is not gather or form[3] != 0 or gather in (form[1], form[2]):
                continue
            replace_node(user, tpops.column_linear_from_seq_shard, (gather, x, form[1], form[2], dim, comm))
            rewritten += 1
    return rewritten
