"""Attention written out, found in a graph: what `--checkpoint attention` recomputes (Megatron-LM's
`--recompute-granularity selective`, Korthikanti et al. 2022, "Reducing Activation Recomputation").

A core is the run of ops from the scores' matmul to the matmul that weighs the values:
`softmax(q @ k^T * scale (+ mask | masked_fill), dim=-1)` (a dropout, a cast after it) `@ v`, as
nanoGPT, HF's eager attention and most research code write it. What it keeps for backward grows with
the square of the sequence (the scores, the probabilities, a dropout mask, each batch x heads x S x S)
while its FLOPs are a small part of a block's: recomputing it alone frees most of a long sequence's
activations for a few percent more compute. A fused `scaled_dot_product_attention` keeps no such square
(its output and a log-sum-exp per row), so it is no core here.

The program (passes/activation_checkpoint.py) and the planner (planner/recompute.py) both read the
cores from here, so what is priced is what is recomputed.
"""

from __future__ import annotations

import torch.fx as fx

from ..ir.meta import info
from ..ir.op_kinds import OpKind, calls

_UNPLACED = ("placeholder", "get_attr", "output")
# what the program and the planner say of `--checkpoint attention` on a model without written-out attention
NO_CORES = ("--checkpoint attention recomputes attention written out (softmax(q @ k^T) @ v), and this model has "
            "none (a fused scaled_dot_product_attention keeps no scores to free); use selective or blocks")
_STEPS = 8  # ops between a matmul and the softmax (scale, mask, cast), or after it (dropout, cast)


def _reads_a_parameter(node: object) -> bool:
    """Whether `node` is a parameter or buffer read, through views and casts of it (a weight written as
    `x @ self.w.t()`: a linear, not attention)."""
    for _ in range(_STEPS):
        if not isinstance(node, fx.Node):
            return False
        if node.op == "get_attr":
            return True
        tensors = [x for x in node.all_input_nodes if info(x).value == "tensor" or x.op == "get_attr"]
        if len(tensors) != 1:
            return False
        node = tensors[0]
    return False


def _scores(softmax: fx.Node) -> fx.Node | None:
    """The nearest matmul of two activations the softmax reads through scales, masks and casts (a mask may
    come first: HF's GPT-2 writes `torch.where(causal_mask, scores, min)`)."""
    frontier = [x for x in softmax.all_input_nodes if x.op not in _UNPLACED]
    seen: set[fx.Node] = set()
    for _ in range(_STEPS):
        found = [x for x in frontier if info(x).kind == OpKind.MATMUL
                 and not any(_reads_a_parameter(a) for a in x.args[:2])]
        if found:
            return found[0]
        seen.update(frontier)
        frontier = [x for node in frontier if info(node).kind != OpKind.MATMUL
                    for x in node.all_input_nodes if x.op not in _UNPLACED and x not in seen]
    return None


def _weighted(softmax: fx.Node) -> fx.Node | None:
    """The matmul that reads the probabilities as its first operand (after a dropout or a cast)."""
    node = softmax
    for _ in range(_STEPS):
        nexts = [u for u in node.users if u.op in ("call_function", "call_method", "call_module")
                 and info(u).kind != OpKind.ASSERT]  # torch.export's dtype checks read it too
        found = [u for u in nexts if info(u).kind == OpKind.MATMUL and u.args and u.args[0] is node]
        if found:
            return found[0]
        chain = [u for u in nexts if u.args and u.args[0] is node]
        if len(chain) != 1:
            return None
        node = chain[0]
    return None


def attention_cores(gm: fx.GraphModule) -> list[list[fx.Node]]:
    """Each written-out attention of `gm`, as the run of nodes (in graph order) from its scores' matmul
    to its weighted sum of the values, both included; cores do not overlap."""
    seq = [n for n in gm.graph.nodes if n.op not in _UNPLACED]
    pos = {n: i for i, n in enumerate(seq)}
    cores: list[list[fx.Node]] = []
    for node in seq:
        if not calls(node, "softmax", "_softmax"):
            continue
        first, last = _scores(node), _weighted(node)
        if first is None or last is None or pos[first] > pos[node] or pos[last] < pos[node]:
            continue
        if cores and pos[first] <= pos[cores[-1][-1]]:
            continue
        cores.append(seq[pos[first]:pos[last] + 1])
    return cores
