"""context_parallel: one sample's sequence cut across the cp ranks (ops/cp.py), for models whose
sequence only attention mixes.

    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)   ->  cp_attention(q, k, v, self.cp_comm, is_causal=True)
    cos = self.rope_cos[:T]                                         ->  cp_take(self.rope_cos, 0, T, self.cp_comm)
    pos = torch.arange(T)                                           ->  cp_positions(T, self.cp_comm)

Each rank runs the graph on its shard of the sequence (chunks r and 2cp-1-r: the load-balanced
order), so every size the model reads of it (`T = idx.size(1)`) is the shard's; the values built
from a position (a table sliced to T, an arange of T) are rewritten to the rank's global positions,
and each attention call gathers the whole sequence's keys and values. Every other op must treat the
tokens one by one: batch discovery names each graph node that mixes a dim (Decision.mixers), and a
sequence mixed by anything but the attention calls is refused naming the node's module.

It runs after tensor parallelism (whose attention rule reads the SDPA calls) and autocast, before
the pipeline split; compile.py checks the sequence's mixers first (`check_sequence_mixers`) and
analyzes the graph at one rank's shard of the sequence.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..errors import GraphsplitError
from ..ir.meta import TensorSpec, info, module_path
from ..ops.cp import CP_COMM_ATTR, CPComm, cp_attention, cp_positions, cp_take
from .manager import PassInput, PassResults

SDPA_ARGS = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
# the spellings of SDPA in a graph: fx's (F.scaled_dot_product_attention) and torch.export's (ATen)
SDPA = (F.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention.default)


def check_sequence_mixers(gm: fx.GraphModule, mixers: Sequence[tuple[str, str]]) -> None:
    """Refuse a sequence mixed by any node but an attention call: (graph node, why) pairs from
    batch discovery for the sequence dim; "" as the node is the loss (a mean over tokens: fine)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    for name, why in mixers:
        node = nodes.get(name)
        if name == "" or (node is not None and node.target in SDPA):
            continue
        module = (info(node).module or module_path(node)) if node is not None else ""
        source = info(node).source if node is not None else None
        raise GraphsplitError(f"--cp: the sequence is mixed outside attention ({why.split(' at ')[0]} in module "
                              f"{module or '<root>'}{f' at {source}' if source else ''}); context parallelism cuts "
                              "only sequences that attention calls alone mix; drop --cp")


def _sequence_length(node: object) -> bool:
    """A number read as an input's size (`idx.size(1)`, `x.shape[1]`): the sequence's length."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_method" and node.target == "size":
        return True
    if node.op == "call_function" and node.target is operator.getitem:
        base = node.args[0]
        return isinstance(base, fx.Node) and base.op == "call_function" and base.target is getattr \
            and base.args[1] == "shape"
    return False


_CASTS = ("to", "type_as", torch.ops.aten._to_copy.default)


def head_repeat(node: object, attention: fx.Node) -> tuple[int, fx.Node, fx.Node | None] | None:
    """A grouped-query expansion `x.repeat_interleave(r, dim=1)` of a 4-dim [batch, heads, sequence,
    head dim] value that only `attention` reads, maybe cast to autocast's dtype after it: (r, the
    repeat_interleave node, the cast or None); None for anything else."""
    if not isinstance(node, fx.Node) or len(node.users) != 1:
        return None
    cast = None
    if node.op in ("call_method", "call_function") and node.target in _CASTS and isinstance(node.args[0], fx.Node) \
            and len(node.args[0].users) == 1:
        cast, node = node, node.args[0]
    if node.op not in ("call_method", "call_function") or node.target not in (
            "repeat_interleave", torch.repeat_interleave, torch.ops.aten.repeat_interleave.self_int):
        return None
    args = dict(zip(("input", "repeats", "dim"), node.args), **node.kwargs)
    spec = info(node).tensor
    if not isinstance(args.get("repeats"), int) or spec is None or len(spec.shape) != 4 or args.get("dim") not in (1, -3):
        return None
    return args["repeats"], node, cast


def _before_repeat(expansion: tuple[int, fx.Node, fx.Node | None]) -> fx.Node:
    """What the attention call takes in place of an expanded key or value: the value before the
    repeat (through its cast, which now reads it directly). The caller erases the repeat."""
    repeats, repeat, cast = expansion
    source = repeat.args[0] if repeat.args else repeat.kwargs["input"]
    if cast is None:
        return source
    cast.args = (source, *cast.args[1:])
    before, after = info(source).tensor, info(cast).tensor
    if before is not None and after is not None:
        info(cast).tensor = TensorSpec(tuple(before.shape), after.dtype, after.requires_grad)
    return cast


def context_parallel_rewrite(gm: fx.GraphModule, cp: int) -> fx.GraphModule:
    """The rewrite in the module doc; the comm starts unbound (every call the model's own)."""
    gm.add_submodule(CP_COMM_ATTR, CPComm(cp))
    graph = gm.graph
    with graph.inserting_before(next(n for n in graph.nodes if n.op != "placeholder")):
        comm = graph.get_attr(CP_COMM_ATTR)
    info(comm).value = "scalar"
    attention = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in SDPA:
            q, k, v, *rest = node.args
            kwargs = dict(zip(SDPA_ARGS, rest), **node.kwargs)
            ek, ev = head_repeat(k, node), head_repeat(v, node)
            repeats = (ek[1], ev[1]) if ek is not None and ev is not None and ek[0] == ev[0] else ()
            if repeats:  # gather the key/value heads, not their copies
                k, v, kwargs["kv_repeat"] = _before_repeat(ek), _before_repeat(ev), ek[0]
            node.target, node.args, node.kwargs = cp_attention, (q, k, v, comm), kwargs
            for repeat in repeats:
                graph.erase_node(repeat)
            attention += 1
        elif node.target is operator.getitem and isinstance(node.args[0], fx.Node) and node.args[0].op == "get_attr":
            table, index = node.args
            index = index if isinstance(index, tuple) else (index,)
            cut = [(d, s.stop) for d, s in enumerate(index) if isinstance(s, slice) and s.start in (None, 0)
                   and s.step in (None, 1) and _sequence_length(s.stop)]
            if len(cut) == 1 and all(s == slice(None) for d, s in enumerate(index) if d != cut[0][0]):
                dim, length = cut[0]
                node.target, node.args = cp_take, (table, dim, length, comm)
        elif node.target is torch.arange and _sequence_length(node.args[-1]) and len(node.args) in (1, 2) \
                and (len(node.args) == 1 or node.args[0] == 0) and node.kwargs.get("step", 1) == 1:
            node.target, node.args = cp_positions, (node.args[-1], comm)
            node.kwargs = {k: v for k, v in node.kwargs.items() if k in ("device", "dtype")}
    if not attention:
        raise GraphsplitError("--cp: the model calls no F.scaled_dot_product_attention; context parallelism "
                              "gathers keys and values at its attention calls; drop --cp")
    graph.lint()
    gm.recompile()
    return gm


def context_parallel_pass(gm: fx.GraphModule, inp: PassInput, done: PassResults) -> tuple[fx.GraphModule, None]:
    """With --cp: `context_parallel_rewrite` (the checks on the sequence ran in compile.py)."""
    if inp.plan.cp == 1:
        return gm, None
    return context_parallel_rewrite(gm, inp.plan.cp), None
