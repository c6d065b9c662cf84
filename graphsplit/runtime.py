"""Pieces every backend shares: micro-batching, the loss, tied gradients."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree

from .errors import GraphsplitError
from .program import Program

LossFn = Callable[[Any, Any], torch.Tensor]


def split_microbatches(value: Any, n: int) -> list[Any]:
    """Cut every tensor in `value` into `n` pieces along dim 0, as the pipelining schedules do."""
    leaves, spec = pytree.tree_flatten(value)
    pieces = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if leaf.dim() == 0 or leaf.shape[0] % n:
                raise GraphsplitError(
                    f"a batch tensor of shape {tuple(leaf.shape)} cannot be cut into {n} equal micro-batches "
                    f"along dim 0; use a batch size divisible by {n} or change --microbatches"
                )
            pieces.append(torch.tensor_split(leaf, n, dim=0))
        else:
            pieces.append([leaf] * n)
    return [pytree.tree_unflatten([p[i] for p in pieces], spec) for i in range(n)]


def merge_outputs(chunks: list[Any]) -> Any:
    """Concatenate per-micro-batch outputs along dim 0 (scalars: stacked)."""
    flat = [pytree.tree_flatten(c) for c in chunks]
    spec = flat[0][1]
    merged = []
    for leaves in zip(*(f[0] for f in flat)):
        if isinstance(leaves[0], torch.Tensor):
            merged.append(torch.cat(leaves) if leaves[0].dim() else torch.stack(leaves))
        else:
            merged.append(leaves[0])
    return pytree.tree_unflatten(merged, spec)


def require_parameters(program: Program) -> None:
    """Training needs something to train on every pipeline rank: an optimizer over no parameters fails there."""
    plan = program.plan
    if not any(st.param_sources for st in program.stages):
        raise GraphsplitError("the model has no parameters to train; graphsplit run trains a model whose modules "
                              "hold nn.Parameters (graphsplit transform still splits it)")
    for rank in range(plan.pp):
        stages = plan.stages_of_rank(rank)
        if not any(program.stages[s].param_sources for s in stages):
            raise GraphsplitError(
                f"pipeline rank {rank} (stage(s) {', '.join(map(str, stages))}) holds no parameters, so it has "
                "nothing to train; use a smaller --pp or move --split-at so every stage holds a layer"
            )


def default_loss(output: Any, target: Any = None) -> torch.Tensor:
    """The stand-in objective when the model file defines no loss_fn: mean of squares of the outputs."""
    floats = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not floats:
        raise GraphsplitError("the model's output holds no floating-point tensor to train on; define loss_fn(output, target)")
    return sum(t.float().square().mean() for t in floats)  # type: ignore[return-value]


def make_loss(program: Program, user_loss: LossFn | None) -> LossFn:
    """The last stage's raw output -> the user's output structure -> their loss."""
    fn = user_loss or default_loss

    def loss(stage_output: Any, target: Any) -> torch.Tensor:
        if program.loss_gm is not None:  # the loss rewritten for vocab-sharded logits
            outs = (stage_output,) if isinstance(stage_output, torch.Tensor) else tuple(stage_output)
            value = program.loss_gm(*outs, target)
        else:
            value = fn(program.unflatten_output(stage_output), target)
        if not isinstance(value, torch.Tensor) or value.dim() != 0:
            raise GraphsplitError("loss_fn must return a scalar tensor")
        return value

    return loss


def sync_tied_grads(
    program: Program,
    stages: Mapping[int, nn.Module],
    reduce: Callable[[str, torch.Tensor], None] | None = None,
) -> None:
    """Give every copy of a tied parameter the sum of all copies' gradients.

    Copies in this process are summed here; `reduce(name, tensor)` then sums
    across processes in place (the distributed backend's all-reduce over the
    ranks that hold that parameter). Names are visited in sorted order, so every
    rank issues its collectives in the same order.
    """
    copies: dict[str, list[nn.Parameter]] = {}
    for index, module in stages.items():
        for local, canonical in program.stages[index].param_sources.items():
            # no copy gets a gradient (frozen, or read only under no_grad): the untouched model
            # leaves it None, and a zero sum would still be a gradient (weight decay would act)
            if canonical in program.shared_params and canonical not in program.params_without_grad:
                p = module.get_parameter(local)
                if all(p is not q for q in copies.setdefault(canonical, [])):
                    copies[canonical].append(p)
    for canonical in sorted(copies):
        params = copies[canonical]
        total = torch.zeros_like(params[0])
        for p in params:
            if p.grad is not None:
                total.add_(p.grad)
        if reduce is not None:
            reduce(canonical, total)
        for p in params:
            p.grad = total.clone()


def gather_outputs(program: Program, output: Any) -> Any:
    """The last stage's raw output with vocab-sharded tensors gathered (for checks and display)."""
    if not program.sharded_outputs or output is None:
        return output
    from .ops import tp as tpops

    outs = (output,) if isinstance(output, torch.Tensor) else tuple(output)
    whole = [tpops.gather_for_inspection(t, program.sharded_outputs[i].dim) if i in program.sharded_outputs else t
             for i, t in enumerate(outs)]
    return whole[0] if isinstance(output, torch.Tensor) else tuple(whole)
