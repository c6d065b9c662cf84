"""Expert parallelism for experts written as a Python loop over an `nn.ModuleList`.

mistral-inference's reference mixture of experts (and HF's Mixtral before grouped experts) calls each
expert on the rows it picked:

    for i, expert in enumerate(self.experts):
        batch_idx, nth_expert = torch.where(selected_experts == i)
        results[batch_idx] += weights[batch_idx, nth_expert, None] * expert(inputs[batch_idx])

torch.fx unrolls the loop: expert i is the nodes whose module is `experts.i` (its *region*), reading
one value from outside (its rows, `x_i`) and giving one (`y_i`). Where every region works row by row
(linears, pointwise ops, casts) and no region reads another's result, the rows can go to the rank
that holds their expert and come back, and the code around the loop (the router, the writes back)
does not notice. With E experts over `ep` ranks the pass rewrites the window from the first expert's
call to the last expert's rows as

    (...ancestors of every x_i, in their order...)
    sent = ep_send(self.ep_comm, layer, x_0, ..., x_{E-1})       # ops/ep.py: the all-to-alls
    z_j = expert j's region on sent[j]               for j < E / ep (the slots)
    back = ep_return(self.ep_comm, sent[E/ep], (x_0, ...), (z_0, ...))
    (...every other node of the window, reading back[i] for y_i...)

Slot j of expert-parallel rank r holds expert r * E / ep + j: the graph reads the slot's parameters
by expert j's names, and `ExpertLoop.slots` says which parameter each rank holds there
(`Program.on_ep_rank` renames them). The window's nodes change order only where no op writes in
place into storage the moved nodes read (checked: `Storages`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch.fx as fx
import torch.nn as nn

from ..errors import GraphsplitError
from ..ir.aliasing import Storages, written_inputs
from ..ir.meta import canonical_names, info, insert_node, module_path
from ..ir.op_kinds import OpKind, classify, family, op_name
from ..ops.ep import ep_return, ep_send

# what an expert's region may hold: each output row from the same input row alone
_ROWWISE = frozenset({OpKind.LINEAR, OpKind.POINTWISE, OpKind.IDENTITY, OpKind.CAST, OpKind.PARAM, OpKind.SHAPE,
                      OpKind.GETITEM, OpKind.SPLIT, OpKind.SLICE, OpKind.SOFTMAX, OpKind.VIEW})
_ROW_NORMS = (nn.LayerNorm, nn.RMSNorm)


@dataclass
class ExpertLoop:
    """One `nn.ModuleList` of experts the model calls one by one."""

    module: str  # the ModuleList's path
    regions: list[list[fx.Node]]  # expert i's nodes, in graph order
    rows: list[fx.Node]  # expert i's input rows
    outputs: list[fx.Node]  # expert i's result


def _lists_of(node: fx.Node) -> list[tuple[str, int]]:
    """(list path, index) for each `nn.ModuleList`/`Sequential` child the node's module (a weight read:
    its owner) lies in."""
    parts = (str(node.target) if node.op == "get_attr" else module_path(node)).split(".")
    return [(".".join(parts[:k]), int(parts[k])) for k in range(1, len(parts)) if parts[k].isdigit()]


def _candidates(gm: fx.GraphModule) -> dict[str, dict[int, list[fx.Node]]]:
    found: dict[str, dict[int, list[fx.Node]]] = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        for path, index in _lists_of(node):
            found.setdefault(path, {}).setdefault(index, []).append(node)
    return found


def _one_loop(gm: fx.GraphModule, path: str, by_index: dict[int, list[fx.Node]]) -> ExpertLoop | str:
    """The loop of experts `path` holds, or why it is none (a reason only said when no loop is found)."""
    experts = len(by_index)
    if experts < 2 or sorted(by_index) != list(range(experts)):
        return f"{path} is not called once per child"
    regions = [by_index[i] for i in range(experts)]
    rows: list[fx.Node] = []
    outputs: list[fx.Node] = []
    for i, region in enumerate(regions):
        inside = set(region)
        ins = {a for n in region for a in n.all_input_nodes if a not in inside and a.op != "get_attr"}
        outs = [n for n in region if any(u not in inside for u in n.users)]
        if len(ins) != 1 or len(outs) != 1:
            return f"{path}.{i} reads {len(ins)} values and gives {len(outs)} (an expert reads its rows, gives one)"
        rows.append(next(iter(ins)))
        outputs.append(outs[0])
    depends: dict[fx.Node, set[int]] = {}
    for node in gm.graph.nodes:  # which experts' results each value follows from
        got = set().union(*(depends.get(a, set()) for a in node.all_input_nodes))
        if node in outputs:
            got = got | {outputs.index(node)}
        depends[node] = got
    if any(depends[x] for x in rows):
        return f"{path}'s children run one after another (a child reads another's result), not side by side"
    for i, region in enumerate(regions):
        bad = next((n for n in region if not _row_by_row(gm, n)), None)
        if bad is not None:
            return f"{path}.{i}: {_at(bad)} does not work row by row (each row alone), so its rows cannot be moved"
        x, y = info(rows[i]).tensor, info(outputs[i]).tensor
        if x is None or y is None or not x.shape or not y.shape or x.shape[0] != y.shape[0]:
            return f"{path}.{i} does not give one row per row it reads"
    trailing = {tuple(info(x).tensor.shape[1:]) for x in rows}
    if len(trailing) != 1:
        return f"{path}'s experts read rows of different widths"
    signature = _signature(regions[0], rows[0], path, 0)
    if any(_signature(r, x, path, i) != signature for i, (r, x) in enumerate(zip(regions, rows))):
        return f"{path}'s experts do not all compute alike"
    return ExpertLoop(path, regions, rows, outputs)


def _row_by_row(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether each output row of `node` is computed from the same row of its inputs alone."""
    if node.op == "call_module" and isinstance(gm.get_submodule(str(node.target)), _ROW_NORMS):
        return True
    if node.op == "call_function" and node.target is getattr:
        return True  # x.dtype, x.shape
    kind, fam = classify(node, gm), family(node, gm)
    if kind not in _ROWWISE and fam not in _ROWWISE:
        return False
    first = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    spec = info(first).tensor if first is not None and info(first).value == "tensor" else None
    if OpKind.VIEW in (kind, fam):  # a view that keeps the rows first
        out = info(node).tensor
        return spec is not None and out is not None and bool(spec.shape) and bool(out.shape) \
            and spec.shape[0] == out.shape[0]
    if OpKind.GETITEM in (kind, fam) and spec is not None:  # an index into a tensor: rows kept whole
        index = node.args[1]
        lead = index[0] if isinstance(index, tuple) and index else index
        return lead is Ellipsis or lead == slice(None)
    position = {OpKind.SOFTMAX: 1, OpKind.SPLIT: 2, OpKind.SLICE: 1}.get(fam if fam in (OpKind.SPLIT, OpKind.SLICE)
                                                                         else kind)
    if position is not None:  # along a dim that is not the rows'
        dim = node.kwargs.get("dim", node.args[position] if len(node.args) > position else None)
        ndim = len(spec.shape) if spec is not None else 0
        return isinstance(dim, int) and dim % max(ndim, 1) != 0
    return True


def _signature(region: list[fx.Node], rows: fx.Node, path: str, index: int) -> list[tuple[object, ...]]:
    """What region computes, with expert `index`'s module names made generic."""
    own = f"{path}.{index}"
    at = {n: k for k, n in enumerate(region)}

    def generic(value: object) -> object:
        if isinstance(value, fx.Node):
            if value.op == "get_attr" and value not in at:
                return ("attr", target(value))
            return "rows" if value is rows else ("node", at[value]) if value in at else ("outside", value.name)
        if isinstance(value, (tuple, list)):
            return tuple(generic(v) for v in value)
        if isinstance(value, dict):
            return tuple((k, generic(v)) for k, v in value.items())
        return value

    def target(node: fx.Node) -> object:
        if node.op in ("call_module", "get_attr"):
            name = str(node.target)
            return "*" + name.removeprefix(own) if name.startswith(own + ".") or name == own else name
        return node.target
    return [(n.op, target(n), generic(n.args), generic(n.kwargs)) for n in region]


def expert_loops(gm: fx.GraphModule) -> tuple[list[ExpertLoop], list[str]]:
    """The loops of experts in `gm` (outermost first, none inside another), and why each other list of
    modules is none."""
    loops: list[ExpertLoop] = []
    why: list[str] = []
    for path, by_index in sorted(_candidates(gm).items(), key=lambda kv: kv[0].count(".")):
        if any(path.startswith(loop.module + ".") for loop in loops):
            continue
        found = _one_loop(gm, path, by_index)
        if isinstance(found, str):
            why.append(found)
        else:
            loops.append(found)
    return loops, why


def _held(gm: fx.GraphModule, loop: ExpertLoop, ep: int, names: dict[int, str]) -> dict[str, tuple[str, ...]]:
    """Each slot parameter's name -> the parameter each expert-parallel rank holds there."""
    experts = len(loop.regions)
    local = experts // ep

    def params(region: list[fx.Node]) -> list[str]:
        out: list[str] = []
        for node in region:
            if node.op == "call_module":
                out += [names[id(p)] for _, p in gm.get_submodule(str(node.target)).named_parameters()]
            elif node.op == "get_attr" and _is_parameter(gm, str(node.target)):
                out.append(names[id(gm.get_parameter(str(node.target)))])
        return out

    each = [params(region) for region in loop.regions]
    slots: dict[str, tuple[str, ...]] = {}
    for j in range(local):
        for k, name in enumerate(each[j]):
            slots[name] = tuple(each[r * local + j][k] for r in range(ep))
    every = [n for names_ in each for n in names_]
    if len(set(every)) != len(every):
        raise GraphsplitError(f"--ep: {loop.module}'s experts share parameters, so none can be placed on one rank "
                              "alone; drop --ep")
    return slots


def _is_parameter(gm: fx.GraphModule, target: str) -> bool:
    try:
        gm.get_parameter(target)
    except AttributeError:
        return False
    return True


def _swapped(storages: Storages, gm: fx.GraphModule, a: fx.Node, b: fx.Node) -> bool:
    """Whether `a` and `b` may not change order: one writes in place into storage the other touches."""
    def touched(n: fx.Node) -> set[fx.Node]:
        return {storages.find(x) for x in (n, *n.all_input_nodes)}

    def written(n: fx.Node) -> set[fx.Node]:
        return {storages.find(x) for x in written_inputs(n, gm)}
    return bool(written(a) & touched(b) or written(b) & touched(a))


def place_loop(gm: fx.GraphModule, loop: ExpertLoop, ep: int, comm: fx.Node, layer: int) -> dict[str, tuple[str, ...]]:
    """Rewrite one loop of experts as the module docstring says; returns its slots' held names."""
    experts = len(loop.regions)
    if experts % ep:
        raise GraphsplitError(f"--ep {ep}: {loop.module} has {experts} experts, which {ep} ranks cannot hold equally; "
                              f"use an --ep that divides {experts}")
    local = experts // ep
    slots = _held(gm, loop, ep, canonical_names(gm))
    graph = gm.graph
    order = {n: k for k, n in enumerate(graph.nodes)}
    in_region = {n: i for i, region in enumerate(loop.regions) for n in region}
    start = min(order[n] for n in in_region)
    end = max(order[n] for n in (*in_region, *loop.rows))
    window = [n for n in graph.nodes if start <= order[n] <= end]
    ancestors: set[fx.Node] = set()
    stack = list(loop.rows)
    while stack:
        n = stack.pop()
        if n not in ancestors and order[n] >= start:
            ancestors.add(n)
            stack.extend(n.all_input_nodes)
    before = [n for n in window if n in ancestors]
    kept = [n for n in window if in_region.get(n, experts) < local]
    after = [n for n in window if n not in ancestors and n not in in_region]
    storages = Storages(gm)
    for late, early in ((a, b) for group_a, group_b in ((after, before), (after, kept), (kept, before))
                        for a in group_a for b in group_b):
        if order[late] < order[early] and _swapped(storages, gm, late, early):
            raise GraphsplitError(f"--ep: {_at(late)} writes in place what {_at(early)} reads, between the calls "
                                  f"of {loop.module}, so they cannot be gathered into one exchange; drop --ep")
    anchor = window[-1].next
    for node in before:
        anchor.prepend(node)
    sent = insert_node(graph, ep_send, (comm, layer, *loop.rows), owner=loop.rows[0], kind=OpKind.OTHER, before=anchor,
                       value="container")
    for j in range(local):
        piece = insert_node(graph, operator.getitem, (sent, j), owner=loop.rows[j], kind=OpKind.GETITEM, before=anchor)
        for node in loop.regions[j]:
            anchor.prepend(node)
            node.replace_input_with(loop.rows[j], piece)
    received = insert_node(graph, operator.getitem, (sent, local), owner=loop.rows[0], kind=OpKind.GETITEM,
                           before=anchor)
    back = insert_node(graph, ep_return, (comm, received, tuple(loop.rows), tuple(loop.outputs[:local])),
                       owner=loop.rows[0], kind=OpKind.OTHER, before=anchor, value="container")
    for i, y in enumerate(loop.outputs):
        mine = insert_node(graph, operator.getitem, (back, i), owner=loop.rows[i], kind=OpKind.GETITEM, before=anchor)
        for user in [u for u in y.users if u not in in_region and u is not back]:
            user.replace_input_with(y, mine)
    for node in after:
        anchor.prepend(node)
    for region in reversed(loop.regions[local:]):
        for node in reversed(region):
            graph.erase_node(node)
    return slots


def _at(node: fx.Node) -> str:
    """The op and where the model's code makes it."""
    op = str(node.target) if node.op in ("call_module", "get_attr") else op_name(node)
    if node.op == "call_module":
        op += f" ({type(node.graph.owning_module.get_submodule(str(node.target))).__name__})"
    source = info(node).source
    return f"{op} at {source}" if source is not None else f"{op} ({node.name})"
