"""context_parallel: one sample's sequence cut across the cp ranks (ops/context_parallel.py), for models whose
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
the pipeline split; rewrite.py checks the sequence's mixers first (`check_sequence_mixers`) and
analyzes the graph at one rank's shard of the sequence.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch.fx as fx

from ..errors import GraphsplitError
from ..ir.meta import TensorSpec, info, module_path
from ..ir.op_kinds import calls
from ..ir.walk import reachable, users
from ..ops.context_parallel import CP_COMM_ATTR, CPComm, cp_attention, cp_positions, cp_take
from .attention_form import SDPA, SDPA_ARGS
from .manager import PassInput, PassResults


def check_masks(gm: fx.GraphModule) -> None:
    """Refuse an attention call left with a mask (one computed from the inputs' values, a padding mask:
    attention_form turned the ones built from sizes alone into is_causal): context parallelism computes
    only the causal mask, by global position."""
    for node in gm.graph.nodes:
        if calls(node, SDPA):
            kwargs = dict(zip(SDPA_ARGS, node.args[3:]), **node.kwargs)
            if isinstance(kwargs.get("attn_mask"), fx.Node):
                source = info(node).source or info(kwargs["attn_mask"]).source
                raise GraphsplitError(f"--cp: the attention call{f' at {source}' if source else ''} takes a mask computed "
                                      "from the inputs (a padding mask such as attention_mask); context parallelism "
                                      "computes only the causal mask, by position: give inputs without a mask (packed "
                                      "sequences) or drop --cp")


def check_sequence_mixers(gm: fx.GraphModule, mixers: Sequence[tuple[str, str]]) -> None:
    """Refuse a sequence mixed by any node but an attention call: (graph node, why) pairs from
    batch discovery for the sequence dim; "" as the node is the loss (a mean over tokens: fine)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    attention = any(name in nodes and calls(nodes[name], SDPA) for name, _ in mixers)
    for name, why in mixers:
        if name == "" or name not in nodes or calls(nodes[name], SDPA):  # the loss; a causal mask's build, removed
            continue
        node = nodes[name]
        module = info(node).module or module_path(node)
        source = info(node).source
        where = f"{why.split(' at ')[0]} in module {module or '<root>'}{f' at {source}' if source else ''}"
        if not attention:  # the model calls no SDPA: the dim a position table lines up with, named
            raise GraphsplitError(f"--cp: no F.scaled_dot_product_attention call mixes the inputs' dims (the one "
                                  f"context parallelism would cut is mixed: {where}); it gathers keys and values "
                                  "at attention calls only; drop --cp")
        raise GraphsplitError(f"--cp: the sequence is mixed outside attention ({where}); context parallelism cuts "
                              "only sequences that attention calls alone mix; drop --cp")


def _size_read(node: object) -> tuple[fx.Node, int] | None:
    """(tensor, dim) when `node` reads one size of a tensor: `x.size(1)`, `x.size()[1]`, `x.shape[1]`,
    torch.export's `sym_size(x, 1)`."""
    if not isinstance(node, fx.Node) or node.op not in ("call_method", "call_function"):
        return None
    if calls(node, "size", "sym_size") and len(node.args) == 2 and isinstance(node.args[1], int):
        return node.args[0], node.args[1]
    if node.target is operator.getitem and isinstance(node.args[1], int) and isinstance(node.args[0], fx.Node):
        base = node.args[0]
        whole = (base.op == "call_method" and base.target == "size" and len(base.args) == 1) or \
            (base.op == "call_function" and base.target is getattr and base.args[1] == "shape")
        return (base.args[0], node.args[1]) if whole else None
    return None


def _sequence_length(node: object, length: int) -> bool:
    """A number read as a tensor's size that is the sequence's `length` (the graph analyzed at the
    whole sequence)."""
    read = _size_read(node)
    spec = info(read[0]).tensor if read is not None else None
    return spec is not None and -len(spec.shape) <= read[1] < len(spec.shape) and int(spec.shape[read[1]]) == length


def _live(node: fx.Node) -> bool:
    """Whether `node`'s value reaches the graph's output (a build whose result nothing reads, left by
    a mask put in SDPA's form, does not)."""
    return any(x.op == "output" for x in reachable([node], users))


def _reads_a_size(node: object) -> bool:
    """Whether a number is computed from a tensor's size (through arithmetic on numbers)."""
    if not isinstance(node, fx.Node):
        return False
    return any(_size_read(x) is not None or calls(x, "size")
               for x in reachable([node], lambda x: x.all_input_nodes if info(x).value != "tensor" else ()))


_CASTS = ("to", "type_as", "_to_copy")


@dataclass(frozen=True)
class Expansion:
    """A grouped-query expansion of a key or value that only its attention call reads: `repeats`
    copies of each head, made from `source` ([batch, kv heads, sequence, head dim]) by the nodes
    `made` (last first), maybe cast to autocast's dtype after (`cast`)."""

    repeats: int
    source: fx.Node
    made: tuple[fx.Node, ...]
    cast: fx.Node | None


def _through_whole_slices(node: fx.Node, made: list[fx.Node]) -> fx.Node:
    """`node` past torch.export's slices that keep a whole dim (`x[:, :, None]` traces to them)."""
    while calls(node, "slice") and len(node.users) == 1 and node.args[2:3] in ((0,), ()) \
            and (len(node.args) < 4 or (isinstance(node.args[3], int) and node.args[3] >= 2**62)):
        made.append(node)
        node = node.args[0]
    return node


def head_repeat(node: object, attention: fx.Node) -> Expansion | None:
    """A grouped-query expansion (module doc of `Expansion`): `x.repeat_interleave(r, dim=1)` (the
    Llama example), or HF's `repeat_kv`, `x[:, :, None].expand(b, h, r, s, d).reshape(b, h * r, s, d)`;
    None for anything else."""
    if not isinstance(node, fx.Node) or len(node.users) != 1:
        return None
    cast = None
    if calls(node, *_CASTS) and isinstance(node.args[0], fx.Node) and len(node.args[0].users) == 1:
        cast, node = node, node.args[0]
    spec = info(node).tensor
    if spec is None or len(spec.shape) != 4:
        return None
    if calls(node, "repeat_interleave"):
        args = dict(zip(("input", "repeats", "dim"), node.args), **node.kwargs)
        if isinstance(args.get("repeats"), int) and args.get("dim") in (1, -3) and isinstance(args["input"], fx.Node):
            return Expansion(args["repeats"], args["input"], (node,), cast)
        return None
    if not calls(node, "reshape", "view") or not isinstance(node.args[0], fx.Node):
        return None
    made = [node]
    expand = _through_whole_slices(node.args[0], made)
    shape = expand.args[1] if calls(expand, "expand") and len(expand.users) == 1 else None
    if not isinstance(shape, list | tuple) or len(shape) != 5 or not isinstance(shape[2], int):
        return None
    made.append(expand)
    unsqueeze = _through_whole_slices(expand.args[0], made)
    if not (calls(unsqueeze, "unsqueeze") and len(unsqueeze.users) == 1 and unsqueeze.args[1:2] == (2,)):
        return None
    made.append(unsqueeze)
    source = _through_whole_slices(unsqueeze.args[0], made)
    found = info(source).tensor
    if found is None or len(found.shape) != 4 or int(spec.shape[1]) != int(found.shape[1]) * shape[2]:
        return None
    return Expansion(shape[2], source, tuple(made), cast)


def _before_repeat(expansion: Expansion) -> fx.Node:
    """What the attention call takes in place of an expanded key or value: the value before the
    expansion (through its cast, which now reads it directly). The caller erases `made`."""
    source, cast = expansion.source, expansion.cast
    if cast is None:
        return source
    cast.args = (source, *cast.args[1:])
    before, after = info(source).tensor, info(cast).tensor
    if before is not None and after is not None:
        info(cast).tensor = TensorSpec(tuple(before.shape), after.dtype, after.requires_grad)
    return cast


def _comm(gm: fx.GraphModule, cp: int) -> fx.Node:
    """The graph's cp communicator node (added, unbound, on first use)."""
    found = next((n for n in gm.graph.nodes if n.op == "get_attr" and n.target == CP_COMM_ATTR), None)
    if found is not None:
        return found
    gm.add_submodule(CP_COMM_ATTR, CPComm(cp))
    with gm.graph.inserting_before(next(n for n in gm.graph.nodes if n.op != "placeholder")):
        comm = gm.graph.get_attr(CP_COMM_ATTR)
    info(comm).value = "scalar"
    return comm


def cut_positions(gm: fx.GraphModule, cp: int, length: int) -> None:
    """The values built from a position, rewritten to this rank's global positions: a table sliced to
    the sequence's `length` (`cp_take`), an arange of it (`cp_positions`). Runs before the analysis
    (rewrite.py), on a graph analyzed at the whole sequence: the graph then has the shard's shapes.
    An arange of another size read from the inputs is refused: its positions could not be placed."""
    comm = _comm(gm, cp)
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is operator.getitem and isinstance(node.args[0], fx.Node) and node.args[0].op == "get_attr":
            table, index = node.args
            index = index if isinstance(index, tuple) else (index,)
            cut = [(d, s.stop) for d, s in enumerate(index) if isinstance(s, slice) and s.start in (None, 0)
                   and s.step in (None, 1) and _sequence_length(s.stop, length)]
            if len(cut) == 1 and all(s == slice(None) for d, s in enumerate(index) if d != cut[0][0]):
                dim, stop = cut[0]
                node.target, node.args = cp_take, (table, dim, stop, comm)
        elif calls(node, "slice") and isinstance(node.args[0], fx.Node) \
                and node.args[0].op == "get_attr" and len(node.args) >= 4 and node.args[2] in (None, 0) \
                and node.args[4:] in ((), (1,)) and _sequence_length(node.args[3], length):  # export's table[:, :T]
            node.target, node.args = cp_take, (node.args[0], node.args[1], node.args[3], comm)
        elif calls(node, "arange") and node.args:
            if _sequence_length(node.args[-1], length) and len(node.args) in (1, 2) \
                    and (len(node.args) == 1 or node.args[0] == 0) and node.kwargs.get("step", 1) == 1:
                node.target, node.args = cp_positions, (node.args[-1], comm)
                node.kwargs = {k: v for k, v in node.kwargs.items() if k in ("device", "dtype")}
            elif _live(node) and any(_reads_a_size(a) for a in node.args):
                source = info(node).source
                raise GraphsplitError(f"--cp {cp}: an arange of a size read from the inputs"
                                      f"{f' at {source}' if source else ''} is not the sequence's positions from 0 "
                                      "graphsplit can place on each rank's shard; drop --cp")
    _refuse_positions_left(gm, cp, length)
    gm.graph.lint()
    gm.recompile()


def _refuse_positions_left(gm: fx.GraphModule, cp: int, length: int) -> None:
    """The safety net: a live value computed from sizes and buffers alone (no input's values, no
    weight) with a dim of the sequence's length, not made from the rank's positions, is one graphsplit
    did not recognize (a position table read another way, a mask built otherwise): each rank would
    compute it for positions 0.. of its shard, silently wrong. Refused naming its line."""
    params = {name for name, _ in gm.named_parameters()}
    free: dict[fx.Node, bool] = {}  # computed from sizes, buffers and constants alone
    placed: set[fx.Node] = set()  # made from this rank's positions
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            free[node] = False
        elif node.op == "get_attr":
            free[node] = str(node.target) not in params
        elif _size_read(node) is not None or calls(node, "size"):
            free[node] = True
        else:
            inputs = node.all_input_nodes
            free[node] = node.op in ("call_function", "call_method") and all(free.get(x, False) for x in inputs)
            if node.target in (cp_take, cp_positions) or any(x in placed for x in inputs):
                placed.add(node)
                continue
            spec = info(node).tensor
            if free[node] and node.op != "get_attr" and spec is not None and length in [int(d) for d in spec.shape] \
                    and _live(node):
                source = info(node).source
                raise GraphsplitError(
                    f"--cp {cp}: a value with a dim of the sequence's {length} tokens is built from sizes and buffers "
                    f"alone{f' at {source}' if source else ''} ({node.name}), not from this rank's positions: graphsplit "
                    "cannot place it on each rank's shard; drop --cp")


def context_parallel_rewrite(gm: fx.GraphModule, cp: int) -> fx.GraphModule:
    """The attention calls' rewrite in the module doc (the positions were cut before the analysis:
    `cut_positions`); the comm starts unbound (every call the model's own)."""
    graph = gm.graph
    comm = _comm(gm, cp)
    attention = 0
    for node in list(graph.nodes):
        if calls(node, SDPA):
            q, k, v, *rest = node.args
            kwargs = dict(zip(SDPA_ARGS, rest), **node.kwargs)
            ek, ev = head_repeat(k, node), head_repeat(v, node)
            made: tuple[fx.Node, ...] = ()
            if ek is not None and ev is not None and ek.repeats == ev.repeats:  # gather the heads, not their copies
                k, v, kwargs["kv_repeat"], made = _before_repeat(ek), _before_repeat(ev), ek.repeats, ek.made + ev.made
            node.target, node.args, node.kwargs = cp_attention, (q, k, v, comm), kwargs
            for copy in made:  # last first: each is read only by the one before
                graph.erase_node(copy)
            attention += 1
    if not attention:
        raise GraphsplitError("--cp: the model calls no F.scaled_dot_product_attention; context parallelism "
                              "gathers keys and values at its attention calls; drop --cp")
    graph.lint()
    gm.recompile()
    return gm


def context_parallel_pass(gm: fx.GraphModule, inp: PassInput, done: PassResults) -> tuple[fx.GraphModule, None]:
    """With --cp: `context_parallel_rewrite` (the checks on the sequence ran in rewrite.py)."""
    if inp.plan.cp == 1:
        return gm, None
    return context_parallel_rewrite(gm, inp.plan.cp), None
