"""Which dim of each input, target and output carries the batch: found, not assumed.

Every dim of every input tensor gets a label (an atom). The program runs once on meta tensors,
its loss too, under a dispatch mode that sees each ATen op and relates the labels of its inputs
and outputs, as einsum letters: dims an op lines up (broadcasting, a matmul's batch dims, an
embedding's indices and its output rows) join one class (union-find); a dim an op mixes across
(contracted by a matmul, normalized, softmaxed, convolved, sliced, reshaped apart, reduced while
the rest stays) is coupled; a dim that lines up with a weight's (a bias, a position table) is fixed.

The batch is the class no op couples and no weight fixes, found in the most inputs: cutting the
inputs along it commutes with every op up to the loss, so micro-batches and replicas compute what
the whole batch does. A seq-first transformer's batch is its dim 1 (attention couples dim 0); the
position ids of a diffusion transformer carry none (they go whole to every piece); a graph whose
nodes attend to each other has no batch (one micro-batch, no dp replicas). BatchNorm in training
couples the batch by its statistics, as every data-parallel trainer does: named, not refused.

Why ATen and not the fx graph: one spelling per op (nn.Linear, F.linear and x @ w.T all arrive as
mm or addmm), leaf modules (nn.TransformerEncoder) are seen inside, and the user's loss_fn runs
under the same mode without being traced.

atoms.py: the labels and their classes; mode.py: the dispatch mode; rules.py: the table of op name
-> rule, the rules in layout.py (ops that move or pick values) and compute.py (ops that mix them),
their helpers in lineup.py; decide.py: running the graph and the loss, and the decision.
"""

from .decide import Decision, discover, find_batch_dims

__all__ = ["Decision", "discover", "find_batch_dims"]
