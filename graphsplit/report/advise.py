"""`graphsplit advise`: how much memory training takes, and which plan fits the hardware.

Training memory is counted in its five parts, on `meta` (no weight memory):
parameters, gradients and AdamW state (2 fp32 tensors per parameter) from the
model's parameters; activations kept for backward, measured with
`saved_tensors_hooks` (analysis/memory.py) on one micro-batch; outputs and
loss from the model output's size. Scenarios, as the project's sources put
them: (1) everything fits on one device -> data parallel; (2) it fits across
devices but not on one -> pipeline and/or tensor parallel; (3) a single layer
does not fit on one device -> tensor parallel is needed. The recommended plan
keeps tp within a node, adds pp, and gives the rest to dp; every candidate is
compiled, and its busiest rank is what is compared with the device memory.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from ..analysis.memory import saved_bytes
from ..compile import compile_loaded
from ..errors import GraphsplitError
from ..ir.meta import info
from ..loader import LoadedModel
from ..plan import Plan

ADAMW_STATE_PER_PARAM = 2  # exp_avg and exp_avg_sq, fp32 like the parameters


@dataclass
class Estimate:
    plan: Plan
    params: int
    grads: int
    optimizer: int
    activations: int
    outputs: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.outputs

    def to_dict(self) -> dict[str, Any]:
        return {"plan": {"tp": self.plan.tp, "pp": self.plan.pp, "dp": self.plan.dp},
                "parameters": self.params, "gradients": self.grads, "optimizer_state": self.optimizer,
                "activations": self.activations, "outputs_and_loss": self.outputs, "total": self.total}


def estimate(loaded: LoadedModel, plan: Plan) -> Estimate:
    """Memory of the busiest rank of `plan` (activations: all micro-batches in flight, GPipe's worst case)."""
    program = compile_loaded(loaded, plan).program
    per_rank: dict[int, list[int]] = {}
    for st in program.stages:
        names = {id(st.gm.get_parameter(k)): c for k, c in st.param_sources.items()}
        inputs = st.input_examples()
        acts = saved_bytes(st.gm, inputs, plan.tp, True, program.param_shardings, names) * plan.num_microbatches
        rank = per_rank.setdefault(plan.stage_rank(st.index), [0, 0])
        rank[0] += program.stage_param_bytes(st.index)
        rank[1] += acts
    params, acts = max(per_rank.values(), key=lambda v: (2 + ADAMW_STATE_PER_PARAM) * v[0] + v[1])
    out_node = next(n for n in reversed(program.stages[-1].gm.graph.nodes) if n.op == "output")
    outputs = sum(info(a).tensor.nbytes for a in out_node.all_input_nodes if info(a).tensor is not None)
    outputs *= plan.num_microbatches
    return Estimate(plan, params, params, ADAMW_STATE_PER_PARAM * params, acts, outputs)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def advise(loaded: LoadedModel, gpus: int, gpu_memory: int, gpus_per_node: int = 8) -> dict[str, Any]:
    one = estimate(loaded, Plan())
    largest_layer = max(
        (p.numel() * p.element_size() for m in loaded.build("meta").modules() for p in m.parameters(recurse=False)),
        default=0,
    ) * (2 + ADAMW_STATE_PER_PARAM)
    if one.total <= gpu_memory:
        scenario = "fits on one device: data parallel (DDP) over all devices"
    elif largest_layer > gpu_memory:
        scenario = "a single layer does not fit on one device: tensor parallelism is needed"
    else:
        scenario = "fits across devices but not on one: pipeline and/or tensor parallelism"
    candidates: list[Estimate] = []
    for tp, pp in itertools.product(_divisors(min(gpus, gpus_per_node)), _divisors(gpus)):
        if tp * pp > gpus or gpus % (tp * pp):
            continue
        try:
            est = estimate(loaded, Plan(tp=tp, pp=pp, dp=gpus // (tp * pp)))
        except GraphsplitError:
            continue  # this tp or pp cannot split the model (heads, cuts, batch)
        candidates.append(est)
    fitting = sorted((c for c in candidates if c.total <= gpu_memory),
                     key=lambda c: (-c.plan.dp, c.plan.pp, c.plan.tp, c.total))
    result: dict[str, Any] = {
        "fits": bool(fitting),
        "scenario": scenario,
        "single_device": one.to_dict(),
        "gpus": gpus,
        "gpu_memory": gpu_memory,
    }
    if fitting:
        result["recommended"] = fitting[0].to_dict()
        result["alternatives"] = [c.to_dict() for c in fitting[1:4]]
    else:
        best = min(candidates, key=lambda c: c.total) if candidates else one
        shards = best.plan.tp * best.plan.pp
        needed = shards * -(-best.total // gpu_memory) if best.total else gpus
        result["devices_needed"] = int(max(needed, gpus + 1))
        result["closest"] = best.to_dict()
    return result


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
