"""checkpoint: wrap regions of each stage in non-reentrant activation checkpointing.

Policies (Plan.checkpoint): `blocks` — each repeated block (a child of a
ModuleList/Sequential: `h.3`, `layers.7`) is a region; `every:K` — K
consecutive blocks per region; `stage` — a whole stage is one region;
`selective` — each block keeps its matmul outputs and recomputes the cheap
ops. Regions never cross a pipeline boundary (the pass runs after
pipeline_split). A region becomes one `CheckpointRegion` submodule called
as `ckpt_N` and its outputs are read back with getitem, so stage code shows
where recomputation happens. Results are bit-identical in fp32: the same ops
run on the same values, twice.
"""

from __future__ import annotations

import operator

import torch.fx as fx

from ..meta import NodeInfo, block_of, info
from ..ops.checkpoint import CheckpointRegion
from .manager import PassContext

_UNPLACED = ("placeholder", "get_attr", "output")


def regions(gm: fx.GraphModule, policy: str) -> list[list[fx.Node]]:
    """Contiguous runs of nodes to checkpoint, each inside one stage."""
    seq = [n for n in gm.graph.nodes if n.op not in _UNPLACED]
    pos = {n: i for i, n in enumerate(seq)}
    runs: list[list[fx.Node]] = []
    prev = None
    for node in seq:
        block = block_of(info(node).module)
        key = info(node).stage if policy == "stage" else (info(node).stage, block)
        if policy != "stage" and block is None:
            prev = None  # outside every block: ends the region
            continue
        if key == prev:
            runs[-1].append(node)
        else:
            runs.append([node])
        prev = key
    if policy.startswith("every:"):
        size = int(policy.split(":", 1)[1])
        merged: list[list[fx.Node]] = []
        for run in runs:
            last = merged[-1] if merged else None
            if (last and pos[last[-1]] + 1 == pos[run[0]] and info(last[-1]).stage == info(run[0]).stage
                    and len({block_of(info(n).module) for n in last}) < size):
                last.extend(run)
            else:
                merged.append(list(run))
        runs = merged
    return [r for r in runs if any(info(n).flops for n in r) and _no_containers_leave(r)]


def _no_containers_leave(region: list[fx.Node]) -> bool:
    members = set(region)
    return all(info(n).value != "container" for n in region if any(u not in members for u in n.users))

def _wrap(gm: fx.GraphModule, region: list[fx.Node], index: int, selective: bool) -> None:
    members = set(region)
    inputs: list[fx.Node] = []
    for n in region:
        for a in n.all_input_nodes:
            if a not in members and a.op != "get_attr" and a not in inputs:
                inputs.append(a)
    leaving = [n for n in region if any(u not in members for u in n.users)]
    # A size used outside is recomputed outside from the tensor it reads (which leaves the
    # region instead): later stages recompute sizes from tensors, never receive them.
    scalars = [n for n in leaving if info(n).value == "scalar"]
    needed = _scalar_chain(scalars, members)
    roots = [a for n in needed for a in n.all_input_nodes if a in members and a not in needed]
    outputs = [n for n in region if (n in leaving and n not in scalars) or n in roots]
    outputs = list(dict.fromkeys(outputs))
    sub = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for a in inputs:
        env[a] = sub.placeholder(a.name)
        env[a].meta = dict(a.meta)

    def get(m: fx.Node) -> fx.Node:
        if m not in env:  # a parameter or buffer: read inside the region
            env[m] = sub.node_copy(m)
        return env[m]

    for n in region:
        env[n] = sub.node_copy(n, get)
    sub.output(tuple(env[o] for o in outputs))
    name = f"ckpt_{index}"
    gm.add_submodule(name, CheckpointRegion(fx.GraphModule(gm, sub, class_name="Region"), selective))
    stage = info(region[0]).stage
    with gm.graph.inserting_before(region[0]):
        call = gm.graph.call_module(name, tuple(inputs))
    call.meta = {k: v for k, v in region[0].meta.items() if k in ("nn_module_stack",)}
    call.meta["graphsplit"] = NodeInfo(kind="checkpoint", value="container", module=info(region[0]).module,
                                       stage=stage, flops=sum(info(n).flops for n in region))
    call.meta["graphsplit"].extra["region"] = [n.name for n in region]
    with gm.graph.inserting_before(call.next):  # in order, right after the call
        reads = []
        for i, o in enumerate(outputs):
            r = gm.graph.call_function(operator.getitem, (call, i))
            r.meta = {"graphsplit": NodeInfo(**{**info(o).__dict__, "kind": "getitem", "flops": 0, "bytes_moved": 0})}
            reads.append(r)
    outside = dict(zip(outputs, reads))
    with gm.graph.inserting_before((reads[-1] if reads else call).next):  # keeps the copies in order
        for n in needed:  # the size chain, again, on the region's outputs
            copy = gm.graph.node_copy(n, lambda a: outside.get(a, a))
            copy.meta = {"graphsplit": NodeInfo(**{**info(n).__dict__})}
            outside[n] = copy
    for o, r in outside.items():
        o.replace_all_uses_with(r, delete_user_cb=lambda u: u not in members)
    for n in reversed(region):
        gm.graph.erase_node(n)


def _scalar_chain(scalars: list[fx.Node], members: set[fx.Node]) -> list[fx.Node]:
    """The region's scalar nodes that `scalars` are computed from, in graph order."""
    found: set[fx.Node] = set()
    todo = list(scalars)
    while todo:
        n = todo.pop()
        if n in found:
            continue
        found.add(n)
        todo.extend(a for a in n.all_input_nodes if a in members and info(a).value == "scalar")
    return [n for n in next(iter(members)).graph.nodes if n in found]


def checkpoint_pass(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    policy = ctx.plan.checkpoint
    if policy == "none":
        return gm
    found = regions(gm, "blocks" if policy == "selective" else policy)
    for i, region in enumerate(found):
        _wrap(gm, region, i, selective=policy == "selective")
    ctx.checkpoint_regions = [[n.name for n in r] for r in found]
    gm.recompile()
    return gm
