"""pipeline_split: assign every node to a pipeline stage.

Stages are contiguous in the graph's topological order. The cut minimizes the
most expensive stage (cost model in `analysis/cost.py`), where a stage pays for
the bytes it sends to the next one, so equal-cost cuts prefer narrow places
(between blocks, not inside them). `Plan.split_at` module names override it.

A cut is impossible where a container of tensors (a tuple from `split`, an
LSTM's state) is live across it: only tensors cross. Under the zero-bubble
schedules neither may a value computed from weights alone (a position
embedding of `arange`): torch's split backward would leave its weights
without gradients. Scalars (sizes, ints) may
be live across a cut: the consuming stage recomputes them (see ir/program.py).

Writes `NodeInfo.stage` on placeholders and computing nodes; `get_attr` nodes
keep `stage=None`: a parameter is cloned into every stage that uses it.
"""

from __future__ import annotations

import numpy as np
import torch.fx as fx

from ..analysis.balance import balanced_cuts
from ..analysis.cost import boundary_cost, node_cost
from ..analysis.recompute import from_weights_alone, recomputable
from ..errors import GraphsplitError
from ..ir.aliasing import Storages
from ..ir.eager_modules import state_spans
from ..ir.meta import info
from ..plan import SPLIT_BACKWARD_SCHEDULES
from .manager import PassInput, PassResults

_UNPLACED = ("placeholder", "get_attr", "output")


def schedulable(gm: fx.GraphModule) -> list[fx.Node]:
    """The nodes that are placed on a stage by position."""
    return [n for n in gm.graph.nodes if n.op not in _UNPLACED]


def liveness(gm: fx.GraphModule, blocking: set[fx.Node] | frozenset[fx.Node] = frozenset()
             ) -> tuple[list[fx.Node], np.ndarray, np.ndarray]:
    """For each cut k (before seq[k]): bytes of tensors live across it, and whether it is blocked
    (a container, or a value of `blocking`, is live across it)."""
    seq = schedulable(gm)
    n = len(seq)
    pos = {node: i for i, node in enumerate(seq)}
    # last_use: the last position where a value is needed. A scalar's tensor sources
    # are needed wherever the scalar is (it is recomputed there), so they inherit its uses.
    storages = Storages(gm)
    recomp = recomputable(gm.graph, storages)
    last_use: dict[fx.Node, int] = {}
    for node in reversed(gm.graph.nodes):
        lu = -1
        for user in node.users:
            if user.op == "output":
                lu = max(lu, n)
            elif user in recomp:
                lu = max(lu, last_use.get(user, pos.get(user, -1)), pos.get(user, -1))
            else:
                lu = max(lu, pos[user])
        last_use[node] = lu
    live = np.zeros(n + 2, dtype=np.float64)
    blocked = np.zeros(n + 2, dtype=np.int64)
    # values sharing a storage that is written in place (ir/aliasing.py) cross a cut as separate
    # copies: a write after the cut would reach one and not the other. Count them per storage.
    sharing: dict[fx.Node, np.ndarray] = {}
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "output"):
            continue
        start = pos.get(node, -1) + 1
        end = last_use[node]
        if end < start:
            continue
        ni = info(node)
        if node in recomp:
            continue
        if node in blocking or ni.sizes_follow_data:  # a value whose shape follows the data is never sent
            blocked[start] += 1
            blocked[end + 1] -= 1
        elif ni.value == "tensor":
            live[start] += ni.out_bytes
            live[end + 1] -= ni.out_bytes
            if storages.is_written(node):
                count = sharing.setdefault(storages.find(node), np.zeros(n + 2, dtype=np.int64))
                count[start] += 1
                count[end + 1] -= 1
        elif ni.value == "container":
            blocked[start] += 1
            blocked[end + 1] -= 1
    # a buffer written in place in forward (an EMA codebook's `.data.lerp_`, a step counter) is one tensor:
    # every op reading or writing it stays in one stage, or a stage would read its own copy, never written
    for first, last in _written_buffer_spans(gm, storages, pos):
        blocked[first + 1] += 1
        blocked[last + 1] -= 1
    # what a module run as written left in itself is read on the rank whose copy ran (ir/eager_modules.py)
    for call, read in state_spans(gm.graph):
        if call in pos and read in pos:
            blocked[pos[call] + 1] += 1
            blocked[pos[read] + 1] -= 1
    crossing = np.cumsum(blocked)[: n + 1] > 0
    for count in sharing.values():
        crossing |= np.cumsum(count)[: n + 1] > 1
    return seq, np.cumsum(live)[: n + 1], crossing


def _written_buffer_spans(gm: fx.GraphModule, storages: Storages, pos: dict[fx.Node, int]) -> list[tuple[int, int]]:
    """(first, last) position of the ops touching each buffer some op writes in place (through any of
    the graph's reads of it: each `self.embed` is a get_attr node of its own)."""
    attrs = [n for n in gm.graph.nodes if n.op == "get_attr"]
    written = {str(n.target) for n in attrs if storages.is_written(n)}
    buffer_of = {storages.find(n): str(n.target) for n in attrs if str(n.target) in written}
    touched: dict[str, list[int]] = {}
    if written:
        for node in gm.graph.nodes:
            target = buffer_of.get(storages.find(node))
            if target is not None:
                places = touched.setdefault(target, [])
                places.extend(pos[u] for u in node.users if u in pos)
                if node in pos:
                    places.append(pos[node])
    return [(min(p), max(p)) for p in touched.values() if p]


def _holding_parameters(gm: fx.GraphModule, seq: list[fx.Node]) -> list[int]:
    """Positions of the ops that read a parameter (a module holding one, or a parameter read as a value)."""
    def is_parameter(node: fx.Node) -> bool:
        try:
            gm.get_parameter(str(node.target))
        except AttributeError:
            return False
        return True

    found = []
    for k, node in enumerate(seq):
        if node.op == "call_module":
            if any(True for _ in gm.get_submodule(str(node.target)).parameters()):
                found.append(k)
        elif any(a.op == "get_attr" and is_parameter(a) for a in node.all_input_nodes):
            found.append(k)
    return found


def cut_places(gm: fx.GraphModule) -> tuple[int, int]:
    """(places where a stage may start, operations): the most stages a graph takes is places + 1.

    Needs the shape analysis (value kinds) on `gm`."""
    seq, _, blocked = liveness(gm)
    n = len(seq)
    return int((~blocked[1:n]).sum()), n


def too_few_cuts(stages: int, stages_per_rank: int, places: int, operations: int) -> GraphsplitError:
    most = places + 1
    per_rank = f" with {stages_per_rank} stages per rank" if stages_per_rank > 1 else ""
    return GraphsplitError(
        f"{stages} pipeline stages need {stages - 1} cuts, but the model has too few places to cut: {places} "
        f"among its {operations} operations, so it takes at most {most} stage(s); "
        f"use --pp {max(1, most // stages_per_rank)} or fewer{per_rank}"
    )


def _module_cut(seq: list[fx.Node], name: str) -> int:
    prefix = name + "."
    for i, node in enumerate(seq):
        mod = info(node).module
        if mod == name or mod.startswith(prefix):
            return i
    return -1


def _explicit_cuts(gm: fx.GraphModule, seq: list[fx.Node], blocked: np.ndarray, names: tuple[str, ...], by_node: bool) -> list[int]:
    cuts: list[int] = []
    index = {node.name: i for i, node in enumerate(seq)}
    for name in names:
        if by_node:
            k = index.get(name, -1)
        else:
            k = _module_cut(seq, name)
        if k < 0 and by_node:  # a folder's saved split, from a model that has changed since
            raise GraphsplitError(
                f"the saved split starts a stage at node {name!r}, which the model no longer has (it changed since "
                "graphsplit transform wrote this folder); run graphsplit transform again for the model as it is now"
            )
        if k < 0:
            modules = sorted({info(n).module.split(".")[0] for n in seq if info(n).module})
            raise GraphsplitError(
                f"split point {name!r} names no {'node' if by_node else 'module'} in the traced model; "
                f"top-level modules are: {', '.join(modules) or '<none>'}"
            )
        if k == 0 or (cuts and k <= cuts[-1]):
            raise GraphsplitError(
                f"split point {name!r} does not start a new non-empty stage after the previous one; "
                "give split points in the order the model runs them"
            )
        if blocked[k]:
            raise GraphsplitError(
                f"cannot start a stage at {name!r}: a tuple of tensors is live across that point; "
                "choose a split point at a module boundary"
            )
        cuts.append(k)
    return cuts


def pipeline_split_pass(gm: fx.GraphModule, inp: PassInput, done: PassResults) -> tuple[fx.GraphModule, None]:
    stages = inp.plan.num_stages
    # under split backward a value computed from weights alone must not be sent: the automatic cut
    # avoids it; a cut the user chose is refused by ir/program.py, naming the value
    automatic = inp.fixed_cuts is None and not inp.plan.split_at
    split_backward = inp.plan.schedule in SPLIT_BACKWARD_SCHEDULES
    seq, live, blocked = liveness(gm, from_weights_alone(gm.graph) if split_backward and automatic else frozenset())
    n = len(seq)
    valid = np.zeros(n + 1, dtype=bool)
    valid[1:n] = ~blocked[1:n]
    if inp.fixed_cuts is not None:
        cuts = _explicit_cuts(gm, seq, blocked, tuple(inp.fixed_cuts), by_node=True)
        if len(cuts) != stages - 1:
            raise GraphsplitError(
                f"the saved split has {len(cuts) + 1} stages but the plan asks for {stages}; "
                "re-run graphsplit transform with this plan"
            )
    elif inp.plan.split_at:
        cuts = _explicit_cuts(gm, seq, blocked, inp.plan.split_at, by_node=False)
    elif stages > 1:
        held = _holding_parameters(gm, seq)
        if len(held) >= 2:  # the first stage holds a layer, and so does the last (a rank with none cannot train)
            narrowed = valid.copy()
            narrowed[: held[0] + 1] = False
            narrowed[held[-1] + 1:] = False
            if int(narrowed.sum()) >= stages - 1:
                valid = narrowed
        possible = int(valid.sum())
        if possible < stages - 1:
            raise too_few_cuts(stages, inp.plan.stages_per_rank, possible, n)
        comm = np.array([boundary_cost(int(b), inp.plan.send_flops_per_byte) for b in live])
        cuts = balanced_cuts(np.array([node_cost(x) for x in seq]), comm, valid, stages)
    else:
        cuts = []
    bounds = [0, *cuts, n]
    for s in range(stages):
        for node in seq[bounds[s] : bounds[s + 1]]:
            info(node).stage = s
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            info(node).stage = 0
        elif node.op == "output":
            info(node).stage = stages - 1
    return gm, None
