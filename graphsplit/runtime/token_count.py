"""Each step's global count of the tokens a normalized mean counts, and the factors it gives.

passes/token_mean.py rewrote each proven mean over counted tokens into its piece's sum times a
factor (ops/token_scale.py) and kept, per mean, a graph computing its count from the data
(analysis/loss_reduction.py's `CountGraph`: `(labels[..., 1:] != -100).sum()` for HF's shifted
labels). Before each step the backend runs them on each dp replica's share and sums the counts: a rank
on its own share, summed over the dp group with one all-reduce (Megatron's way, and the only one for
`parallelize()`, where a rank sees only its share); the local backend over the shares it runs in turn. The factor
is pieces / count, pieces being the micro-batches x replicas whose losses are averaged as equals.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from ..ir.program import Program
from ..ops.token_scale import TokenScale, set_token_scales

# a count graph traced on meta bakes `device='meta'` into its calls: its copy per device
_ON_DEVICE: weakref.WeakKeyDictionary[fx.GraphModule, dict[torch.device, fx.GraphModule]] = weakref.WeakKeyDictionary()


def counts_tokens(modules: Iterable[nn.Module]) -> bool:
    """Whether any of `modules` holds a normalized mean (needs this step's factors)."""
    return any(isinstance(sub, TokenScale) for m in modules for sub in m.modules())


def batch_counts(program: Program, inputs: tuple[Any, ...], target: Any) -> torch.Tensor | None:
    """What each normalized mean counts in this batch (flat inputs and target), as float64 (a mask's
    sum need not be whole); None when the program normalizes no mean."""
    means = program.token_means
    if means is None or not means.counts:
        return None
    found = []
    with torch.no_grad():
        for count in means.counts:
            args = [inputs[i] for i in count.graph.uses] if count.reads == "inputs" else [target]
            device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
            found.append(torch.as_tensor(_on(count.graph.gm, device)(*args), device=device).to(torch.float64))
    return torch.stack(found)


def token_factors(program: Program, batches: Sequence[tuple[tuple[Any, ...], Any]],
                  reduce: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor | None:
    """This step's factor per normalized mean: pieces / its count over the global batch, the sum of
    its counts in `batches` ((flat inputs, target) each: the replicas' shares this process holds)
    and, with `reduce` (summing over the dp group in place), in the other processes' shares."""
    found = [batch_counts(program, inputs, target) for inputs, target in batches]
    if not found or found[0] is None:
        return None
    counts = torch.stack(found).sum(0)  # type: ignore[arg-type]
    if reduce is not None:
        reduce(counts)
    means = program.token_means.counts
    offsets = torch.tensor([c.offset for c in means], dtype=counts.dtype, device=counts.device)
    floors = torch.tensor([c.at_least for c in means], dtype=counts.dtype, device=counts.device)
    plan = program.plan
    return (plan.num_microbatches * plan.dp / torch.maximum(counts + offsets, floors)).to(torch.float32)


def set_factors(modules: Iterable[nn.Module], factors: torch.Tensor | None) -> None:
    """Give the normalized means inside `modules` this step's factors."""
    if factors is not None:
        set_token_scales(modules, factors)


def _on(gm: fx.GraphModule, device: torch.device) -> fx.GraphModule:
    per_device = _ON_DEVICE.setdefault(gm, {})
    if device not in per_device:
        moved = copy.deepcopy(gm)

        def swap(value: object) -> object:
            return device if isinstance(value, torch.device) and value.type == "meta" else value

        for node in moved.graph.nodes:
            node.args = fx.node.map_aggregate(node.args, swap)
            node.kwargs = fx.node.map_aggregate(node.kwargs, swap)
        moved.recompile()
        per_device[device] = moved
    return per_device[device]
