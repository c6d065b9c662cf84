"""The objective a pipeline's last stage computes, the optimizer, and the gradients of tied copies."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree

from ..errors import GraphsplitError
from ..ir.program import Program

LossFn = Callable[[Any, Any], torch.Tensor]


def default_loss(output: Any, target: Any = None) -> torch.Tensor:
    """The stand-in objective when the model file defines no loss_fn: mean of squares of the outputs."""
    floats = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not floats:
        raise GraphsplitError("the model's output holds no floating-point tensor to train on; define loss_fn(output, target)")
    return sum(t.float().square().mean() for t in floats)  # type: ignore[return-value]


def default_target(inputs: Iterable[Any]) -> torch.Tensor:
    """The stand-in target when the model file defines none (`default_loss` ignores it): one zero
    per example, so it splits into micro-batches as the batch does."""
    for value in inputs:
        if isinstance(value, torch.Tensor) and value.dim():
            return torch.zeros(value.shape[0], device=value.device)
    raise GraphsplitError("no batched tensor among example_inputs()")


def make_loss(program: Program, user_loss: LossFn | None, loss_graph: nn.Module | None = None) -> LossFn:
    """The last stage's raw output -> the user's output structure -> their loss.

    `loss_graph`: this rank's copy of `program.loss_gm` (the loss rewritten for
    vocab-sharded logits), where ranks share a process; by default the program's own."""
    fn = user_loss or default_loss
    graph = loss_graph if loss_graph is not None else program.loss_gm

    def loss(stage_output: Any, target: Any) -> torch.Tensor:
        if graph is not None:
            outs = (stage_output,) if isinstance(stage_output, torch.Tensor) else tuple(stage_output)
            value = graph(*outs, target)
        else:
            value = fn(program.unflatten_output(stage_output), target)
        if not isinstance(value, torch.Tensor) or value.dim() != 0:
            raise GraphsplitError("loss_fn must return a scalar tensor")
        return value

    return loss


def make_optimizer(name: str, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The optimizers `run` offers, by name."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    raise GraphsplitError(f"unknown optimizer {name!r}; choose sgd or adamw")


def named_grads(program: Program, stages: Mapping[int, nn.Module]) -> dict[str, torch.Tensor]:
    """The gradients the modules of `stages` (by stage index) hold, under the original model's
    parameter names (a tp rank's shards); a parameter without one is left out."""
    found: dict[str, torch.Tensor] = {}
    for index, module in stages.items():
        for local, canonical in program.stages[index].param_sources.items():
            g = module.get_parameter(local).grad
            if g is not None:
                found[canonical] = g
    return found


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
