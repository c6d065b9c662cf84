"""Cut the annotated graph into one GraphModule per stage: a `Program` (ir/program.py).

`build_program(traced, plan)` reads the stage annotations the passes wrote and
cuts the graph into one GraphModule per stage:

- stage s takes the tensors crossing boundary s-1 (stage 0: the model inputs)
  and returns the tensors crossing boundary s (the last stage: the model's
  output leaves);
- a tensor used by a later, non-adjacent stage is passed through the stages
  between (skip connections, the attention mask);
- scalars (sizes, ints) never cross, nor tensors computed only from
  parameters, buffers and scalars (analysis/recompute.py): each stage that
  needs one recomputes it from what it has, by copying the nodes that computed it;
- a parameter is cloned into every stage that uses it; `Program.param_stages`
  says which, so the runtime can sum the gradients of tied copies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from ..analysis.recompute import from_weights_alone, recomputable
from ..errors import GraphsplitError
from ..ir.batch import BatchDims
from ..ir.meta import META_KEY, canonical_names, info
from ..ir.op_kinds import OpKind
from ..ir.param_grads import is_detach
from ..ir.program import Boundary, Program, StageProgram
from ..ir.regions import StageRegion
from ..ir.sharding import Shard
from ..ir.traced_model import CONSTANT, Traced, split_leaves
from ..ops.activation_checkpoint import CheckpointRegion
from ..ops.pipeline import dense_grad
from ..ops.pipeline import sent as sent_alias
from ..plan import SPLIT_BACKWARD_SCHEDULES, Plan

if TYPE_CHECKING:
    from ..analysis.loss_reduction import TokenMeans


def _constants(stage_gm: fx.GraphModule, canon_b: dict[int, str]) -> dict[str, torch.Tensor]:
    """The stage's tensors that are neither the model's parameters nor its buffers: constants the
    traced code created (fx.GraphModule registers a plain tensor attribute as a buffer)."""
    found = {}
    for name, t in stage_gm.named_buffers(remove_duplicate=False):
        if id(t) in canon_b:
            continue
        if t.device.type == "meta":  # traced on meta, its value was never known
            raise GraphsplitError(
                f"the traced model creates a tensor constant ({name}, shape {tuple(t.shape)}) whose value the "
                "trace on meta lost; build it from the inputs' shapes or register it as a buffer in the model")
        found[name] = t.detach().clone()
    return found


def build_program(
    traced: Traced,
    plan: Plan,
    *,
    param_shardings: dict[str, Shard] | None = None,
    replicated: list[dict[str, str]] | None = None,
    loss_gm: fx.GraphModule | None = None,
    sharded_outputs: dict[int, Shard] | None = None,
    token_means: TokenMeans | None = None,
    batch_dims: BatchDims | None = None,
    expert_params: dict[str, int] | None = None,
    expert_layers: tuple[Any, ...] = (),
) -> Program:
    """Cut the passes' graph into stages. The rest is what the passes found: tensor
    parallelism's parameter shardings and what it left whole, the vocab-parallel loss, the means
    normalized by the global token count."""
    from ..analysis.cost import node_cost

    gm = traced.gm
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    num = plan.num_stages
    owner: dict[fx.Node, int] = {}
    for n in nodes:
        if n.op != "get_attr":
            stage = info(n).stage
            if stage is None:
                raise GraphsplitError(f"internal: node {n.name} has no stage; run pipeline_split first")
            owner[n] = stage
    output_node = nodes[-1]

    # 1. Which tensors produced elsewhere each stage needs (through recomputed scalars too).
    needs: list[set[fx.Node]] = [set() for _ in range(num)]

    recomp = recomputable(gm.graph)

    def resolve(m: fx.Node, s: int) -> None:
        if m.op == "get_attr" or owner[m] == s:
            return
        kind = info(m).value
        if m in recomp:  # recomputed here from what this stage has, never sent
            for a in m.all_input_nodes:
                resolve(a, s)
        elif kind == "container":
            raise GraphsplitError(
                f"internal: container value {m.name} crosses from stage {owner[m]} to stage {s}"
            )
        else:
            needs[s].add(m)

    for n in nodes:
        if n.op in ("placeholder", "get_attr"):
            continue
        for a in n.all_input_nodes:
            resolve(a, owner[n])

    # 2. The model's output leaves must be tensors: stages send only tensors.
    for i, leaf in enumerate(output_node.args[0]):
        if isinstance(leaf, fx.Node) and info(leaf).value != "tensor":
            raise GraphsplitError(
                f"the model's output #{i} ({leaf.name}) is a {info(leaf).value}, not a tensor; "
                "pipeline stages can only send tensors: return tensors (or constants) from forward"
            )
    out_tensors, output_leaves = split_leaves(output_node.args[0])

    # 3. Boundaries: a value crosses every boundary between its producer and its last consumer.
    last_need: dict[fx.Node, int] = {}
    for s, vals in enumerate(needs):
        for v in vals:
            last_need[v] = max(last_need.get(v, -1), s)
    boundaries = []
    for b in range(num - 1):
        vals = sorted((v for v, last in last_need.items() if owner[v] <= b < last), key=order.__getitem__)
        boundaries.append(Boundary(b, [v.name for v in vals], [info(v).tensor for v in vals]))
    by_name = {n.name: n for n in nodes}
    if plan.schedule in SPLIT_BACKWARD_SCHEDULES:
        _refuse_weights_sent(gm, owner, last_need, plan.schedule)

    # 4. One graph per stage.
    canon_p = canonical_names(gm, params=True)
    made = {str(n.target) for n in gm.graph.find_nodes(op="get_attr") if info(n).extra.get(CONSTANT)}
    canon_b = {k: name for k, name in canonical_names(gm, params=False).items() if name not in made}
    stages: list[StageProgram] = []
    for s in range(num):
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        if s == 0:
            inputs = [n for n in nodes if n.op == "placeholder"]
        else:
            inputs = [by_name[v] for v in boundaries[s - 1].values]
        for v in inputs:
            ph = graph.placeholder(v.name)
            ph.meta = dict(v.meta)
            spec = info(v).tensor
            if s > 0 and spec is not None and (spec.dtype.is_floating_point or spec.dtype.is_complex):
                env[v] = graph.call_function(dense_grad, (ph,))
                env[v].meta = dict(v.meta)
            else:
                env[v] = ph

        def get(m: fx.Node, s: int = s, env: dict = env, graph: fx.Graph = graph) -> fx.Node:
            found = env.get(m)
            if found is None:
                if m not in recomp:
                    raise GraphsplitError(f"internal: stage {s} uses {m.name} which it neither has nor can recompute")
                found = env[m] = graph.node_copy(m, lambda a: get(a))
            return found

        members = [n for n in nodes if n.op not in ("placeholder", "get_attr", "output") and owner[n] == s]
        for n in members:
            env[n] = graph.node_copy(n, lambda a: get(a))
        if s < num - 1:
            outs = [get(by_name[v]) for v in boundaries[s].values]
            # Collectives send only dense tensors (gloo refuses strided views); a no-op when already dense.
            # Zero-bubble schedules detach the outputs in place: each gets a tensor object of its own.
            if plan.schedule in SPLIT_BACKWARD_SCHEDULES:
                sent = [graph.call_function(sent_alias, (o,)) for o in outs]
            else:
                sent = [graph.call_method("contiguous", (o,)) for o in outs]
            for o, c in zip(outs, sent):
                c.meta = dict(o.meta)
            graph.output(tuple(sent))
        else:
            outs = [get(v) for v in out_tensors]
            graph.output(outs[0] if len(outs) == 1 else tuple(outs))
        _drop_unused(graph, {env[n] for n in members if n in recomp and info(n).value == "tensor"})
        graph.lint()
        stage_gm = fx.GraphModule(gm, graph, class_name=f"Stage{s}")
        modules = []
        for n in members:  # a checkpointed region lists the modules of the nodes it holds
            for mod in info(n).extra.get("modules", [info(n).module]):
                if mod and mod not in modules:
                    modules.append(mod)
        stages.append(
            StageProgram(
                index=s,
                gm=stage_gm,
                inputs=[v.name for v in inputs],
                outputs=[o.name for o in outs],
                modules=modules,
                first_node=members[0].name if members else "",
                flops=sum(info(n).flops for n in members),
                cost=sum(node_cost(n) for n in members)
                + (0.0 if s == num - 1 else _send_cost(boundaries[s], plan.send_flops_per_byte)),
                param_sources={k: canon_p[id(p)] for k, p in stage_gm.named_parameters(remove_duplicate=False)},
                buffer_sources={k: canon_b[id(b)] for k, b in stage_gm.named_buffers(remove_duplicate=False)
                                if id(b) in canon_b},
                constants=_constants(stage_gm, canon_b),
                **_regions(stage_gm, canon_p),
            )
        )
    param_stages: dict[str, list[int]] = {}
    for st in stages:
        for canonical in dict.fromkeys(st.param_sources.values()):
            param_stages.setdefault(canonical, []).append(st.index)
    return Program(plan, traced, stages, boundaries, output_leaves, param_stages,
                   dict(param_shardings or {}), list(replicated or []), loss_gm, dict(sharded_outputs or {}),
                   token_means, batch_dims, dict(expert_params or {}), tuple(expert_layers))


def _regions(stage_gm: fx.GraphModule, canonical: dict[int, str]) -> dict[str, Any]:
    """A stage's regions (its CheckpointRegion children, in order) with the parameters each reads, and
    the parameters read outside them, by canonical name (a tied weight is one name wherever it is read)."""
    names = [name for name, m in stage_gm.named_children() if isinstance(m, CheckpointRegion)]
    names.sort(key=lambda n: int(n.rsplit("_", 1)[-1]))
    reads: dict[str, set[str]] = {name: set() for name in names}
    outside: set[str] = set()
    for local, p in stage_gm.named_parameters(remove_duplicate=False):
        top = local.split(".")[0]
        (reads[top] if top in reads else outside).add(canonical[id(p)])
    return {"regions": tuple(StageRegion(name, frozenset(reads[name])) for name in names),
            "read_outside_regions": frozenset(outside)}


def _send_cost(boundary: Boundary, flops_per_byte: float | None) -> float:
    from ..analysis.cost import boundary_cost

    return boundary_cost(boundary.nbytes, flops_per_byte)


def _drop_unused(graph: fx.Graph, recomputed: set[fx.Node] = frozenset()) -> None:
    """Remove shape queries, detaches and `recomputed` values (computed from parameters, buffers and
    sizes alone: pure by construction) whose value no node of this stage reads: a parameter's detach
    or low-precision cast that the stage using it recomputes for itself, made here only because the
    cut fell between it and its reader. Then the parameters nothing reads any more, so the stage does
    not hold them."""
    for node in reversed(list(graph.nodes)):
        if node.op in ("placeholder", "output", "get_attr") or node.users:
            continue
        ni = node.meta.get(META_KEY)
        if (ni is not None and ni.value == "scalar" and ni.kind in (OpKind.SHAPE, OpKind.GETITEM)) or is_detach(node) \
                or node in recomputed:
            graph.erase_node(node)
    for node in list(graph.nodes):
        if node.op == "get_attr" and not node.users:
            graph.erase_node(node)


def _refuse_weights_sent(gm: fx.GraphModule, owner: dict[fx.Node, int], last_need: dict[fx.Node, int],
                         schedule: str) -> None:
    """Under torch's split backward a stage after the first finds its weight gradients from the
    graph between its inputs and outputs; a value it sends that is computed from its weights alone
    (analysis/recompute.py) is outside that graph, and those weights would train without gradients."""
    alone = from_weights_alone(gm.graph)
    for v, last in last_need.items():
        if v in alone and 0 < owner[v] < last:
            module = info(v).module or v.name
            raise GraphsplitError(
                f"stage {owner[v]} sends {v.name} (module {module}), computed from its weights alone: under "
                f"{schedule!r} those weights would get no gradient (torch's split backward never follows a send); "
                f"cut elsewhere (--split-at) or use interleaved-1f1b"
            )
