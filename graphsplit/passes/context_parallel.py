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
from typing import Any

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
    attention = any(name in nodes and nodes[name].target in SDPA for name, _ in mixers)
    for name, why in mixers:
        if name == "" or name not in nodes or nodes[name].target in SDPA:  # the loss; a causal mask's build, removed
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


_SIZES = ("size", getattr, torch.ops.aten.sym_size.int)  # reads of a size, not of values


def _mask_build(mask: fx.Node) -> list[fx.Node] | None:
    """The nodes computing an attention mask, in graph order, when they read the inputs' sizes alone
    (no input's values, no weight or buffer): the mask is then the same on every batch of this length."""
    found: set[fx.Node] = set()
    todo = [mask]
    while todo:
        node = todo.pop()
        if node in found:
            continue
        if node.op in ("get_attr", "call_module"):
            return None
        found.add(node)
        todo.extend(node.all_input_nodes)
    if any(n.op == "placeholder" and any(u in found and u.target not in _SIZES for u in n.users) for n in found):
        return None
    order = {n: i for i, n in enumerate(mask.graph.nodes)}
    return sorted(found, key=order.__getitem__)


def _evaluate(nodes: list[fx.Node], inputs: dict[str, torch.Tensor]) -> Any:
    """`nodes` (a mask's build, in order) run on CPU with the example inputs."""
    env: dict[fx.Node, Any] = {}

    def on_cpu(value: Any) -> Any:
        return torch.device("cpu") if isinstance(value, torch.device) else value

    for node in nodes:
        if node.op == "placeholder":
            env[node] = inputs[node.name]
            continue
        args = fx.node.map_aggregate(fx.node.map_arg(node.args, env.__getitem__), on_cpu)
        kwargs = fx.node.map_aggregate(fx.node.map_arg(node.kwargs, env.__getitem__), on_cpu)
        if node.op == "call_method":
            env[node] = getattr(args[0], str(node.target))(*args[1:], **kwargs)
        else:
            env[node] = node.target(*args, **kwargs)
    return env[nodes[-1]]


def causal_masks(gm: fx.GraphModule, names: Sequence[str], flat: Sequence[Any]) -> int:
    """Attention calls whose mask, built from the sizes alone (HF's `create_causal_mask` under
    torch.export: positions compared, packed sequences looked for), equals the causal mask on the
    example: rewritten to `is_causal=True` and the mask's build removed, so context parallelism cuts a
    causal attention (whose mask it computes by global position) and no op mixes the sequence to
    build it. A mask that is all true is dropped. Returns how many calls changed."""
    inputs = {n: t for n, t in zip(names, flat) if isinstance(t, torch.Tensor)}
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in SDPA:
            continue
        q, k, v, *rest = node.args
        kwargs = dict(zip(SDPA_ARGS, rest), **node.kwargs)
        mask = kwargs.get("attn_mask")
        if not isinstance(mask, fx.Node) or kwargs.get("is_causal"):
            continue
        built = _mask_build(mask)
        if built is None:
            continue
        try:
            with torch.no_grad():
                value = _evaluate(built, {n.name: inputs[n.name] for n in built if n.op == "placeholder"})
        except Exception:  # noqa: BLE001 - a build graphsplit cannot run on CPU: left as it is (and refused)
            continue
        if not isinstance(value, torch.Tensor) or value.dim() < 2 or value.shape[-1] != value.shape[-2]:
            continue
        allowed = value if value.dtype == torch.bool else value == 0
        if value.dtype != torch.bool and not bool(((value == 0) | (value == float("-inf"))
                                                   | (value <= torch.finfo(value.dtype).min / 2)).all()):
            continue  # an additive mask with other values (a bias): not a mask
        length = value.shape[-1]
        if bool(allowed.all()):
            kwargs.pop("attn_mask")
        elif bool((allowed == torch.ones(length, length, dtype=torch.bool).tril()).all()):
            kwargs.pop("attn_mask")
            kwargs["is_causal"] = True
        else:
            continue
        node.args, node.kwargs = (q, k, v), kwargs
        changed += 1
        for dead in reversed(built):  # the build, and the metadata asserts export left on it
            for user in list(dead.users):
                if not user.users and user.target is torch.ops.aten._assert_tensor_metadata.default:
                    gm.graph.erase_node(user)
            if not dead.users and dead.op != "placeholder":
                gm.graph.erase_node(dead)
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed


def _sequence_length(node: object) -> bool:
    """A number read as an input's size (`idx.size(1)`, `x.shape[1]`): the sequence's length."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_method" and node.target == "size":
        return True
    if node.op == "call_function" and node.target is torch.ops.aten.sym_size.int:  # torch.export's spelling
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


_ARANGE = (torch.arange, torch.ops.aten.arange.default, torch.ops.aten.arange.start)


def cut_positions(gm: fx.GraphModule, cp: int) -> None:
    """The values built from a position, rewritten to this rank's global positions: a table sliced to
    the sequence's length (`cp_take`), an arange of it (`cp_positions`). Runs before the analysis
    (compile.py): the graph then has the shard's shapes."""
    comm = _comm(gm, cp)
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is operator.getitem and isinstance(node.args[0], fx.Node) and node.args[0].op == "get_attr":
            table, index = node.args
            index = index if isinstance(index, tuple) else (index,)
            cut = [(d, s.stop) for d, s in enumerate(index) if isinstance(s, slice) and s.start in (None, 0)
                   and s.step in (None, 1) and _sequence_length(s.stop)]
            if len(cut) == 1 and all(s == slice(None) for d, s in enumerate(index) if d != cut[0][0]):
                dim, length = cut[0]
                node.target, node.args = cp_take, (table, dim, length, comm)
        elif node.target in _ARANGE and node.args and _sequence_length(node.args[-1]) and len(node.args) in (1, 2) \
                and (len(node.args) == 1 or node.args[0] == 0) and node.kwargs.get("step", 1) == 1:
            node.target, node.args = cp_positions, (node.args[-1], comm)
            node.kwargs = {k: v for k, v in node.kwargs.items() if k in ("device", "dtype")}
    gm.graph.lint()
    gm.recompile()


def context_parallel_rewrite(gm: fx.GraphModule, cp: int) -> fx.GraphModule:
    """The rewrite in the module doc; the comm starts unbound (every call the model's own)."""
    cut_positions(gm, cp)
    graph = gm.graph
    comm = _comm(gm, cp)
    attention = 0
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in SDPA:
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
