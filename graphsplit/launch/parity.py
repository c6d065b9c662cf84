"""Parity: the untouched model against the transformed program.

`reference_step` runs the original model in one process on the micro-batches
the pipeline sees, accumulating gradients the way the schedules do (summed
over micro-batches, then divided by their number). `compare` checks outputs,
loss and gradients with fp32 tolerances scaled by magnitude:
|a - b| <= atol * max(1, max|b|).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree

from ..runtime.microbatch import merge_outputs, split_microbatches

ATOL = 1e-5


@dataclass
class StepResult:
    loss: torch.Tensor
    output: Any
    grads: dict[str, torch.Tensor]
    # names that are one tensor in the model (tied weights), each group sorted
    aliases: list[list[str]] = field(default_factory=list)


@dataclass
class Comparison:
    max_diff: dict[str, float] = field(default_factory=dict)  # what -> scaled max |a - b|
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def worst(self) -> tuple[str, float]:
        if not self.max_diff:
            return ("nothing", 0.0)
        key = max(self.max_diff, key=self.max_diff.__getitem__)
        return key, self.max_diff[key]


def reference_step(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    target: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    microbatches: int,
    replicas: int = 1,
) -> StepResult:
    """One forward/backward of the untouched model over the pipeline's micro-batches.

    `microbatches` counts all pieces (dp replicas x micro-batches, replica-major). With
    `replicas` > 1 (sync-bn: BatchNorm statistics span the replicas), the replicas'
    m-th micro-batches run as one batch, as the synchronized program sees them; the
    output is put back in replica-major order.
    """
    model.zero_grad(set_to_none=True)
    chunks = split_microbatches((args, kwargs), microbatches)
    targets = split_microbatches(target, microbatches)
    per = microbatches // replicas
    if replicas > 1:
        chunks = [merge_outputs([chunks[d * per + m] for d in range(replicas)]) for m in range(per)]
        targets = [merge_outputs([targets[d * per + m] for d in range(replicas)]) for m in range(per)]
    losses, outputs = [], []
    for (a, k), t in zip(chunks, targets):
        out = model(*a, **k)
        loss = loss_fn(out, t)
        loss.backward()
        losses.append(loss.detach())
        outputs.append(pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, out))
    if replicas > 1:
        parts = [split_microbatches(out, replicas) for out in outputs]
        outputs = [parts[m][d] for d in range(replicas) for m in range(per)]
    grads, groups = {}, {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
        if p.grad is not None:
            if len(groups[id(p)]) == 1:  # a tied tensor is scaled once
                p.grad.div_(per)
            grads[name] = p.grad.detach().clone()
    aliases = [sorted(names) for names in groups.values()]
    return StepResult(torch.stack(losses).mean(), merge_outputs(outputs), grads, aliases)


def _scaled_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a = a.detach().double()
    b = b.detach().double()
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    if not a.is_floating_point():
        return 0.0 if torch.equal(a, b) else float("inf")
    scale = max(1.0, float(b.abs().max()))
    return float((a - b).abs().max()) / scale


def compare(
    got_loss: torch.Tensor | None,
    got_output: Any,
    got_grads: Mapping[str, torch.Tensor],
    ref: StepResult,
    atol: float = ATOL,
    expected: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
    held: Collection[str] = (),
) -> Comparison:
    """`expected(name, full_reference_grad)` gives what this rank should hold (its tp shard).

    Which parameters have a gradient must agree too: one the original model leaves None (it
    ran under no_grad, or is frozen) fails, and so does each parameter in `held` (the ones
    this part holds) that has a reference gradient but none here."""
    cmp = Comparison()

    def check(what: str, a: torch.Tensor, b: torch.Tensor) -> None:
        d = _scaled_diff(a, b)
        cmp.max_diff[what] = d
        if not d <= atol:
            cmp.failures.append(f"{what}: max scaled difference {d:.3g} > {atol:g}")

    if got_loss is not None:
        check("loss", got_loss, ref.loss)
    if got_output is not None:
        got_leaves = [t for t in pytree.tree_leaves(got_output) if isinstance(t, torch.Tensor)]
        ref_leaves = [t for t in pytree.tree_leaves(ref.output) if isinstance(t, torch.Tensor)]
        if len(got_leaves) != len(ref_leaves):
            cmp.failures.append(f"output: {len(got_leaves)} tensors, the original model gives {len(ref_leaves)}")
        for i, (a, b) in enumerate(zip(got_leaves, ref_leaves)):
            check(f"output[{i}]", a, b)
    for name, g in got_grads.items():
        if name not in ref.grads:
            cmp.failures.append(f"grad {name}: the original model has no gradient for it")
            continue
        want = ref.grads[name] if expected is None else expected(name, ref.grads[name])
        check(f"grad {name}", g, want)
    for name in sorted(held):
        if name in ref.grads and name not in got_grads:
            cmp.failures.append(f"grad {name}: the original model has a gradient for it, this part has none")
    return cmp


def missing_grads(ref: StepResult, got: set[str]) -> list[str]:
    """Parameters with a reference gradient that no part of the program produced (aliases count once)."""
    return [
        names[0]
        for names in ref.aliases
        if any(n in ref.grads for n in names) and not any(n in got for n in names)
    ]
