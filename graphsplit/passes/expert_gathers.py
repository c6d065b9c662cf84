"""Expert parallelism for experts written as a stacked weight gathered per row.

Simple mixture-of-experts code keeps each expert's matrices stacked in one `[E, ..]` parameter and
picks one per token by its expert id:

    w = self.w1[expert_ids]                      # [N, d, h]: each row's own expert's matrix
    h = torch.bmm(x.unsqueeze(1), w).squeeze(1)  # or torch.einsum("nd,ndh->nh", x, w), or x * b[ids]

Each op that reads such a gather works row by row (row n reads row n of each operand), so it can run
where row n's expert is held: the pass puts around it

    routed = ep_route_rows(expert_ids, E, self.ep_comm, layer, x_rows, ...)   # rows to their experts' ranks
    w = self.w1[routed[-4]]                      # this rank's slice of the weight, by local ids
    h = torch.bmm(routed[0], w) ...              # the op itself, unchanged
    h = ep_unroute_rows(h, routed, self.ep_comm)  # its rows back in their order

(ops/ep.py), and records the weight as held in E / ep slices (`expert_params`, dim 0), as HF's grouped
experts' weights are. Each such op exchanges its rows on its own: two all-to-alls per op, not per layer.
An op that reads a gather and is not row by row is refused naming its line.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from ..errors import GraphsplitError
from ..ir.meta import info, insert_node, module_path
from ..ir.op_kinds import OpKind, classify, family, op_name
from ..ops.ep import ep_route_rows, ep_unroute_rows

_ROWWISE = frozenset({OpKind.POINTWISE, OpKind.MATMUL, OpKind.IDENTITY})


@dataclass
class Gather:
    """`weight[index]`: one row of an `[experts, ..]` parameter per row of `index`."""

    node: fx.Node
    weight: fx.Node  # the parameter's get_attr
    index: fx.Node  # each row's expert
    experts: int


def find_gathers(gm: fx.GraphModule) -> list[Gather]:
    """Every per-row gather of a parameter by an integer index of one dim (`w[ids]`, `w.index_select(0, ids)`)."""
    found = []
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        name = op_name(node)
        if name == "getitem" and len(node.args) == 2:
            weight, index = node.args
        elif name == "index_select" and len(node.args) == 3 and node.args[1] == 0:
            weight, index = node.args[0], node.args[2]
        else:
            continue
        if not (isinstance(weight, fx.Node) and weight.op == "get_attr" and isinstance(index, fx.Node)):
            continue
        spec, ids = info(weight).tensor, info(index).tensor
        if spec is None or ids is None or len(spec.shape) < 2 or len(ids.shape) != 1 or ids.dtype.is_floating_point \
                or ids.dtype == torch.bool:
            continue
        found.append(Gather(node, weight, index, int(spec.shape[0])))
    return found


def _row_by_row(gm: fx.GraphModule, op: fx.Node, rows: int) -> bool:
    """Whether `op` (reading a gather) computes row n of its output from row n of each operand."""
    if family(op, gm) not in _ROWWISE and classify(op, gm) not in _ROWWISE and op_name(op) != "einsum":
        return False
    out = info(op).tensor
    if out is None or not out.shape or out.shape[0] != rows:
        return False
    if op_name(op) == "einsum":  # each operand's first index and the output's the same: the rows
        spec = str(op.args[0]).replace(" ", "")
        ins, _, result = spec.partition("->")
        return bool(result) and all(part[:1] == result[:1] for part in ins.split(","))
    return True


def place_gathers(gm: fx.GraphModule, gathers: list[Gather], ep: int, comm: fx.Node, first_layer: int,
                  names: dict[int, str]) -> tuple[dict[str, int], list[tuple[str, int, tuple[str, ...]]]]:
    """Rewrite each op reading a gather as the module docstring says. Returns the weights placed (name ->
    dim 0) and, per routing index (one layer), (where, experts, its weights)."""
    graph = gm.graph
    placed: dict[str, int] = {}
    layers: dict[fx.Node, tuple[str, int, list[str]]] = {}
    counted: set[fx.Node] = set()
    _check_held_in_slices(gm, gathers, ep, names)
    for g in gathers:
        where = info(g.node).source or g.node.name
        name = names[id(gm.get_parameter(str(g.weight.target)))]
        rows = int(info(g.index).tensor.shape[0])
        layer = layers.setdefault(g.index, (module_path(g.node) or str(where), g.experts, []))
        layer[2].append(name)
        index = first_layer + list(layers).index(g.index)
        for op in list(g.node.users):
            if not _row_by_row(gm, op, rows):
                raise GraphsplitError(f"--ep: {name} gathered per row at {where} is read by {op_name(op)} "
                                      f"({info(op).source or op.name}), which does not work row by row, so it cannot "
                                      "run where each row's expert is held; drop --ep")
            moved = [a for a in op.all_input_nodes if a is not g.node and _has_rows(a, rows)]
            if not moved:
                raise GraphsplitError(f"--ep: {op_name(op)} at {info(op).source or op.name} reads {name} gathered per "
                                      "row but no rows of its own; drop --ep")
            first = g.index not in counted  # an index's later exchanges move the same rows: counted once
            counted.add(g.index)
            routed = insert_node(graph, ep_route_rows, (g.index, g.experts, comm, index if first else -1, *moved),
                                 owner=op, kind=OpKind.OTHER, before=op, value="container")
            for i, row in enumerate(moved):
                op.replace_input_with(row, insert_node(graph, operator.getitem, (routed, i), owner=op,
                                                       kind=OpKind.GETITEM, before=op))
            local = insert_node(graph, operator.getitem, (routed, len(moved)), owner=op, kind=OpKind.GETITEM, before=op)
            regathered = insert_node(graph, g.node.target, (g.weight, local) if op_name(g.node) == "getitem"
                                     else (g.weight, 0, local), owner=g.node, kind=OpKind.GETITEM, before=op,
                                     op=g.node.op)
            op.replace_input_with(g.node, regathered)
            back = insert_node(graph, ep_unroute_rows, (op, routed, comm), owner=op, kind=OpKind.OTHER, after=op)
            op.replace_all_uses_with(back, delete_user_cb=lambda user, new=back: user is not new)
        if not g.node.users:
            graph.erase_node(g.node)
        placed[name] = 0
    return placed, [(w, e, tuple(ws)) for w, e, ws in layers.values()]


def _check_held_in_slices(gm: fx.GraphModule, gathers: list[Gather], ep: int, names: dict[int, str]) -> None:
    """Each gathered weight divides over the ranks and is read by its gathers alone (by any of its get_attr
    nodes): read otherwise (`w1[0]`, a penalty on `w1`), a rank's slice would answer for the whole."""
    gathered = {g.node for g in gathers}
    for g in gathers:
        where = info(g.node).source or g.node.name
        name = names[id(gm.get_parameter(str(g.weight.target)))]
        if g.experts % ep:
            raise GraphsplitError(f"--ep {ep}: {name} stacks {g.experts} experts, which {ep} ranks cannot hold "
                                  f"equally; use an --ep that divides {g.experts}")
        reads = [n for n in gm.graph.nodes if n.op == "get_attr" and n.target == g.weight.target]
        others = [u for n in reads for u in n.users if u.op != "output" and u not in gathered]
        if others:
            reader = f"{op_name(others[0])} at {info(others[0]).source or others[0].name}"
            raise GraphsplitError(f"--ep: {name} is gathered per row at {where} and also read otherwise by {reader}; "
                                  "expert parallelism places it in slices; drop --ep")


def _has_rows(node: fx.Node, rows: int) -> bool:
    spec = info(node).tensor if info(node).value == "tensor" else None
    return spec is not None and bool(spec.shape) and spec.shape[0] == rows
