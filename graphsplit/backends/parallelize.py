"""This rank's stage modules made distributed, one concern per step, as torchtitan's
`parallelize_*` functions read:

    apply_tp        the graphs' tp communicators bound to the mesh's tp group
    apply_cp        context parallelism: the graphs' attention exchanges bound to the cp group
    apply_ep        expert parallelism: the graphs' token exchanges bound to the ep group, and the
                    averager of the expert weights' gradients (DDP leaves them alone)
    apply_sync_bn   synchronized BatchNorm layers bound to the dp group
    apply_replicas  the gathers before a model's whole-batch tail (CLIP's logits) bound to the dp group
    apply_compile   --compile: each stage under torch.compile (compile_stages.py)
    apply_fsdp      FSDP2 `fully_shard` over the dp axis (ZeRO-3, or ZeRO-2: gathered once a step)
    tied_groups     one group per tied parameter over the pp ranks holding a copy
    apply_ddp       DistributedDataParallel over the dp axis (plain dp); under the split-backward
                    schedules, whose autograd.grad DDP never sees, a `DPGradAverager` instead
    grad_scaler     fp16: one loss scale for the whole world
    build_schedule  `torch.distributed.pipelining`'s schedule over the pp axis

Each is a free function of (modules, mesh, plan); every process group comes from
the mesh handed in (the loss scaler's is the default group, which the whole mesh
spans). `parallelize_stages` calls them in order.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.distributed.device_mesh import DeviceMesh

from ..errors import GraphsplitError
from ..ir.op_kinds import op_name
from ..ir.program import Program
from ..ops.context_parallel import CPComm
from ..ops.ep import EPComm
from ..ops.replica_gather import bind_replicas
from ..ops.sync_batch_norm import bind_dp_group
from ..ops.tp_comm import TPComm, bind_tp_group
from ..plan import MULTI_STAGE_SCHEDULES, SCHEDULES, Plan
from ..runtime.grad_average import DPGradAverager, ExpertGradAverager
from ..runtime.microbatch import stage_output_dims, target_batch_dim, whole_target
from ..runtime.training import LossFn
from .compile_stages import apply_compile
from .local import LocalPipeline
from .torch_distributed import DistributedPipeline, stage_examples


def apply_tp(modules: Iterable[nn.Module], mesh: DeviceMesh, plan: Plan) -> TPComm:
    """Bind every tp communicator inside `modules` to the mesh's tp group. Returns one more
    communicator on that group, for gathering a sharded output to show it."""
    group = mesh.get_group("tp") if plan.tp > 1 else None
    shown = TPComm(plan.tp)
    for module in (*modules, shown):
        bind_tp_group(module, group)
    return shown


def dp_groups(mesh: DeviceMesh, parts: Sequence[range]) -> dist.ProcessGroup | None:
    """A process group for each part of the dp ranks (`parts`: dp indices) at every (pp, tp) place of
    the mesh; this rank's. Every rank calls `new_group` for every group, in one order."""
    grid = mesh.mesh  # global ranks, shape (dp, pp, tp)
    me = dist.get_rank()
    mine: dist.ProcessGroup | None = None
    for p in range(grid.shape[1]):
        for t in range(grid.shape[2]):
            for part in parts:
                ranks = [int(grid[d, p, t]) for d in part]
                group = dist.new_group(ranks)
                if me in ranks:
                    mine = group
    return mine


def apply_ep(program: Program, modules: Mapping[int, nn.Module], mesh: DeviceMesh) -> ExpertGradAverager | None:
    """Expert parallelism: the graphs' expert communicators bound to this rank's expert-parallel group
    (ep consecutive dp ranks at one (pp, tp) place), and the averager of the expert weights' gradients
    over the ranks holding the same experts in the other groups. Every rank calls `new_group` for every
    group, in one order."""
    plan = program.plan
    if plan.ep == 1:
        return None
    mine = dp_groups(mesh, [range(first, first + plan.ep) for first in range(0, plan.dp, plan.ep)])
    replicas = dp_groups(mesh, [range(j, plan.dp, plan.ep) for j in range(plan.ep)]) if plan.dp > plan.ep else None
    for module in modules.values():
        for sub in module.modules():
            if isinstance(sub, EPComm):
                sub.bind(mine)
    return ExpertGradAverager(expert_parameters(program, modules), replicas, plan.dp, mine)


def apply_cp(modules: Iterable[nn.Module], mesh: DeviceMesh, plan: Plan) -> None:
    """Context parallelism: the graphs' attention exchanges bound to this rank's context-parallel group
    (cp consecutive dp ranks at one (pp, tp) place: they hold the same samples, each its shard of
    every sequence). Every rank calls `new_group` for every group, in one order."""
    if plan.cp == 1:
        return
    mine = dp_groups(mesh, [range(first, first + plan.cp) for first in range(0, plan.dp, plan.cp)])
    for module in modules:
        for sub in module.modules():
            if isinstance(sub, CPComm):
                sub.bind(mine)


def expert_parameters(program: Program, modules: Mapping[int, nn.Module]) -> list[nn.Parameter]:
    """This rank's expert weights (its experts' slices), each once."""
    found: dict[int, nn.Parameter] = {}
    for index, module in modules.items():
        for local, canonical in program.stages[index].param_sources.items():
            if program.is_expert(canonical):
                p = module.get_parameter(local)
                found.setdefault(id(p), p)
    return list(found.values())


def apply_sync_bn(modules: Iterable[nn.Module], mesh: DeviceMesh, plan: Plan) -> None:
    """--sync-bn: BatchNorm statistics over the dp replicas (a no-op without dp)."""
    if plan.sync_bn and plan.dp > 1:
        for module in modules:
            bind_dp_group(module, mesh.get_group("dp"))


def sparse_gradients(module: nn.Module) -> bool:
    """Whether a graph in `module` looks a weight up with `sparse=True` (its gradient a sparse tensor)."""
    for sub in module.modules():
        if isinstance(sub, (nn.Embedding, nn.EmbeddingBag)) and sub.sparse:
            return True
        graph = getattr(sub, "graph", None)
        for node in graph.nodes if isinstance(graph, torch.fx.Graph) else ():
            name = op_name(node) if node.op == "call_function" else ""
            flag = _SPARSE_ARG.get(name)
            aten = isinstance(node.target, torch._ops.OpOverload)  # F.* take it by keyword
            if flag is not None and (node.kwargs.get("sparse") or (aten and len(node.args) > flag and node.args[flag] is True)):
                return True
    return False


# where the `sparse` flag sits in each lookup's arguments (aten's and torch.nn.functional's spellings)
_SPARSE_ARG = {"embedding": 4, "embedding_bag": 5, "_embedding_bag": 5, "_embedding_bag_forward_only": 5}


def apply_replicas(modules: Iterable[nn.Module], mesh: DeviceMesh, plan: Plan) -> None:
    """The gathers before a whole-batch tail (passes/replica_gather.py) run over the dp group."""
    if plan.dp > 1:
        for module in modules:
            bind_replicas(module, mesh.get_group("dp"))


def apply_fsdp(modules: Iterable[nn.Module], mesh: DeviceMesh, autocast: str | None = None,
               ignored: frozenset[int] = frozenset(), units: Sequence[Sequence[str]] = (),
               reshard_after_forward: bool = False) -> None:
    """ZeRO-3: FSDP2 `fully_shard` over the mesh's dp axis, the regions each module's `units` name units
    of their own (`Program.fsdp_units`: its blocks, checkpointed or, with one stage and no checkpointing,
    run plainly as `block_N`; as torchtitan wraps each transformer block), then each stage module (the rest).

    Parameters (already this tp rank's shards) become DTensors sharded on dim 0 over
    the dp replicas; FSDP gathers them around each forward and backward and
    reduce-scatters the gradients (averaged over dp). The pipelining stage drives
    FSDP's last-backward hooks across micro-batches. Under `--autocast bf16` (fp16) the
    parameters are gathered and computed in that dtype, the sharded fp32 ones stay the
    optimizer's master weights, and gradients are reduced in fp32 (FSDP2's MixedPrecisionPolicy,
    as torchtitan trains): half the gathered bytes, half the all-gather's time. `ignored`: ids of
    parameters FSDP leaves alone (expert weights under ep: each ep rank holds its own experts whole,
    their gradients averaged by `ExpertGradAverager`). `reshard_after_forward`: a region frees its
    gathered parameters after its forward and gathers them again for its backward (one micro-batch,
    no pipeline: a stage holds about two regions' parameters at once, not all of them); under a
    pipeline they stay gathered between micro-batches, as torchtitan keeps them under pp.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(autocast or "")
    # inputs are left as they come: the program's own casts decide each op's dtype (passes/autocast.py)
    policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32, cast_forward_inputs=False) \
        if low is not None else MixedPrecisionPolicy()  # the default: no casts
    for i, module in enumerate(modules):
        for region in (module.get_submodule(name) for name in (units[i] if units else ())):
            skip = {p for p in region.parameters() if id(p) in ignored}
            fully_shard(region, mesh=mesh["dp"], mp_policy=policy, ignored_params=skip or None,
                        reshard_after_forward=reshard_after_forward)
        skip = {p for p in module.parameters() if id(p) in ignored}
        fully_shard(module, mesh=mesh["dp"], mp_policy=policy, ignored_params=skip or None)


def tied_groups(program: Program, mesh: DeviceMesh) -> dict[str, dist.ProcessGroup]:
    """One group per tied parameter over the pp ranks holding a copy, per (dp, tp) position; this
    rank's groups by parameter name (every rank calls `new_group` for every group)."""
    groups: dict[str, dist.ProcessGroup] = {}
    grid = mesh.mesh  # global ranks, shape (dp, pp, tp)
    me = dist.get_rank()
    for name in sorted(program.shared_params):
        pp_ranks = sorted({program.plan.stage_rank(s) for s in program.shared_params[name]})
        if len(pp_ranks) < 2:
            continue
        for d in range(grid.shape[0]):
            for t in range(grid.shape[2]):
                ranks = [int(grid[d, r, t]) for r in pp_ranks]
                group = dist.new_group(ranks)
                if me in ranks:
                    groups[name] = group
    return groups


def apply_ddp(modules: Mapping[int, nn.Module], mesh: DeviceMesh, device: torch.device,
              skip: frozenset[int] = frozenset()) -> dict[int, nn.Module]:
    """Plain dp: each stage in DDP over the dp axis (bucketed all-reduces overlapped with the last
    micro-batch's backward). Buffers are not broadcast from replica 0 at each forward: each replica
    keeps its own BatchNorm statistics, or all share global ones with --sync-bn. `skip`: ids of
    parameters DDP leaves alone (expert weights: each replica holds other experts). Returns what the
    schedule runs, by stage."""
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device.index] if device.type == "cuda" else None
    for m in modules.values():
        ignored = [name for name, p in m.named_parameters(remove_duplicate=False) if id(p) in skip]
        if ignored:
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(m, ignored)
    return {
        s: DistributedDataParallel(m, device_ids=device_ids, process_group=mesh.get_group("dp"), broadcast_buffers=False)
        if any(p.requires_grad for p in m.parameters()) else m  # nothing to average
        for s, m in modules.items()
    }


def grad_scaler(device: torch.device) -> Any:
    """fp16: one loss scale for the whole world; an overflow on any rank skips the step everywhere.

    `ShardedGradScaler` all-reduces its found-inf flags over the process group it is
    given: here every rank (all pp stages, tp shards and dp replicas), so all ranks
    agree to step or to skip, and all keep the same scale.
    """
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    scaler = ShardedGradScaler(device=device.type, process_group=dist.group.WORLD)
    scaler.scale(torch.ones((), device=device))  # creates the scale on ranks that never see a loss
    return scaler


def schedule_class(name: str) -> type:
    """torch.distributed.pipelining's class for schedule `name`, or one line saying this torch lacks it
    (graphsplit accepts torch >= 2.6; the zero-bubble and DualPipeV schedules came later)."""
    import torch.distributed.pipelining as pipelining

    cls = getattr(pipelining, SCHEDULES[name], None)
    if cls is None:
        raise GraphsplitError(f"schedule {name!r} needs torch.distributed.pipelining.{SCHEDULES[name]}, which torch "
                              f"{torch.__version__} does not have; upgrade torch or choose another --schedule")
    return cls


def output_merge_spec(outputs: Any, microbatches: int, dims: list[int | None] | None = None) -> Any:
    """How the schedule joins the last stage's outputs over the micro-batches: batched tensors
    along their batch dims (`dims`, per output; torch's default is dim 0), a scalar (the model's own
    loss) as the mean of the micro-batches' values, as their losses are combined, a tensor with no
    batch dim as the first micro-batch's (each holds it whole); `runtime/microbatch.join_outputs`
    does the same."""
    from torch.distributed.pipelining.microbatch import TensorChunkSpec, _CustomReducer

    leaves, spec_tree = pytree.tree_flatten(outputs)
    dims = [0] * len(leaves) if dims is None else dims
    if len(dims) != len(leaves):
        raise GraphsplitError(f"internal: {len(dims)} batch dims for the last stage's {len(leaves)} outputs")

    def spec(t: Any, dim: int | None) -> Any:
        if isinstance(t, torch.Tensor) and t.dim() == 0:
            return _CustomReducer(torch.tensor(0.0), lambda acc, value: acc + value / microbatches)
        if dim is None:
            return _CustomReducer(None, lambda acc, value: value if acc is None else acc)
        return TensorChunkSpec(dim)

    return pytree.tree_unflatten([spec(t, d) for t, d in zip(leaves, dims)], spec_tree)


def input_chunk_spec(program: Program) -> tuple[Any, ...]:
    """How the schedule cuts the first stage's inputs (the flat inputs): along each one's batch dim,
    or whole to every micro-batch (a position table, a shared mask)."""
    from torch.distributed.pipelining.microbatch import TensorChunkSpec, _Replicate

    return tuple(TensorChunkSpec(d) if d is not None else _Replicate()
                 for d in program.batch.input_dims(program.traced.input_names))


def build_schedule(program: Program, runners: Mapping[int, nn.Module], loss_fn: LossFn, mesh: DeviceMesh,
                   device: torch.device) -> Any:
    """The pipeline schedule over the pp axis driving this rank's stages.

    One stage: no pipeline, the micro-batches run directly (a one-stage schedule would
    cost an extra forward on step 1 for its shape inference, collectives included)."""
    import torch.distributed.pipelining as pipelining

    plan = program.plan
    if plan.num_stages == 1:
        return LocalPipeline(program, [runners[0]], loss_fn)
    examples = stage_examples(program)
    stages = [
        pipelining.PipelineStage(module, index, plan.num_stages, device, group=mesh.get_group("pp"),
                                 input_args=examples[index][0], output_args=examples[index][1])
        for index, module in sorted(runners.items())
    ]
    cls = schedule_class(plan.schedule)
    moved = target_batch_dim(program)
    inner = loss_fn
    if moved is not None:  # torch cuts a target along dim 0: it arrives batch-first (`batch_first`), turned back here
        def loss_fn(output: Any, target: Any) -> torch.Tensor:
            return inner(output, target.movedim(0, moved))
    elif whole_target(program):  # no batch dim: each micro-batch got one copy of it (`batch_first`)
        def loss_fn(output: Any, target: Any) -> torch.Tensor:
            return inner(output, target[0])

    common: dict[str, Any] = dict(n_microbatches=plan.num_microbatches, loss_fn=loss_fn, scale_grads=True,
                                  output_merge_spec=output_merge_spec(examples[-1][1], plan.num_microbatches,
                                                                      stage_output_dims(program)))
    if any(d != 0 for d in program.batch.input_dims(program.traced.input_names)):
        if "args_chunk_spec" not in inspect.signature(cls.__init__).parameters:
            raise GraphsplitError(f"schedule {plan.schedule!r} (torch's {cls.__name__}) cuts every input along dim 0 "
                                  f"and this model's batch is not there ({program.batch.describe(program.traced.input_names)}); "
                                  "choose another --schedule (1f1b, gpipe, interleaved-1f1b)")
        common["args_chunk_spec"] = input_chunk_spec(program)
    if plan.schedule in MULTI_STAGE_SCHEDULES:
        return cls(stages, **common)
    (only,) = stages
    return cls(only, **common)


def parallelize_stages(program: Program, modules: Mapping[int, nn.Module], loss_fn: LossFn, mesh: DeviceMesh,
                       device: torch.device) -> DistributedPipeline:
    """This rank's materialized stage modules -> the pipeline that trains them."""
    plan = program.plan
    loss_graphs = [program.loss_gm] if program.loss_gm is not None else []
    output_comm = apply_tp([*modules.values(), *loss_graphs], mesh, plan)
    apply_sync_bn(modules.values(), mesh, plan)
    apply_replicas(modules.values(), mesh, plan)
    apply_cp(modules.values(), mesh, plan)
    if plan.compile:  # before FSDP and DDP wrap the modules, as torchtitan orders them
        apply_compile(modules.values())
    experts = apply_ep(program, modules, mesh)
    skip = frozenset(id(p) for p in experts.params) if experts is not None else frozenset()
    if plan.fsdp:  # a unit per block region (not under a split backward: one unit per stage there)
        apply_fsdp(modules.values(), mesh, plan.autocast, skip, [program.fsdp_units(i) for i in modules],
                   reshard_after_forward=plan.fsdp_reshards)
    tied = tied_groups(program, mesh)
    runners, averager = dict(modules), None
    if plan.dp > 1 and not plan.fsdp:
        # weight gradients by autograd.grad: no DDP hook fires; a sparse gradient DDP takes for a dense one
        # (it knows only nn.Embedding modules' `sparse`, not a traced graph's embedding_bag(sparse=True))
        if not plan.ddp or any(sparse_gradients(m) for m in modules.values()):
            averager = DPGradAverager(modules.values(), mesh.get_group("dp"), skip=skip)
        else:
            runners = apply_ddp(modules, mesh, device, skip)
    scaler = grad_scaler(device) if plan.autocast == "fp16" else None
    objective = loss_fn
    if scaler is not None:
        def objective(output: Any, target: Any) -> torch.Tensor:
            return scaler.scale(loss_fn(output, target))

    schedule = build_schedule(program, runners, objective, mesh, device)
    return DistributedPipeline(program, dict(modules), mesh, schedule, tied, scaler, output_comm, averager, experts)
