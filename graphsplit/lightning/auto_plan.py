"""`GraphsplitStrategy(plan="auto")`: the planner's plan for the devices Lightning was given.

Lightning shares the data out before the first training step (each dp replica's sampler), so the
plan, whose dp the sampler needs, is found in the strategy's `setup`: on the first batch of the
fit's train DataLoader, fetched there with every random generator put back as it was (the loop's
shuffling draws what it would have drawn), by rank 0, which sends the plan to every rank.

A Lightning DataLoader's batch is what each replica trains on (the global batch is it times dp, as
under DDP), so the planner ranks plans by samples per second with each replica training on that
batch (`plan_model(..., replica_batch=True)`), not by the step time of one global batch. Fields
given with "auto" (`pp=2, compile=False`) are kept fixed: the planner chooses the rest.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..errors import GraphsplitError
from ..plan import Plan
from .steps import batch_tensors, step_module

# a GPU's name -> the built-in hardware profile priced for it
_PROFILES = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"))


def hardware_here(device: torch.device, hardware: Any, processes: int) -> tuple[Any, int]:
    """The hardware profile (`hardware`: a built-in name, a JSON file, a `Hardware`, or None: the one
    for this device) and each device's memory in bytes (a CPU's shared by the node's processes)."""
    from ..planner import load_hardware

    if hardware is None:
        if device.type == "cuda":
            name = torch.cuda.get_device_name(device)
            hardware = next((profile for key, profile in _PROFILES if key in name), None)
            if hardware is None:
                raise GraphsplitError(f"plan='auto' has no hardware profile for {name}: give GraphsplitStrategy("
                                      "plan='auto', hardware='h100' | 'h200' | 'a100' | 'profile.json')")
        else:
            hardware = "cpu"
    hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
    if device.type == "cuda":
        return hw, int(torch.cuda.get_device_properties(device).total_memory)
    return hw, hw.memory_bytes // max(processes, 1)


def first_batch(trainer: Any) -> Any:
    """The first batch of the fit's train DataLoader (the one given to `fit`, a datamodule's or the
    module's `train_dataloader()`), every random generator left as it was."""
    from ..loader import forked_generators

    source = getattr(getattr(trainer, "fit_loop", None), "_data_source", None)
    if source is None or not source.is_defined():
        raise GraphsplitError("plan='auto' plans on the first training batch, and this fit has no train DataLoader")
    loaders = source.dataloader()
    loader = next(iter(loaders.values())) if isinstance(loaders, dict) else loaders
    with forked_generators():
        try:
            return next(iter(loader))
        except StopIteration:
            raise GraphsplitError("plan='auto' plans on the first training batch, and the train DataLoader is "
                                  "empty") from None


def constraint(fields: dict[str, Any]) -> Any:
    """The plans that keep every field given with "auto" (a field Plan lacks refused in one line)."""
    known = {f.name for f in dataclasses.fields(Plan)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise GraphsplitError(f"GraphsplitStrategy(plan='auto', {unknown[0]}=...): Plan has no field {unknown[0]}; "
                              f"give fields of Plan ({', '.join(sorted(known))})")
    return lambda plan: all(getattr(plan, k) == v for k, v in fields.items())


def auto_plan(module: Any, batch: Any, world: int, per_node: int, hw: Any, memory: int,
              fields: dict[str, Any]) -> tuple[Plan, str]:
    """The fastest plan (samples per second) for `world` devices of `memory` bytes, each replica
    training `module`'s training_step on a batch like `batch`; and one line saying what it is."""
    from ..loader import model_in_memory
    from ..planner import plan_model

    traced, _ = step_module(module, "training_step", batch)
    loaded = model_in_memory(traced, tuple(batch_tensors(batch, "training_step")))
    result, _ = plan_model(loaded, world, memory, hw, per_node, replica_batch=True, keep=constraint(fields))
    if not result.fits:
        given = f" keeping {', '.join(f'{k}={v}' for k, v in fields.items())}" if fields else ""
        need = f": the leanest needs {_size(result.closest.memory['total'])}, most of it " \
               f"{result.too_large}" if result.closest is not None else ""
        raise GraphsplitError(f"plan='auto': no plan{given} fits {world} devices of {_size(memory)}{need}; "
                              "give more devices, or a plan")
    best = result.plans[0]
    p = best.plan
    shape = " x ".join(f"{k} {v}" for k, v in (("dp", p.dp), ("pp", p.pp), ("tp", p.tp)) if v > 1) or "one device"
    extras = [f"{p.num_microbatches} micro-batches" if p.pp > 1 else "", "fsdp" if p.fsdp else "",
              f"checkpoint {p.checkpoint}" if p.checkpoint != "none" else "", p.autocast or "",
              "compiled" if p.compile else ""]
    line = (f"graphsplit: plan='auto' chose {shape} ({', '.join(e for e in extras if e) or 'plain'}) of "
            f"{result.considered} priced: {best.samples_per_second:.1f} samples/s predicted on {hw.name}, "
            f"{_size(best.memory['total'])} of {_size(memory)} per device")
    return p, line


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
