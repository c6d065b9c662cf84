"""What the pictures of a program show, read once: the rules graph.dot and report.html share.

`stage_view(program, index)` walks one stage's graph in order, with each
checkpointed region's nodes in the place of its `ckpt_N` call, and returns
the nodes worth drawing as `NodeView`s:

- its inputs (the model's inputs or the tensors from the previous stage), its
  ops, and its output (what it sends on, or the model's output);
- left out: parameters (`get_attr`, and autocast's casts of them: listed on
  the ops that read them), scalars and sizes, and the plumbing graphsplit adds
  around stages and regions (`dense_grad` on received tensors, `contiguous`
  before a send, the getitems reading a region's outputs); an edge through a
  left-out node joins the drawn nodes on either side of it.

Each op says its parallel style (linears and embeddings: column, row, vocab
or replicated), the collectives it runs, the checkpoint region it lies in and
whether it computes in 16-bit (autocast).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch.fx as fx

from ..analysis.collectives import node_collectives
from ..ir.meta import SourceLine, TensorSpec, block_of, group_of, info
from ..ir.program import Program
from ..ir.sharding import Layout, Shard
from ..ops.activation_checkpoint import CheckpointRegion
from ..ops.pipeline import dense_grad
from ..passes.tensor_parallel.spellings import linear_form

ROOT = "<root>"


@dataclass(frozen=True)
class Weight:
    """A parameter an op reads: its original name, local shape on one tp rank, and sharding."""

    name: str
    tensor: TensorSpec | None
    sharding: Layout


@dataclass(eq=False)  # one view per node: compared by identity
class NodeView:
    node: fx.Node
    role: str  # "input", "op" or "output"
    module: str
    region: str | None = None  # the CheckpointRegion (`ckpt_3`) it runs in
    style: str | None = None  # column / row / vocab / replicated for linears and embeddings
    collectives: list[tuple[str, str]] = field(default_factory=list)  # (direction, kind)
    weights: list[Weight] = field(default_factory=list)
    inputs: list[NodeView] = field(default_factory=list)  # drawn producers of its inputs

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def group(self) -> str:
        """The block (`layers.3`) or top-level module (`norm`) it belongs to; ROOT for neither."""
        return group_of(self.module) or ROOT

    @property
    def block(self) -> str | None:
        return block_of(self.module)

    @property
    def tensor(self) -> TensorSpec | None:
        return info(self.node).tensor

    @property
    def sharding(self) -> Layout | tuple[Layout, ...] | None:
        return info(self.node).sharding

    @property
    def inserted(self) -> bool:
        """Made by graphsplit (a collective, a cast), not by a line of the model."""
        return self.role == "op" and info(self.node).source is None

    @property
    def source(self) -> SourceLine | None:
        """The model's line that made it; for an inserted node, the line of the first op reading it."""
        found = info(self.node).source
        if found is not None or self.role != "op":
            return found
        frontier = list(self.node.users)
        for _ in range(3):  # through other inserted nodes (autocast's casts after an f)
            found = next((info(u).source for u in frontier if info(u).source is not None), None)
            if found is not None:
                break
            frontier = [v for u in frontier for v in u.users]
        return found

    @property
    def low_precision(self) -> bool:
        """Computes in a 16-bit float: an autocast region (or a half-precision model)."""
        spec = info(self.node).tensor
        return spec is not None and spec.dtype.is_floating_point and spec.dtype.itemsize == 2


def collective_label(direction: str, kind: str) -> str:
    return f"{kind.replace('_', '-')} {'fwd' if direction == 'forward' else 'bwd'}"


def _uncast(value: object) -> object:
    """A parameter read through autocast's `.to(bf16)` is still that parameter."""
    while isinstance(value, fx.Node) and value.op == "call_method" and value.target == "to" and value.args:
        value = value.args[0]
    return value


def parallel_style(node: fx.Node, program: Program, sources: dict[str, str], prefix: str = "") -> str | None:
    """column / row / vocab / replicated for a linear or an embedding node, else None.

    `sources` maps the stage's parameter names to the model's; `prefix` is the
    attribute path of the graph the node lies in (`ckpt_0.inner.` in a region).
    """
    from ..ops import tp as tpops

    if node.op == "call_function" and node.target is tpops.vocab_parallel_embedding:
        return "vocab"
    form = linear_form(node)
    weight = _uncast(form[1]) if form is not None else None
    if not isinstance(weight, fx.Node) or weight.op != "get_attr":
        return None
    sharding = program.param_sharding(sources.get(prefix + str(weight.target), ""))
    if not isinstance(sharding, Shard):
        return "replicated"
    return "column" if sharding.dim == form[3] else "row"


def _weights(node: fx.Node, program: Program, sources: dict[str, str], prefix: str) -> list[Weight]:
    found = []
    for a in node.all_input_nodes:
        a = _uncast(a)
        if isinstance(a, fx.Node) and a.op == "get_attr":
            name = sources.get(prefix + str(a.target), str(a.target))
            found.append(Weight(name, info(a).tensor, program.param_sharding(name)))
    return found


def stage_view(program: Program, index: int) -> list[NodeView]:
    """The drawn nodes of stage `index`, in the order the stage runs them."""
    stage = program.stages[index]
    sources = dict(stage.param_sources)
    last = index == len(program.stages) - 1
    views: list[NodeView] = []
    # any node of the stage or of its regions -> the drawn nodes its value comes from
    made: dict[fx.Node, list[NodeView]] = {}
    region_outputs: dict[fx.Node, list[list[NodeView]]] = {}

    def producers(args: object) -> list[NodeView]:
        found: list[NodeView] = []
        seen: set[int] = set()  # by identity: comparing NodeViews field by field is slow on big graphs

        def add(a: fx.Node) -> None:
            for v in made.get(a, ()):
                if id(v) not in seen:
                    seen.add(id(v))
                    found.append(v)

        fx.node.map_arg(args, add)
        return found

    def walk(gm: fx.GraphModule, prefix: str, region: str | None, arg_views: list[list[NodeView]]) -> list[list[NodeView]]:
        placeholders = 0
        for node in gm.graph.nodes:
            ni = info(node)
            if node.op == "placeholder":
                if region is not None:
                    made[node] = arg_views[placeholders] if placeholders < len(arg_views) else []
                else:
                    view = NodeView(node, "input", ni.module)
                    views.append(view)
                    made[node] = [view]
                placeholders += 1
            elif node.op == "output":
                if region is not None:
                    return [producers(a) for a in node.args[0]]
                view = NodeView(node, "output", "")
                view.inputs = producers(node.args)
                views.append(view)
            elif node.op == "call_module" and isinstance(gm.get_submodule(str(node.target)), CheckpointRegion):
                inner = gm.get_submodule(str(node.target)).inner
                name = str(node.target)
                region_outputs[node] = walk(inner, f"{prefix}{name}.inner.", name, [producers(a) for a in node.args])
            elif (node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], fx.Node)
                  and node.args[0] in region_outputs):
                made[node] = region_outputs[node.args[0]][node.args[1]]
            elif node.op == "get_attr" or ni.value == "scalar" or _reads_parameter_only(node):
                made[node] = []
            elif _plumbing(node, last):
                made[node] = producers(node.args)
            else:
                view = NodeView(node, "op", ni.module, region, parallel_style(node, program, sources, prefix),
                                node_collectives(node), _weights(node, program, sources, prefix))
                view.inputs = producers((node.args, node.kwargs))
                views.append(view)
                made[node] = [view]
        return []

    walk(stage.gm, "", None, [])
    return views


def _reads_parameter_only(node: fx.Node) -> bool:
    """Autocast's `weight.to(bf16)`: part of the parameter, listed on the op that reads it."""
    return node.op == "call_method" and node.target == "to" and getattr(_uncast(node), "op", None) == "get_attr"


def _plumbing(node: fx.Node, last_stage: bool) -> bool:
    """Nodes build_program adds around a stage: no computation of the model's."""
    if node.op == "call_function" and node.target is dense_grad:
        return True
    # every stage but the last sends `x.contiguous()` of each boundary tensor
    return (not last_stage and node.op == "call_method" and node.target == "contiguous"
            and all(u.op == "output" for u in node.users))


def stage_views(program: Program) -> list[list[NodeView]]:
    """`stage_view` of every stage, in stage order."""
    return [stage_view(program, st.index) for st in program.stages]
