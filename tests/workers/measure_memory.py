"""Under torchrun: for each plan given, build this rank's part of a model with parallelize(), train one
AdamW step, and record the bytes this rank holds: parameters, gradients, optimizer state (what the
planner predicts exactly), and the activations the step keeps for backward: every distinct storage
autograd saves, parameters aside (FSDP's gathered ones included: they are parameters while gathered),
summed over the step's micro-batches, and the most of those bytes alive at once (a micro-batch's are
given back as its backward frees them: what a pipeline schedule holds at its peak); FSDP's units and
its gathered parameters and unsharded gradients at their largest. One JSON file per rank in OUT.

    python -m torch.distributed.run --nproc-per-node W tests/workers/measure_memory.py MODEL OUT PLAN.json...
"""

import json
import os
import sys
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from graphsplit import Plan, parallelize
from graphsplit.loader import load_model
from graphsplit.runtime.microbatch import split_microbatches


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def local_bytes(t: torch.Tensor) -> int:
    t = local(t)
    return t.numel() * t.element_size()


class SavedStorages:
    """The distinct storages autograd saves, parameters aside: the module's parameters as they are
    when saved (FSDP's gathered ones while a stage runs)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.bytes: dict[int, int] = {}
        self.alive: list[object] = []  # a storage freed mid-step would hand its address to the next one
        self.holders: dict[int, int] = {}  # storage -> saved tensors alive that hold it
        self.held = self.peak = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if all(storage._cdata != local(p).untyped_storage()._cdata for p in self.module.parameters()):
            key = storage._cdata
            self.bytes[key] = storage.nbytes()
            self.alive.append(storage)
            if not self.holders.get(key):
                self.held += storage.nbytes()
                self.peak = max(self.peak, self.held)
            self.holders[key] = self.holders.get(key, 0) + 1
            weakref.finalize(t, self.release, key)  # autograd drops what it saved once its backward ran
        return t

    def release(self, key: int) -> None:
        self.holders[key] -= 1
        if not self.holders[key]:
            self.held -= self.bytes[key]

    def total(self) -> int:
        return sum(self.bytes.values())


def fsdp_params(units: list[torch.nn.Module]) -> list[object]:
    """The FSDPParams of FSDP units (torch's internal records of each sharded parameter)."""
    groups = [unit._get_fsdp_state()._fsdp_param_group for unit in units]
    return [p for group in groups if group is not None for p in group.fsdp_params]


class AccumulatedGradients:
    """FSDP's unsharded gradients accumulated across micro-batches (`unsharded_accumulated_grad`: kept in
    its reduce dtype when that differs from the parameters'), at their largest after any stage's backward."""

    def __init__(self, module) -> None:
        self.peak = 0
        self.stages = list(module.pipeline.modules.values())
        for stage in self.stages:
            stage.register_full_backward_hook(lambda *_: self.note())

    def note(self) -> None:
        held = 0
        for fsdp_param in fsdp_params(self.stages):
            grad = fsdp_param.unsharded_accumulated_grad
            held += grad.numel() * grad.element_size() if grad is not None else 0
        self.peak = max(self.peak, held)


class GatheredBytes:
    """FSDP's gathered parameters and unsharded gradients alive at once, at their largest: sampled as
    each unit's forward starts and ends and as its backward starts, and after the step."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.peak = 0
        self.units = [m for m in module.modules() if isinstance(m, FSDPModule)]
        for unit in self.units:
            unit.register_forward_pre_hook(lambda *_: self.note())
            unit.register_forward_hook(lambda *_: self.note())
            unit.register_full_backward_pre_hook(lambda *_: self.note())

    def note(self) -> None:
        held = 0
        for fsdp_param in fsdp_params(self.units):
            whole = getattr(fsdp_param, "_unsharded_param", None)
            for t in (whole, whole.grad if whole is not None else None, fsdp_param.unsharded_accumulated_grad):
                held += t.untyped_storage().nbytes() if t is not None else 0
        self.peak = max(self.peak, held)


def ddp_bucket_bytes(module) -> int:
    """Bytes of DDP's buckets on this rank: the stage runners torch's schedule (or, with one stage, the local
    pipeline) drives, as DDP's logging data reports their bucket sizes."""
    from torch.nn.parallel import DistributedDataParallel

    schedule = module.pipeline.schedule
    if hasattr(schedule, "stages"):  # graphsplit's LocalPipeline
        runners = schedule.stages
    else:  # torch's single- and multi-stage schedules hold PipelineStages
        runners = [s.submod for s in getattr(schedule, "_stages", None) or [schedule._stage]]
    total = 0
    for runner in runners:
        if isinstance(runner, DistributedDataParallel):
            sizes = runner._get_ddp_logging_data().get("bucket_sizes", "")
            total += sum(int(b) for b in str(sizes).split(", ") if b)
    return total


def main() -> None:
    model_path, out = sys.argv[1], Path(sys.argv[2])
    plans = [Plan.from_json(text) for text in sys.argv[3:]]
    loaded = load_model(model_path)
    found = []
    for plan in plans:
        model = loaded.build("cpu", seed=0)
        rank = int(os.environ["RANK"])
        dp_rank = rank // (plan.pp * plan.tp)  # the mesh is (dp, pp, tp)
        inputs = split_microbatches(loaded.args, plan.dp)[dp_rank]
        target = split_microbatches(loaded.target, plan.dp)[dp_rank]
        module = parallelize(model, plan, example_inputs=inputs, loss_fn=loaded.loss_fn, example_target=target)
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
        saved = SavedStorages(module)
        accumulated = AccumulatedGradients(module) if plan.fsdp else None
        gathered = GatheredBytes(module) if plan.fsdp else None
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
            module.train_step(*inputs, target=target)
        if gathered is not None:
            gathered.note()
        grads = sum(local_bytes(p.grad) for p in module.parameters() if p.grad is not None)
        module.optimizer_step(optimizer)
        found.append({
            "pp_rank": (rank // plan.tp) % plan.pp, "dp_rank": dp_rank,
            "parameters": sum(local_bytes(p) for p in module.parameters()),
            "gradients": grads,
            "ddp_buckets": ddp_bucket_bytes(module),
            "activations": saved.total(),
            "peak_activations": saved.peak,
            "fsdp_units": sum(isinstance(m, FSDPModule) for m in module.modules()),
            "gathered_peak": gathered.peak if gathered is not None else None,
            "accumulated_gradients": accumulated.peak if accumulated is not None else None,
            "optimizer_state": sum(local_bytes(t) for s in optimizer.state.values() for t in s.values()
                                   if isinstance(t, torch.Tensor) and t.dim()),
        })
        dist.barrier()
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(found))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
