"""checkpoint: wrap regions of each stage in non-reentrant activation checkpointing.

Policies (Plan.checkpoint, `--checkpoint`):

- `none`: nothing is recomputed.
- `blocks`: each repeated block (a child of a ModuleList/Sequential: `h.3`,
  `layers.7`) is a region, recomputed whole in backward. The ops that follow a
  block in the same stage and read nothing the block's region does not already
  keep (the final norm and LM head after the last block, a downsample between
  blocks) join that region, so a stage keeps little more than its block
  inputs; the tail is then recomputed in backward too. Ops before the first
  block of a stage (embeddings, which keep only their indices) stay outside.
- `every:K`: K consecutive blocks per region (with the same tail rule).
- `first:N`: the first N blocks of each stage are regions, recomputed whole; the others keep
  their activations (Megatron's `--recompute-method block --recompute-num-layers N`): as much
  recompute as memory needs, not a whole forward.
- `stage`: a whole stage is one region: it keeps only the stage's inputs.
- `selective`: each block is a region that keeps the outputs of its
  matmul/attention ops and recomputes only the cheap ops around them; `selective:K` keeps
  its attention outputs and one matmul output in K (torchtitan's op-level policy at 2: half
  the matmuls recomputed).
- `attention`: each written-out attention's core (the scores' matmul to the values' weighted
  sum: analysis/attention_cores.py) is a region, recomputed whole; everything else keeps its
  activations (Megatron's `--recompute-granularity selective`). A model whose attention is all
  fused (`scaled_dot_product_attention`, which keeps no scores) is refused.

Per-module overrides (Plan.checkpoint_overrides, `--checkpoint-module GLOB=POLICY`):
GLOB is an fnmatch pattern over module paths (`h.0`, `layers.1*`, `h.*.mlp`);
POLICY is `none` (never checkpointed), `full` (the module is one region,
recomputed whole) or `selective` (one region keeping its matmul outputs). A
node takes the last override whose glob matches its module or a module that
encloses it (the outermost such module is the region); other nodes follow
Plan.checkpoint. A glob that matches no module is an error.

    Plan(pp=2, checkpoint="blocks", checkpoint_overrides=(("h.0", "none"), ("h.1*", "selective")))
    # h.0 runs plainly, h.1 keeps its matmul outputs, h.2 and h.3 (+ ln_f, lm_head) recompute

Regions never cross a pipeline boundary (the pass runs after
pipeline_split). A region becomes one `CheckpointRegion` submodule called as
`ckpt_N` and its outputs are read back with getitem, so stage code shows
where recomputation happens. Results are bit-identical in fp32: the same ops
run on the same values, twice.

Values computed from weights, buffers and sizes alone (analysis/recompute.py: a
RoPE table cut to the sequence, a weight's cast) never enter or leave a region as
such: a region computes the ones it reads from the weights, and the ones read
after it are computed again where they are read. So a region keeps none of them
for backward, and no stage sends one (under the zero-bubble schedules a weight's
value sent on would reach its gradient only through the send, which torch's split
weight backward never follows).
"""

from __future__ import annotations

import difflib
import operator
from dataclasses import dataclass
from fnmatch import fnmatchcase

import torch.fx as fx

from ..analysis.attention_cores import NO_CORES, attention_cores
from ..analysis.recompute import recomputable
from ..errors import GraphsplitError
from ..ir.meta import META_KEY, NodeInfo, block_of, info
from ..ir.op_kinds import OpKind
from ..ir.param_grads import mutates
from ..ir.walk import reachable
from ..ops.activation_checkpoint import CheckpointRegion
from ..plan import SPLIT_BACKWARD_SCHEDULES, Plan
from .manager import PassInput, PassResults

_UNPLACED = ("placeholder", "get_attr", "output")


@dataclass
class Region:
    """Nodes wrapped as one checkpointed call. `unit`: the block, module or stage it covers."""

    nodes: list[fx.Node]
    unit: str
    selective: int = 0  # 0: recomputed whole; K: keeps attention and one matmul output in K
    # made by Plan.checkpoint (not an override): may take the non-block ops that follow it
    from_policy: bool = True


def module_names(gm: fx.GraphModule) -> list[str]:
    """Every module path the graph's nodes come from, with the modules enclosing them, in graph order."""
    names: dict[str, None] = {}
    for n in gm.graph.nodes:
        parts = info(n).module.split(".") if info(n).module else []
        for i in range(1, len(parts) + 1):
            names.setdefault(".".join(parts[:i]))
    return list(names)


def _override_rules(gm: fx.GraphModule, overrides: tuple[tuple[str, str], ...]) -> dict[str, tuple[str, str]]:
    """module path -> (the module its override names, policy) for every module an override reaches."""
    names = module_names(gm)
    for glob, _ in overrides:
        if not any(fnmatchcase(m, glob) for m in names):
            close = difflib.get_close_matches(glob, names, n=4, cutoff=0.5)
            shown = close or sorted(names, key=lambda m: (m.count("."), names.index(m)))[:8]
            raise GraphsplitError(f"Plan.checkpoint_overrides: {glob!r} matches no module; "
                                  f"modules are e.g. {', '.join(shown)} ({len(names)} in all)")
    rules: dict[str, tuple[str, str]] = {}
    for module in names:
        parts = module.split(".")
        for glob, policy in overrides:  # in order: the last match wins
            # the outermost matching module is the region: `h.*` makes h.3 one region, not h.3.attn
            unit = next((".".join(parts[:i]) for i in range(1, len(parts) + 1)
                         if fnmatchcase(".".join(parts[:i]), glob)), None)
            if unit is not None:
                rules[module] = (unit, policy)
    return rules


def regions(gm: fx.GraphModule, plan: Plan | str) -> list[Region]:
    """Contiguous runs of nodes to checkpoint, each inside one stage."""
    plan = plan if isinstance(plan, Plan) else Plan(checkpoint=plan)
    policy = plan.checkpoint_policy.kind
    every = plan.checkpoint_policy.count if policy == "selective" else 0
    rules = _override_rules(gm, plan.checkpoint_overrides)
    seq = [n for n in gm.graph.nodes if n.op not in _UNPLACED]
    pos = {n: i for i, n in enumerate(seq)}

    def key(node: fx.Node) -> tuple | None:
        """(stage, unit, selective, from_policy) of the region a node belongs to; None: no region."""
        stage, module = info(node).stage, info(node).module
        if module in rules:
            unit, rule = rules[module]
            return None if rule == "none" else (stage, unit, int(rule == "selective"), False)
        if policy in ("none", "attention"):  # attention: its cores, below
            return None
        if policy == "stage":
            return (stage, f"stage {stage}", False, True)
        block = block_of(module)
        return None if block is None else (stage, block, every, True)

    runs: list[Region] = []
    prev = None
    for node in seq:
        k = key(node)
        if k is not None and k == prev:
            runs[-1].nodes.append(node)
        elif k is not None:
            runs.append(Region([node], k[1], k[2], k[3]))
        prev = k
    parsed = plan.checkpoint_policy
    if parsed.kind == "every":
        runs = _merge_every(runs, parsed.count, pos)
    if parsed.kind == "first":
        runs = _first_of_each_stage(runs, parsed.count)
    if parsed.kind in ("blocks", "every"):
        free = [n for n in seq if key(n) is None and info(n).module not in rules]
        _take_tails(runs, seq, pos, set(free))
    if parsed.kind == "attention":
        runs = sorted(runs + _cores(gm, rules), key=lambda r: pos[r.nodes[0]])
    return [r for r in runs if any(info(n).flops for n in r.nodes) and _no_containers_leave(r.nodes)]


def _cores(gm: fx.GraphModule, rules: dict[str, tuple[str, str]]) -> list[Region]:
    """`--checkpoint attention`'s regions: each written-out attention's core inside one stage, where no
    override names its module (analysis/attention_cores.py)."""
    found = []
    for core in attention_cores(gm):
        if len({info(n).stage for n in core}) == 1 and not any(info(n).module in rules for n in core):
            found.append(Region(core, f"{info(core[0]).module or 'the model'}: attention core"))
    return found


def _first_of_each_stage(runs: list[Region], count: int) -> list[Region]:
    """The policy's first `count` block regions of each stage (overrides' regions all stay)."""
    seen: dict[int | None, int] = {}
    kept: list[Region] = []
    for run in runs:
        if run.from_policy:
            stage = info(run.nodes[0]).stage
            seen[stage] = seen.get(stage, 0) + 1
            if seen[stage] > count:
                continue
        kept.append(run)
    return kept


def _merge_every(runs: list[Region], size: int, pos: dict[fx.Node, int]) -> list[Region]:
    merged: list[Region] = []
    for run in runs:
        last = merged[-1] if merged else None
        if (last and last.from_policy and run.from_policy and pos[last.nodes[-1]] + 1 == pos[run.nodes[0]]
                and info(last.nodes[-1]).stage == info(run.nodes[0]).stage
                and len({block_of(info(n).module) for n in last.nodes}) < size):
            last.nodes.extend(run.nodes)
            last.unit = f"{last.unit.split('..')[0]}..{run.unit}"
        else:
            merged.append(Region(list(run.nodes), run.unit, run.selective, run.from_policy))
    return merged


def _take_tails(runs: list[Region], seq: list[fx.Node], pos: dict[fx.Node, int], free: set[fx.Node]) -> None:
    """Each full region made by the policy takes the non-block ops right after it in its stage
    (the final norm and LM head, a downsample between blocks) while they read only values the
    region computes or already keeps: the region then keeps exactly what it kept before, and
    what those ops would have saved for backward is recomputed instead."""
    for region in runs:
        if region.selective or not region.from_policy:
            continue  # a selective tail would keep the LM head's logits: more, not less
        members = set(region.nodes)
        kept = {a for n in region.nodes for a in n.all_input_nodes if a not in members}
        stage = info(region.nodes[-1]).stage
        taken: list[fx.Node] = []
        i = pos[region.nodes[-1]] + 1
        while i < len(seq) and seq[i] in free and info(seq[i]).stage == stage:
            node = seq[i]
            if any(a not in members and a not in kept and a.op != "get_attr" and info(a).value != "scalar"
                   for a in node.all_input_nodes):
                break  # would make the region keep a tensor it does not keep now
            if node.op != "call_module" and mutates(node, str(getattr(node.target, "__name__", node.target)).lower()):
                break  # in-place updates stay outside a region, where they surely run once
            members.add(node)
            taken.append(node)
            i += 1
        while taken and not _no_containers_leave(region.nodes + taken):
            members.discard(taken.pop())
        region.nodes.extend(taken)
        free.difference_update(taken)


def _no_containers_leave(region: list[fx.Node]) -> bool:
    members = set(region)
    return all(info(n).value != "container" for n in region if any(u not in members for u in n.users))

def _wrap(gm: fx.GraphModule, found: Region, index: int, recomp: set[fx.Node], backward_twice: bool,
          recompute: bool = True) -> None:
    region = found.nodes
    members = set(region)
    # tensors the region reads that come from weights and buffers alone (a RoPE table cut to the
    # sequence, a weight's cast) are computed inside it from them: not kept as region inputs
    pulled = _recomputed_inputs(region, members, recomp)
    inputs: list[fx.Node] = []
    for n in pulled + region:
        for a in n.all_input_nodes:
            if a not in members and a not in pulled and a.op != "get_attr" and a not in inputs:
                inputs.append(a)
    leaving = [n for n in region if any(u not in members for u in n.users)]
    # What a stage could compute for itself (analysis/recompute.py) is recomputed outside, never
    # returned: a size from the tensor it reads (which leaves the region instead), a cast or
    # transpose of a weight from the weight. Later stages then recompute them too, never receive
    # them: a weight's value sent to the next stage would reach its gradient only through the
    # send, which torch's split backward (zero-bubble schedules) never follows.
    own = [n for n in leaving if n in recomp]
    needed = _recomputed_chain(own, members, recomp)
    roots = [a for n in needed for a in n.all_input_nodes if a in members and a not in needed]
    outputs = [n for n in region if (n in leaving and n not in own) or n in roots]
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

    for n in pulled + region:
        env[n] = sub.node_copy(n, get)
    sub.output(tuple(env[o] for o in outputs))
    for n in reversed(needed):  # recomputed outside only: not computed in here as well
        if not env[n].users:
            sub.erase_node(env[n])
    for n in list(sub.nodes):
        if n.op == "get_attr" and not n.users:  # nor its weight held by this stage for nothing
            sub.erase_node(n)
    name = f"ckpt_{index}" if recompute else f"block_{index}"
    gm.add_submodule(name, CheckpointRegion(fx.GraphModule(gm, sub, class_name="Region"), found.selective, backward_twice,
                                            recompute))
    stage = info(region[0]).stage
    with gm.graph.inserting_before(region[0]):
        call = gm.graph.call_module(name, tuple(inputs))
    call.meta = {k: v for k, v in region[0].meta.items() if k in ("nn_module_stack",)}
    call.meta[META_KEY] = NodeInfo(kind=OpKind.CHECKPOINT, value="container", module=info(region[0]).module,
                                       stage=stage, flops=sum(info(n).flops for n in region))
    call.meta[META_KEY].extra.update(
        region=[n.name for n in region], unit=found.unit,
        policy="none" if not recompute else ("selective" + (f":{found.selective}" if found.selective > 1 else ""))
        if found.selective else "full",
        modules=list(dict.fromkeys(info(n).module for n in region)))
    top = next(n for n in gm.graph.nodes if n.op != "placeholder")
    for a in {a for n in needed for a in n.all_input_nodes if a.op == "get_attr"} - {top}:
        top.prepend(a)  # the weights the outside chain reads, defined before any use (they read nothing)
    with gm.graph.inserting_before(call.next):  # in order, right after the call
        reads = []
        for i, o in enumerate(outputs):
            r = gm.graph.call_function(operator.getitem, (call, i))
            r.meta = {META_KEY: NodeInfo(**{**info(o).__dict__, "kind": OpKind.GETITEM, "flops": 0, "bytes_moved": 0})}
            reads.append(r)
    outside = dict(zip(outputs, reads))
    with gm.graph.inserting_before((reads[-1] if reads else call).next):  # keeps the copies in order
        for n in needed:  # the recomputed chain, again, on the region's outputs
            copy = gm.graph.node_copy(n, lambda a: outside.get(a, a))
            copy.meta = {META_KEY: NodeInfo(**{**info(n).__dict__})}
            outside[n] = copy
    for o, r in outside.items():
        o.replace_all_uses_with(r, delete_user_cb=lambda u: u not in members)
    for n in reversed(region):
        gm.graph.erase_node(n)
    for n in reversed(pulled):  # computed in the region now, and read nowhere else
        if not n.users:
            gm.graph.erase_node(n)


def _recomputed_inputs(region: list[fx.Node], members: set[fx.Node], recomp: set[fx.Node]) -> list[fx.Node]:
    """The tensors outside the region, computed from weights, buffers and sizes alone, that it reads
    (and the ones they are computed from), in graph order."""
    def taken(a: fx.Node) -> bool:
        return a not in members and a in recomp and a.op != "get_attr" and info(a).value == "tensor"

    found = set(reachable([a for n in region for a in n.all_input_nodes if taken(a)],
                          lambda a: [b for b in a.all_input_nodes if taken(b)]))
    return [n for n in region[0].graph.nodes if n in found]


def _recomputed_chain(leaving: list[fx.Node], members: set[fx.Node], recomp: set[fx.Node]) -> list[fx.Node]:
    """The region's recomputable nodes that `leaving` are computed from, in graph order."""
    found = set(reachable(leaving, lambda n: [a for a in n.all_input_nodes if a in members and a in recomp]))
    return [n for n in next(iter(members)).graph.nodes if n in found]


@dataclass(frozen=True)
class CheckpointRegions:
    """The nodes each `ckpt_N` region holds, by name, in order."""

    regions: tuple[tuple[str, ...], ...]


def checkpoint_pass(gm: fx.GraphModule, inp: PassInput, done: PassResults) -> tuple[fx.GraphModule, CheckpointRegions | None]:
    plan = inp.plan
    plain = plan.checkpoint == "none" and not plan.checkpoint_overrides
    if plain and not plan.block_regions:
        return gm, None
    # FSDP with one stage and no checkpointing: each block still a region of its own, run plainly (`block_N`),
    # so FSDP shards and gathers it as a unit (ir/regions.py: fsdp_units)
    found = regions(gm, "blocks" if plain else plan)
    if plan.checkpoint_policy.kind == "attention" and not any(r.unit.endswith("attention core") for r in found):
        raise GraphsplitError(NO_CORES)
    for i, region in enumerate(found):
        _wrap(gm, region, i, recomputable(gm.graph), plan.schedule in SPLIT_BACKWARD_SCHEDULES, recompute=not plain)
    gm.recompile()
    return gm, CheckpointRegions(tuple(tuple(n.name for n in r.nodes) for r in found))
