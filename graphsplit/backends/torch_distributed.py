"""torch_distributed backend: this rank's stages on real process groups.

The device mesh has three named axes, (dp, pp, tp); pipeline stages talk over
the pp axis through `torch.distributed.pipelining` (`PipelineStage` built from
our own stage GraphModules, and its schedules), tp collectives over the tp
axis, and with dp > 1 each stage module is wrapped in DistributedDataParallel
over the dp axis (gradients averaged by bucketed all-reduces during the last
micro-batch's backward) or, with `fsdp`, FSDP2-sharded over it (ZeRO-3). gloo on CPU, nccl on CUDA.
Copies of a tied parameter on several pp ranks get the sum of their
gradients through one all-reduce per parameter on a group of just those ranks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.pipelining as pipelining
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor

from ..ir.program import Program
from ..ops import tp as tpops
from ..ops.sync_bn import bind_dp_group
from ..plan import MULTI_STAGE_SCHEDULES, SCHEDULES, Plan
from ..runtime.training import LossFn, sync_tied_grads

DEFAULT_TIMEOUT_S = 120.0
MESH_AXES = ("dp", "pp", "tp")


def init_distributed(timeout_s: float = DEFAULT_TIMEOUT_S) -> torch.device:
    """Join the process group torchrun set up; returns this rank's device."""
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return device


def materialize_rank(program: Program, mesh: DeviceMesh, device: torch.device, source: Any) -> dict[int, nn.Module]:
    """This rank's stage modules: its pp rank's stages, its tp rank's shards."""
    from ..runtime.materialize import materialize_stage

    plan = program.plan
    pp_rank, tp_rank = mesh.get_local_rank("pp"), mesh.get_local_rank("tp")
    return {
        s: materialize_stage(program.stages[s], device, source, plan.seed, program.param_shardings, tp_rank, plan.tp)
        for s in plan.stages_of_rank(pp_rank)
    }


def make_mesh(plan: Plan, device: torch.device, collective_timeout_s: float | None = None) -> DeviceMesh:
    """The (dp, pp, tp) mesh. `collective_timeout_s`: how long any of its groups' operations may wait,
    point-to-point ones included (the pipeline's sends and receives take the timeout their group was
    made with; a later `_set_pg_timeout` reaches only collectives)."""
    world = dist.get_world_size()
    if world != plan.world_size:
        from ..errors import GraphsplitError

        raise GraphsplitError(
            f"the plan needs dp x pp x tp = {plan.dp} x {plan.pp} x {plan.tp} = {plan.world_size} "
            f"processes but {world} were started; launch with --nproc-per-node {plan.world_size}"
        )
    override: dict[int | str, Any] | None = None
    if collective_timeout_s is not None:
        backend = "nccl" if device.type == "cuda" else "gloo"
        options = dist.ProcessGroupNCCL.Options() if backend == "nccl" else dist.ProcessGroupGloo._Options()
        options._timeout = timedelta(seconds=collective_timeout_s)
        override = {axis: (backend, options) for axis in MESH_AXES}
    return init_device_mesh(device.type, (plan.dp, plan.pp, plan.tp), mesh_dim_names=MESH_AXES,
                            backend_override=override)


def stage_examples(program: Program) -> list[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]]:
    """Meta tensors shaped like each stage's inputs and outputs for one micro-batch, on one tp rank.

    Given to `PipelineStage`, they spare it the shape-inference forward it would
    otherwise run on step 1's first micro-batch: a forward whose results are thrown
    away, but which would still update BatchNorm running statistics (with garbage
    inputs on later stages) and run every collective once more.
    """
    from ..analysis.shapes import meta_copy

    plan = program.plan
    out: list[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]] = []
    inputs = program.stages[0].input_examples()
    for st in program.stages:
        names = {id(st.gm.get_parameter(local)): canonical for local, canonical in st.param_sources.items()}
        module = meta_copy(st.gm, program.param_shardings, plan.tp, names)
        if st.index > 0:  # an activation needs a gradient exactly when the sending stage's output had one
            inputs = tuple(t.detach().requires_grad_(t.requires_grad) for t in inputs)
        result = module(*inputs)  # its communicator is unbound: collectives shaped, not run
        outputs = (result,) if isinstance(result, torch.Tensor) else tuple(result)
        out.append((inputs, outputs))
        inputs = outputs
    return out


class DistributedPipeline:
    """This rank's stages and the schedule that drives them."""

    def __init__(
        self,
        program: Program,
        stage_modules: Mapping[int, nn.Module],
        loss_fn: LossFn,
        mesh: DeviceMesh,
        device: torch.device,
    ) -> None:
        self.program = program
        self.plan = plan = program.plan
        self.modules = dict(stage_modules)
        self.mesh = mesh
        self.device = device
        self.pp_rank = mesh.get_local_rank("pp")
        pp_group = mesh.get_group("pp")
        tp_group = mesh.get_group("tp") if plan.tp > 1 else None
        for module in (*self.modules.values(), *([program.loss_gm] if program.loss_gm is not None else [])):
            tpops.bind_tp_group(module, tp_group)
        self.tp_comm = tpops.TPComm(plan.tp)  # for gathering a sharded output to show it
        self.tp_comm.bind(tp_group)
        if plan.sync_bn and plan.dp > 1:
            for module in self.modules.values():
                bind_dp_group(module, mesh.get_group("dp"))
        if plan.fsdp:
            self._shard_over_dp()
        self.is_first = 0 in self.modules
        self.is_last = plan.num_stages - 1 in self.modules
        self._tied_groups = self._make_tied_groups()
        # what the schedule runs: plain dp wraps each stage in DDP over the dp axis (bucketed all-reduces
        # overlapped with the last micro-batch's backward); FSDP reduce-scatters during backward itself
        self.runners: dict[int, nn.Module] = dict(self.modules)
        if plan.dp > 1 and not plan.fsdp:
            self.runners = {s: self._replicate(m) for s, m in self.modules.items()}
        self.loss_group = mesh.get_group("dp") if plan.dp > 1 else None
        self.scaler = self._grad_scaler() if plan.autocast == "fp16" else None
        self._scale_used = 1.0
        if self.scaler is not None:
            unscaled = loss_fn

            def loss_fn(output: Any, target: Any) -> torch.Tensor:  # noqa: F811 - the scaled objective
                return self.scaler.scale(unscaled(output, target))
        if plan.num_stages == 1:
            # No pipeline: run the micro-batches directly. (A one-stage schedule would cost an
            # extra forward on step 1 for its shape inference, collectives included.)
            from .local import LocalPipeline

            self.single = LocalPipeline(program, [self.runners[0]], loss_fn)
            return
        self.single = None
        examples = stage_examples(program)
        self.stages = [
            pipelining.PipelineStage(module, index, plan.num_stages, device, group=pp_group,
                                     input_args=examples[index][0], output_args=examples[index][1])
            for index, module in sorted(self.runners.items())
        ]
        cls = getattr(pipelining, SCHEDULES[plan.schedule])
        common: dict[str, Any] = dict(n_microbatches=plan.num_microbatches, loss_fn=loss_fn, scale_grads=True)
        if plan.schedule in MULTI_STAGE_SCHEDULES:
            self.schedule = cls(self.stages, **common)
        else:
            (only,) = self.stages
            self.schedule = cls(only, **common)

    def _grad_scaler(self) -> Any:
        """fp16: one loss scale for the whole world; an overflow on any rank skips the step everywhere.

        `ShardedGradScaler` all-reduces its found-inf flags over the process group it is
        given: here every rank (all pp stages, tp shards and dp replicas), so all ranks
        agree to step or to skip, and all keep the same scale.
        """
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        scaler = ShardedGradScaler(device=self.device.type, process_group=dist.group.WORLD)
        scaler.scale(torch.ones((), device=self.device))  # creates the scale on ranks that never see a loss
        return scaler

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step `optimizer` (through the loss scaler with fp16); False when an fp16 overflow skipped it."""
        if self.scaler is None:
            optimizer.step()
            return True
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        return self.scaler.get_scale() >= before  # the scale backs off exactly when the step was skipped

    def _replicate(self, module: nn.Module) -> nn.Module:
        """DDP over the dp axis. Buffers are not broadcast from replica 0 at each forward: each
        replica keeps its own BatchNorm statistics, or all share global ones with --sync-bn."""
        from torch.nn.parallel import DistributedDataParallel

        if not any(p.requires_grad for p in module.parameters()):
            return module  # nothing to average
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=device_ids, process_group=self.mesh.get_group("dp"),
                                       broadcast_buffers=False)

    def _shard_over_dp(self) -> None:
        """ZeRO-3: FSDP2 `fully_shard` each stage module over the mesh's dp axis.

        Parameters (already this tp rank's shards) become DTensors sharded on dim 0 over
        the dp replicas; FSDP gathers them around each forward and backward and
        reduce-scatters the gradients (averaged over dp). The pipelining stage drives
        FSDP's last-backward hooks across micro-batches.
        """
        from torch.distributed.fsdp import fully_shard

        dp_mesh = self.mesh["dp"]
        for module in self.modules.values():
            fully_shard(module, mesh=dp_mesh)

    def _make_tied_groups(self) -> dict[str, dist.ProcessGroup | None]:
        """One group per tied parameter over the pp ranks holding it (every rank calls new_group)."""
        groups: dict[str, dist.ProcessGroup | None] = {}
        grid = self.mesh.mesh  # global ranks, shape (dp, pp, tp)
        me = dist.get_rank()
        for name in sorted(self.program.shared_params):
            pp_ranks = sorted({self.plan.stage_rank(s) for s in self.program.shared_params[name]})
            if len(pp_ranks) < 2:
                continue
            for d in range(grid.shape[0]):
                for t in range(grid.shape[2]):
                    ranks = [int(grid[d, r, t]) for r in pp_ranks]
                    group = dist.new_group(ranks)
                    if me in ranks:
                        groups[name] = group
        return groups

    def process_groups(self) -> list[dist.ProcessGroup]:
        """Every group this rank's collectives run on, the default group aside (timeouts are set per group)."""
        groups = [self.mesh.get_group(axis) for axis in MESH_AXES]
        return groups + [g for g in self._tied_groups.values() if g is not None]

    def parameters(self) -> list[nn.Parameter]:
        seen: dict[int, nn.Parameter] = {}
        for module in self.modules.values():
            for p in module.parameters():
                seen.setdefault(id(p), p)
        return list(seen.values())

    def step(self, inputs: tuple[torch.Tensor, ...], target: Any) -> tuple[torch.Tensor | None, Any]:
        """One training step's forward and backward; (mean loss, merged output) on the last stage."""
        if self.scaler is not None:
            self._scale_used = self.scaler.get_scale()
        if self.single is not None:
            loss, output = self.single.step(inputs, target)
        else:
            loss, output = self._pipeline_step(inputs, target)
        if loss is not None and self.scaler is not None:
            loss = loss / self._scale_used
        if self.loss_group is not None and loss is not None:  # every rank of this dp group holds the last stage
            loss = loss.clone()
            dist.all_reduce(loss, group=self.loss_group)
            loss /= self.plan.dp
        return loss, output

    def _pipeline_step(self, inputs: tuple[torch.Tensor, ...], target: Any) -> tuple[torch.Tensor | None, Any]:
        losses: list[torch.Tensor] = []
        args = inputs if self.is_first else ()
        kwargs: dict[str, Any] = {"losses": losses}
        if self.is_last:
            kwargs["target"] = target
        output = self.schedule.step(*args, **kwargs)

        def reduce(name: str, tensor: torch.Tensor) -> None:
            group = self._tied_groups.get(name)
            if group is not None:  # under FSDP each copy is sharded alike: sum the local shards
                dist.all_reduce(tensor.to_local() if isinstance(tensor, DTensor) else tensor, group=group)

        sync_tied_grads(self.program, self.modules, reduce)
        if not self.is_last:
            return None, None
        return torch.stack([loss.detach() for loss in losses]).mean(), output

    def grads(self) -> dict[str, torch.Tensor]:
        """This rank's gradients under the original model's parameter names."""
        found: dict[str, torch.Tensor] = {}
        for index, module in self.modules.items():
            for local, canonical in self.program.stages[index].param_sources.items():
                g = module.get_parameter(local).grad
                if isinstance(g, DTensor):  # FSDP: gather the dp shards (every dp rank calls this)
                    g = g.full_tensor()
                if g is not None:  # fp16: before the optimizer step they are still scaled
                    found[canonical] = (g.detach() / self._scale_used if self.scaler is not None else g.detach()).cpu()
        return found
