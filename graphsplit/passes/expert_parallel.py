"""expert_parallel: with `--ep N`, each mixture-of-experts layer's experts placed whole on N ranks.

Found from the graph, not from module names: a layer is the grouped linears (`grouped_mm` over
one `[E, ..]` parameter each, ir/op_kinds.py's GROUPED_LINEAR) that share one `offsets` value
(HF's grouped experts: gate+up, the activation, down, all on rows sorted by expert). Between the
first one's input and the last one's output every op must work row by row (the activation, the
gate's product, casts): then the rows can be moved to the ranks holding their experts before
the first and back after the last, and nothing between notices. The pass inserts

    routed = ep_dispatch(x, offsets, self.ep_comm, i)       # ops/ep.py: the all-to-alls (layer i)
    grouped_mm(routed[0], w_local, routed[1]) ... -> y      # the experts this rank holds
    out = ep_combine(y, routed, offsets, self.ep_comm)

and records each expert weight as held in E / N slices over the expert-parallel ranks
(`Program.expert_params`; rank r of the group holds experts r*E/N .. (r+1)*E/N - 1). Other values the
experts read with one row per routed row (gpt-oss's per-expert bias, gathered per row by the sorted
expert ids) are moved with the rows in the same all-to-all. The router,
the sort, the weighting and the sum back to tokens stay the model's own, on each rank's tokens.
`routed` is a tuple: the pipeline split never cuts between the two calls (a tuple cannot be
sent), so a stage holds a layer's exchange whole. Experts written as a loop over an `nn.ModuleList`
(each called on the rows it picked) are found and placed by passes/expert_loops.py, a stacked weight
gathered per row (`self.w1[expert_ids]`) by passes/expert_gathers.py.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch.fx as fx
import torch.nn as nn

from ..analysis.shapes import annotate
from ..errors import GraphsplitError
from ..ir.meta import STAMP_KEYS, canonical_names, info, insert_node
from ..ir.op_kinds import OpKind, classify, family
from ..ops.ep import EP_COMM_ATTR, EPComm, ep_combine, ep_dispatch
from .expert_gathers import find_gathers, place_gathers
from .expert_loops import expert_loops, place_loop
from .manager import PassInput, PassResults
from .tensor_parallel.spellings import grouped_linear_form

# what may run between a layer's grouped linears: row by row, each row alone
_ROWWISE = frozenset({OpKind.POINTWISE, OpKind.IDENTITY, OpKind.SPLIT, OpKind.SLICE, OpKind.GETITEM,
                      OpKind.GROUPED_LINEAR})


@dataclass(frozen=True)
class ExpertLayer:
    """One mixture-of-experts layer placed over the expert-parallel ranks."""

    module: str
    experts: int
    weights: tuple[str, ...]  # the canonical names of its grouped weights

    def ranks_hold(self, ep: int) -> list[tuple[int, int]]:
        """(first, last) expert of each expert-parallel rank."""
        per = self.experts // ep
        return [(r * per, (r + 1) * per - 1) for r in range(ep)]


@dataclass(frozen=True)
class ExpertParallelResult:
    layers: tuple[ExpertLayer, ...]
    expert_params: Mapping[str, int]  # canonical weight name -> its expert dim (0)
    # experts written as a loop (passes/expert_loops.py): a slot's weight -> the one each ep rank holds there
    expert_slots: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))


def _layers(gm: fx.GraphModule) -> dict[fx.Node, list[fx.Node]]:
    """The grouped linears by the offsets value they share, in graph order."""
    found: dict[fx.Node, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and classify(node, gm) == OpKind.GROUPED_LINEAR:
            offsets = node.args[2] if len(node.args) > 2 else node.kwargs.get("offs")
            if not isinstance(offsets, fx.Node):
                where = info(node).module or node.name
                raise GraphsplitError(f"--ep: the grouped linear in {where} takes no offsets graphsplit can follow; "
                                      "expert parallelism needs the experts' rows sorted by expert (HF's grouped "
                                      "experts); drop --ep")
            found.setdefault(offsets, []).append(node)
    return found


def _holds_a_list(gm: fx.GraphModule, target: str) -> bool:
    """Whether the module a call_module node runs holds a list of alike modules (experts, perhaps)."""
    return any(isinstance(m, nn.ModuleList) and len(m) > 1 and len({type(c) for c in m}) == 1
               for m in gm.get_submodule(target).modules())


def _between(first: fx.Node, last: fx.Node) -> list[fx.Node]:
    """The nodes on a path from `first` to `last`'s input (first and last included)."""
    ahead: set[fx.Node] = {first}
    order: list[fx.Node] = []
    for node in first.graph.nodes:
        if node is first or any(a in ahead for a in node.all_input_nodes):
            ahead.add(node)
        if node is last:
            break
    behind: set[fx.Node] = {last}
    for node in reversed(list(first.graph.nodes)):
        if any(u in behind for u in node.users) and node in ahead:
            behind.add(node)
    for node in first.graph.nodes:
        if node in ahead and node in behind:
            order.append(node)
    return order


def _check_layer(gm: fx.GraphModule, linears: list[fx.Node], ep: int, names: dict[int, str]
                 ) -> tuple[int, list[str], set[fx.Node], list[fx.Node]]:
    """(experts, weight names, the nodes from the first linear to the last, the other per-row values
    the experts read: moved with the rows), or one line why this layer cannot be placed."""
    first, last = linears[0], linears[-1]
    where = info(first).module or first.name
    weights: list[str] = []
    experts = None
    for node in linears:
        form = grouped_linear_form(node)
        if form is None:
            raise GraphsplitError(f"--ep: {where} computes an expert weight instead of reading a parameter; "
                                  "expert parallelism places parameters whole on ranks; drop --ep")
        w = form[1]
        n = tuple(gm.get_parameter(str(w.target)).shape)[0]
        if experts is not None and n != experts:
            raise GraphsplitError(f"--ep: {where}'s expert weights hold {experts} and {n} experts; drop --ep")
        experts = n
        weights.append(names[id(gm.get_parameter(str(w.target)))])
    assert experts is not None
    if experts % ep:
        raise GraphsplitError(f"--ep {ep}: {where} has {experts} experts, which {ep} ranks cannot hold equally; "
                              f"use an --ep that divides {experts}")
    region = _between(first, last)
    inside = set(region)
    x = first.args[0]
    rows = info(x).tensor.shape[0] if isinstance(x, fx.Node) and info(x).tensor is not None else None
    extras: list[fx.Node] = []
    for node in region:
        kind, fam = classify(node, gm), family(node, gm)
        if fam not in _ROWWISE and kind not in _ROWWISE:
            raise GraphsplitError(f"--ep: between {where}'s grouped linears {node.name} ({fam.name.lower()}) does not work "
                                  "row by row, so the rows cannot be moved to their experts' ranks around it; drop --ep")
        along = (node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)) if fam == OpKind.SPLIT else \
            (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) if fam == OpKind.SLICE else None
        if along in (0, -2):
            raise GraphsplitError(f"--ep: between {where}'s grouped linears {node.name} cuts the rows; drop --ep")
        outside = [u for u in node.users if u not in inside and classify(u, gm) != OpKind.ASSERT]
        if node is not last and outside:
            user = outside[0]
            raise GraphsplitError(f"--ep: {where}'s experts' intermediate {node.name} is also read by {user.name}, "
                                  "outside the experts; drop --ep")
        for arg in node.all_input_nodes:
            if arg in inside or arg is first.args[0] or classify(arg, gm) == OpKind.PARAM:
                continue
            if kind == OpKind.GROUPED_LINEAR and arg in (node.args[1], node.args[2]):  # its weight, its offsets
                continue
            spec = info(arg).tensor if info(arg).value == "tensor" else None
            if spec is None or not spec.shape:
                continue  # a number: the same for every row
            if rows is not None and spec.shape[0] == rows and len(spec.shape) == 2:
                if arg not in extras:
                    extras.append(arg)  # one value per routed row (a per-row bias): moved with the rows
                continue
            raise GraphsplitError(f"--ep: {where}'s experts read {arg.name} (shape {tuple(spec.shape)}) beside their "
                                  "rows, neither one value per routed row nor a number; drop --ep")
    return experts, weights, inside, extras


def expert_parallel_pass(gm: fx.GraphModule, inp: PassInput,
                         done: PassResults) -> tuple[fx.GraphModule, ExpertParallelResult | None]:
    ep = inp.plan.ep
    if ep == 1:
        return gm, None
    layers = _layers(gm)
    loops, why = expert_loops(gm)
    gathers = find_gathers(gm)
    if not layers and not loops and not gathers:
        said = [w for w in why if "one after another" not in w and "once per child" not in w]
        said += [f"{n.target} runs as written (neither tracer follows its forward), so the experts in it cannot "
                 "be placed" for n in gm.graph.nodes if n.op == "call_module" and _holds_a_list(gm, str(n.target))]
        raise GraphsplitError(f"--ep {ep}: the model has no mixture-of-experts layer graphsplit finds (grouped "
                              "linears over an [experts, ..] weight, as HF's grouped experts run, a list of "
                              "experts each called on its rows, or a stacked weight gathered per row)" + (f": {said[0]}" if said else "") + "; drop --ep")
    gm.add_submodule(EP_COMM_ATTR, EPComm(ep))
    graph = gm.graph
    with graph.inserting_before(next(n for n in graph.nodes if n.op != "placeholder")):
        comm = graph.get_attr(EP_COMM_ATTR)
    info(comm).value = "scalar"
    placed: list[ExpertLayer] = []
    expert_params: dict[str, int] = {}
    order = {n: i for i, n in enumerate(graph.nodes)}
    names = canonical_names(gm)
    for offsets, linears in layers.items():
        first, last = linears[0], linears[-1]
        experts, weights, region, extras = _check_layer(gm, linears, ep, names)
        x = first.args[0]
        # before the first node of the layer that reads a per-row extra, and after every extra
        readers = [n for n in region if any(e in n.all_input_nodes for e in extras)]
        at = min([first, *readers], key=lambda n: order[n])
        if any(order[e] > order[at] for e in extras):
            raise GraphsplitError(f"--ep: {info(first).module}'s per-row values are made after its experts start; "
                                  "drop --ep")
        routed = insert_node(graph, ep_dispatch, (x, offsets, comm, len(placed), *extras), owner=first,
                             kind=OpKind.OTHER, before=at, value="container")
        picks = []  # the rows, their offsets, each extra (the counts, item 2, the combine reads from `routed`)
        for i in (0, 1, *range(3, 3 + len(extras))):
            with graph.inserting_after(picks[-1] if picks else routed):
                picks.append(graph.call_function(operator.getitem, (routed, i)))
            picks[-1].meta.update({k: v for k, v in first.meta.items() if k in STAMP_KEYS})
        rows, local_offsets = picks[0], picks[1]
        for extra, moved in zip(extras, picks[2:]):
            for user in [u for u in extra.users if u in region]:
                user.replace_input_with(extra, moved)
        first.replace_input_with(x, rows)
        for node in linears:
            node.replace_input_with(offsets, local_offsets)
        combined = insert_node(graph, ep_combine, (last, routed, offsets, comm), owner=last, kind=OpKind.OTHER,
                               after=last, tensor=info(last).tensor)
        last.replace_all_uses_with(combined, delete_user_cb=lambda user, new=combined: user is not new)
        placed.append(ExpertLayer(info(first).module or first.name, experts, tuple(weights)))
        expert_params.update({w: 0 for w in weights})
    slots: dict[str, tuple[str, ...]] = {}
    for loop in loops:
        held = place_loop(gm, loop, ep, comm, len(placed))
        placed.append(ExpertLayer(loop.module, len(loop.regions), tuple(held)))
        slots.update(held)
    if gathers:
        gathered, found = place_gathers(gm, gathers, ep, comm, len(placed), names)
        expert_params.update(gathered)
        placed += [ExpertLayer(where, experts, weights) for where, experts, weights in found]
    gm.delete_all_unused_submodules()
    graph.lint()
    gm.recompile()
    annotate(gm, inp.example_inputs)
    return gm, ExpertParallelResult(tuple(placed), MappingProxyType(expert_params), MappingProxyType(slots))

