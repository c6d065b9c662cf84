"""tensor_parallel: find Megatron's plan by reading the graph, and rewrite it.

One forward walk decides, for every tensor value, whether it is replicated
(`Replicate()`), sharded on a dim (`Shard(dim)`) or a partial sum (`Partial()`)
over the tp ranks, and rewrites the graph to compute this rank's part:

- a linear whose input is whole becomes column-parallel, its output S(-1); one
  whose input is S(-1) becomes row-parallel, summed by one all-reduce, its bias
  added after (rules/matrix.py);
- embeddings become vocab-parallel, or embedding-dim parallel (rules/embedding.py);
- elementwise ops, views, transposes, softmax and reductions over other dims,
  matmuls and attention over sharded heads keep the shard, with view and split
  sizes along the sharded dim made local (rules/*.py); size queries of sharded
  values answer the global size, so every computed size stays global;
- anything else gets its sharded inputs gathered first: correct, and reported
  with the reason (rules/fallback.py).

The parts: `decision.py` (what a rule reads and returns, the rule table),
`rules/` (one module per op-family group, pure functions), `walker.py` (applies
the decisions), `redistribute.py` (the one place that inserts a collective),
`layout.py` / `lookahead.py` / `spellings.py` (helpers the rules share).
"""

from .walker import LeftWhole, TensorParallelResult, parallelize_loss, tensor_parallel_pass

__all__ = ["LeftWhole", "TensorParallelResult", "parallelize_loss", "tensor_parallel_pass"]
