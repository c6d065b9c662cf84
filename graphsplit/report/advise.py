"""`graphsplit advise`: how much memory training takes, and which plan fits the hardware.

Training memory is counted in the sources' five parts (parameters, gradients,
optimizer state, activations, outputs and loss) by the planner's one memory model
(planner/estimate.py), which the planner's tests check against bytes measured on
real processes. Scenarios, as the project's sources put them: (1) everything fits
on one device -> data parallel; (2) it fits across devices but not on one ->
pipeline and/or tensor parallel; (3) a single layer does not fit on one device ->
tensor parallel is needed. The recommendation is the planner's fastest plan that
fits (`graphsplit plan` shows the whole ranking); when none fits, its leanest plan
and the devices it would take.
"""

from __future__ import annotations

from typing import Any

from ..errors import GraphsplitError
from ..loader import LoadedModel
from ..plan import Plan
from ..planner import Hardware, load_hardware, plan_model
from ..planner.estimate import Estimate
from ..planner.estimate import estimate as price
from ..planner.profile import profile_model
from ..planner.stages import plan_stages

PARTS = ("parameters", "gradients", "optimizer_state", "activations", "outputs_and_loss", "total")


def estimate(loaded: LoadedModel, plan: Plan, hardware: Hardware | None = None) -> Estimate:
    """What `plan` costs its busiest rank (memory in the five parts, and time), from the planner's models."""
    hw = hardware or load_hardware("h100")
    profile = profile_model(loaded, (plan.tp,), hw.fused_attention)
    profile.hardware = hw
    return price(plan, plan_stages(profile, plan), hw, profile.batch, profile.tokens_per_sample,
                 profile.model_flops_per_sample)


def as_advice(est: Estimate) -> dict[str, Any]:
    """A plan and its five memory parts, flat (advise's JSON)."""
    plan = est.plan
    return {"plan": {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "ep": plan.ep, "cp": plan.cp, "fsdp": plan.fsdp,
                     "checkpoint": plan.checkpoint,
                     "autocast": plan.autocast, "microbatches": plan.num_microbatches, "schedule": plan.schedule},
            **{k: est.memory[k] for k in PARTS}, "step_seconds": est.step_seconds}


def render(result: dict[str, Any], gpus: int, gpu_memory: str, echo: Any) -> None:
    """advise's text: the scenario, the five parts on one device, the recommendation."""
    from .summary import _fmt_bytes

    def line(est: dict[str, Any]) -> str:
        p = est["plan"]
        how = f"tp={p['tp']} pp={p['pp']} dp={p['dp']}" + "".join(f" {k}={p[k]}" for k in ("ep", "cp") if p.get(k, 1) > 1) + \
            (" fsdp" if p["fsdp"] else "") + \
            (f" checkpoint {p['checkpoint']}" if p["checkpoint"] != "none" else "") + \
            (f" {p['autocast']}" if p["autocast"] else "")
        return f"{how}: " + ", ".join(f"{k.replace('_', ' ')} {_fmt_bytes(est[k])}" for k in PARTS)

    echo(f"scenario: {result['scenario']}")
    echo(f"on one device: {line(result['single_device'])}")
    if result["fits"]:
        echo(f"recommended (per rank, the fastest that fits on {result['hardware']}): {line(result['recommended'])}")
        for alt in result["alternatives"]:
            echo(f"  also fits: {line(alt)}")
    else:
        if result.get("closest"):
            echo(f"nothing fits {gpus} x {gpu_memory}; the leanest plan: {line(result['closest'])}")
        needed = result.get("devices_needed")
        echo(f"it would take about {needed} devices" if needed else "no number of devices up to 2**20 makes it fit")


def advise(loaded: LoadedModel, gpus: int, gpu_memory: int, gpus_per_node: int = 8,
           hardware: Hardware | None = None) -> dict[str, Any]:
    hw = hardware or load_hardware("h100")
    one = estimate(loaded, Plan(), hw)
    largest_layer = max(
        (p.numel() * p.element_size() for m in loaded.build("meta").modules() for p in m.parameters(recurse=False)),
        default=0,
    ) * 4  # the layer's parameters, gradients and AdamW's two moments, all fp32
    if one.memory["total"] <= gpu_memory:
        scenario = "fits on one device: data parallel (DDP) over all devices"
    elif largest_layer > gpu_memory:
        scenario = "a single layer does not fit on one device: tensor parallelism is needed"
    else:
        scenario = "fits across devices but not on one: pipeline and/or tensor parallelism"
    result, _ = plan_model(loaded, gpus, gpu_memory, hw, gpus_per_node)
    advice: dict[str, Any] = {
        "fits": result.fits,
        "scenario": scenario,
        "single_device": as_advice(one),
        "gpus": gpus,
        "gpu_memory": gpu_memory,
        "hardware": hw.name,
    }
    if result.fits:
        advice["recommended"] = as_advice(result.plans[0])
        advice["alternatives"] = [as_advice(e) for e in result.plans[1:4]]
    else:
        advice["devices_needed"] = result.devices_needed
        advice["too_large"] = result.too_large
        advice["closest"] = as_advice(result.closest) if result.closest else None
    return advice


_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """'80GiB', '512 MiB', '1e9' -> bytes; at least one byte."""
    import re

    how = "write it like 80GiB, 40GB or 1e9 (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
    m = re.fullmatch(r"\s*((?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or (m.group(2) and m.group(2).lower() not in _UNITS):
        raise GraphsplitError(f"cannot read the memory size {text!r}; {how}")
    value = float(m.group(1)) * _UNITS[m.group(2).lower() or "b"]
    if not 1 <= value < 2**63:
        raise GraphsplitError(f"memory size {text!r} is {'under one byte' if value < 1 else 'too large'}; {how}")
    return int(value)
