"""torch_distributed backend: this rank's stages on real process groups.

The device mesh has three named axes, (dp, pp, tp); pipeline stages talk over
the pp axis through `torch.distributed.pipelining` (`PipelineStage` built from
our own stage GraphModules, and its schedules), tp collectives over the tp
axis, and with dp > 1 each stage module is wrapped in DistributedDataParallel
over the dp axis (gradients averaged by bucketed all-reduces during the last
micro-batch's backward) or, with `fsdp`, FSDP2-sharded over it (ZeRO-3). Under the split-backward
schedules (zero-bubble, zbv, dualpipev), whose weight gradients come from autograd.grad that DDP
never sees, plain dp averages the gradients after the schedule's step instead
(runtime/grad_average.py). gloo on CPU, nccl on CUDA.
Copies of a tied parameter on several pp ranks get the sum of their
gradients through one all-reduce per parameter on a group of just those ranks.

parallelize.py sets these up, one `apply_*` step at a time; `DistributedPipeline`
is what they make: it runs a step, the optimizer step and reports gradients.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..ir.program import Program
from ..ops.ep import EPComm
from ..ops.tp_comm import TPComm
from ..plan import Plan
from ..runtime.grad_average import DPGradAverager, ExpertGradAverager
from ..runtime.microbatch import batch_first
from ..runtime.token_count import counts_tokens, set_factors, token_factors
from ..runtime.training import named_grads, sync_tied_grads
from .local import LocalPipeline

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
    from ..analysis.shapes import meta_copy, run_on_meta

    plan = program.plan
    out: list[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]] = []
    inputs = program.stages[0].input_examples()
    for st in program.stages:
        names = {id(st.gm.get_parameter(local)): canonical for local, canonical in st.param_sources.items()}
        module = meta_copy(st.gm, program.param_shardings, plan.tp, names)
        if st.index > 0:  # an activation needs a gradient exactly when the sending stage's output had one
            inputs = tuple(t.detach().requires_grad_(t.requires_grad) for t in inputs)
        result = run_on_meta(module, *inputs)  # its communicator is unbound: collectives shaped, not run
        outputs = (result,) if isinstance(result, torch.Tensor) else tuple(result)
        out.append((inputs, outputs))
        inputs = outputs
    return out


class DistributedPipeline:
    """This rank's stages and the schedule that drives them (built by parallelize.py's `parallelize_stages`)."""

    def __init__(
        self,
        program: Program,
        modules: dict[int, nn.Module],
        mesh: DeviceMesh,
        schedule: Any,
        tied_groups: Mapping[str, dist.ProcessGroup],
        scaler: Any,
        output_comm: TPComm,
        dp_averager: DPGradAverager | None = None,
        expert_averager: ExpertGradAverager | None = None,
    ) -> None:
        self.program = program
        self.plan = program.plan
        self.modules = modules
        self.mesh = mesh
        self.schedule = schedule  # a pipelining schedule, or with one stage a LocalPipeline
        self.tied_groups = dict(tied_groups)
        self.scaler = scaler  # fp16: the world's loss scaler
        self.tp_comm = output_comm  # for gathering a sharded output to show it
        self.dp_averager = dp_averager  # plain dp under a split-backward schedule (no DDP)
        self.expert_averager = expert_averager  # expert parallelism: the expert weights' gradients
        self.is_first = 0 in modules
        self.is_last = self.plan.num_stages - 1 in modules
        self.loss_group = mesh.get_group("dp") if self.plan.dp > 1 else None
        self._scale_used = 1.0
        # the modules holding means over counted tokens (passes/token_mean.py): the stages, and on the
        # last stage the loss graph; every rank of a dp group holds the same ones
        held = [*modules.values(), *([program.loss_gm] if self.is_last and program.loss_gm is not None else [])]
        self._counted = held if counts_tokens(held) else []

    def _dtensor(self) -> tuple[type, ...]:
        """The type FSDP makes parameters and gradients, imported only under FSDP (DTensor takes
        a second or more to import, in every process)."""
        if not self.plan.fsdp:
            return ()
        from torch.distributed.tensor import DTensor

        return (DTensor,)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step `optimizer` (through the loss scaler with fp16); False when an fp16 overflow skipped it."""
        if self.scaler is None:
            optimizer.step()
            return True
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        return self.scaler.get_scale() >= before  # the scale backs off exactly when the step was skipped

    def clip_grads(self, optimizer: torch.optim.Optimizer, max_norm: float | None) -> float:
        """The global gradient norm over every rank (runtime/clip.py), and with `max_norm` every
        gradient scaled by one factor, as `clip_grad_norm_` does on the untouched model. fp16: the
        gradients are unscaled first (the scaler's step then does not unscale them again)."""
        from ..runtime.clip import global_norm_and_clip

        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

        def world_sum(t: torch.Tensor) -> None:
            dist.all_reduce(t)  # the default group: every rank of the mesh

        return global_norm_and_clip(self.program, self.modules, self.mesh.get_local_rank("tp"),
                                    self.mesh.get_local_rank("dp"), self.plan.fsdp, max_norm, world_sum)

    def process_groups(self) -> list[dist.ProcessGroup]:
        """Every group this rank's collectives run on, the default group aside (timeouts are set per group)."""
        experts = self.expert_averager.groups if self.expert_averager is not None else []
        return [self.mesh.get_group(axis) for axis in MESH_AXES] + list(self.tied_groups.values()) + experts

    def parameters(self) -> list[nn.Parameter]:
        seen: dict[int, nn.Parameter] = {}
        for module in self.modules.values():
            for p in module.parameters():
                seen.setdefault(id(p), p)
        return list(seen.values())

    def count_tokens(self, inputs: tuple[torch.Tensor, ...], target: Any) -> None:
        """Means over counted tokens on this rank: this batch's count, summed over the dp replicas
        (each holds its share), gives their factors (runtime/token_count.py)."""
        if not self._counted:
            return

        def over_replicas(counts: torch.Tensor) -> None:
            if self.loss_group is not None:
                dist.all_reduce(counts, group=self.loss_group)

        set_factors(self._counted, token_factors(self.program, [(inputs, target)], over_replicas))

    def step(self, inputs: tuple[torch.Tensor, ...], target: Any,
             keep_output: bool = True) -> tuple[torch.Tensor | None, Any]:
        """One training step's forward and backward; (mean loss, merged output) on the last stage.
        `keep_output=False`: no output (None), and the last stage does not keep its micro-batches'
        outputs past their losses (see `LocalPipeline.step`)."""
        self.count_tokens(inputs, target)
        if self.scaler is not None:
            self._scale_used = self.scaler.get_scale()
        if isinstance(self.schedule, LocalPipeline):
            loss, output = self.schedule.step(inputs, target, keep_output)
        else:
            loss, output = self._pipeline_step(inputs, target, keep_output)
        if self.expert_averager is not None:
            self.expert_averager.average()
        if loss is not None and self.scaler is not None:
            loss = loss / self._scale_used
        if self.loss_group is not None and loss is not None:  # every rank of this dp group holds the last stage
            loss = loss.clone()
            dist.all_reduce(loss, group=self.loss_group)
            loss /= self.plan.dp
        return loss, output

    def evaluate(self, inputs: tuple[torch.Tensor, ...], target: Any) -> torch.Tensor | None:
        """Forward only, no gradient kept: the batch's mean loss over the dp replicas on the last stage
        (None elsewhere). Runs the pipelining schedule's `eval` (its step without backward)."""
        self.count_tokens(inputs, target)
        with torch.no_grad():
            if isinstance(self.schedule, LocalPipeline):
                loss = self.schedule.evaluate(inputs, target)
            else:
                losses: list[torch.Tensor] = []
                args = inputs if self.is_first else ()
                kwargs: dict[str, Any] = {"losses": losses}
                if self.is_last:
                    kwargs["target"] = batch_first(self.program, target)
                self.schedule.eval(*args, **kwargs)
                loss = torch.stack([x.detach() for x in losses]).mean() if self.is_last else None
        self._reshard()
        if loss is not None and self.scaler is not None:
            loss = loss / self.scaler.get_scale()  # the objective is the scaled loss
        if self.loss_group is not None and loss is not None:
            loss = loss.clone()
            dist.all_reduce(loss, group=self.loss_group)
            loss /= self.plan.dp
        return loss

    def _reshard(self) -> None:
        """Under FSDP, every unit sharded again after a forward with no backward: FSDP2 keeps the root
        unit (and ZeRO-2's units) gathered after a forward, for the backward that would follow; with
        none, the gradients the training steps after it accumulate came out wrong (tests/test_own_script.py)."""
        if not self.plan.fsdp:
            return
        from torch.distributed.fsdp import FSDPModule

        for module in self.modules.values():
            for unit in module.modules():
                if isinstance(unit, FSDPModule):
                    unit.reshard()

    def _pipeline_step(self, inputs: tuple[torch.Tensor, ...], target: Any,
                       keep_output: bool) -> tuple[torch.Tensor | None, Any]:
        losses: list[torch.Tensor] = []
        args = inputs if self.is_first else ()
        kwargs: dict[str, Any] = {"losses": losses}
        if self.is_last:
            kwargs["target"] = batch_first(self.program, target)
        if not keep_output and _takes_return_outputs(self.schedule):
            # the stage then keeps no output chunk and merges none (torch's schedules before this
            # argument keep them until the next step; any other keyword would reach the model)
            kwargs["return_outputs"] = False
        output = self.schedule.step(*args, **kwargs)
        if self.dp_averager is not None:
            self.dp_averager.average()

        dtensor = self._dtensor()

        def reduce(name: str, tensor: torch.Tensor) -> None:
            group = self.tied_groups.get(name)
            if group is not None:  # under FSDP each copy is sharded alike: sum the local shards
                dist.all_reduce(tensor.to_local() if isinstance(tensor, dtensor) else tensor, group=group)

        sync_tied_grads(self.program, self.modules, reduce)
        if not self.is_last:
            return None, None
        return torch.stack([loss.detach() for loss in losses]).mean(), output if keep_output else None

    def expert_tokens(self) -> dict[str, list[int]]:
        """Expert parallelism's load balance: the tokens (routed rows) each expert of each layer received
        since the last call, over the whole global batch, by the layer's module. Every rank calls it
        (one all-reduce over the world); {} without ep."""
        layers = self.program.expert_layers
        if self.plan.ep == 1 or not layers:
            return {}
        width = max(layer.experts for layer in layers)
        table = torch.zeros(len(layers), width, dtype=torch.int64)
        ep_rank = self.mesh.get_local_rank("dp") % self.plan.ep
        comms = {id(c): c for m in self.modules.values() for c in m.modules() if isinstance(c, EPComm)}
        for comm in comms.values():
            for index, counts in comm.take_tokens().items():
                if self.mesh.get_local_rank("tp") == 0:  # tp ranks route the same rows
                    per = layers[index].experts // self.plan.ep
                    table[index, ep_rank * per:(ep_rank + 1) * per] += counts
        device = next(iter(self.parameters()), torch.empty(0)).device
        summed = table.to(device)
        dist.all_reduce(summed)
        return {layer.module: summed[i, :layer.experts].tolist() for i, layer in enumerate(layers)}

    def grads(self) -> dict[str, torch.Tensor]:
        """This rank's gradients under the original model's parameter names."""
        dtensor = self._dtensor()
        found = named_grads(self.program, self.modules)
        for name, g in found.items():
            if isinstance(g, dtensor):  # FSDP: gather the dp shards (every dp rank calls this, in one order)
                g = g.full_tensor()
            # fp16: before the optimizer step they are still scaled
            found[name] = (g.detach() / self._scale_used if self.scaler is not None else g.detach()).cpu()
        return found

    def weights(self) -> dict[str, torch.Tensor]:
        """This rank's parameters under the original names (its tp shards; FSDP's dp shards gathered:
        every dp rank calls this, in one order), on CPU."""
        dtensor = self._dtensor()
        found: dict[str, torch.Tensor] = {}
        for index, module in sorted(self.modules.items()):
            for local, canonical in self.program.stages[index].param_sources.items():
                p = module.get_parameter(local).detach()
                found.setdefault(canonical, (p.full_tensor() if isinstance(p, dtensor) else p).cpu().clone())
        return found


def _takes_return_outputs(schedule: Any) -> bool:
    """Whether this torch's schedule `step` has `return_outputs` (newer releases)."""
    return "return_outputs" in inspect.signature(schedule.step).parameters
