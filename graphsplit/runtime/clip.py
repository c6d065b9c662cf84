"""The global gradient norm of a program spread over ranks, and clipping by it.

`torch.nn.utils.clip_grad_norm_` on the untouched model takes the 2-norm over every
parameter once. Across ranks, each rank adds the squares of the gradients it *owns*
and one all-reduce sums the shares:

- a tp-sharded parameter: every tp rank owns its shard (the shards partition it);
- a tp-replicated one (a norm's weight): the same gradient sits on every tp rank,
  tp rank 0 owns it;
- a tied parameter on several stages (embedding and LM head): after the tied sync every
  copy holds the sum, the rank holding its first stage owns it;
- dp replicas (DDP): the averaged gradient sits on every replica, dp rank 0 owns it;
  FSDP shards it over the replicas, every replica owns its shard;
- an expert weight under expert parallelism: the first ep replicas each own their experts' slice.

Every rank then scales all its gradients by the same factor, the one
`clip_grad_norm_` uses: min(1, max_norm / (norm + 1e-6)).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn as nn

from ..ir.program import Program
from ..ir.sharding import Shard

# what torch's clip_grad_norm_ adds to the norm before dividing
CLIP_EPS = 1e-6


def _local(t: torch.Tensor) -> torch.Tensor:
    """An FSDP gradient's local shard (a DTensor's), else the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def owned_grads(program: Program, stages: Mapping[int, nn.Module], tp_rank: int, dp_rank: int,
                dp_sharded: bool) -> list[torch.Tensor]:
    """The gradients (local tensors) this rank adds to the global norm, each parameter's once in the world."""
    # an expert weight under ep: each of the first ep replicas holds its own experts (their slice)
    experts_here = bool(program.expert_params or program.expert_slots) and dp_rank < program.plan.ep
    if dp_rank != 0 and not dp_sharded and not experts_here:
        return []  # DDP: replica 0 speaks for every replica
    owned: dict[str, torch.Tensor] = {}
    for index, module in sorted(stages.items()):
        for local, canonical in program.stages[index].param_sources.items():
            if canonical in owned or min(program.param_stages[canonical]) != index:
                continue
            expert = program.is_expert(canonical)  # never FSDP-sharded: its slice whole on its ep rank
            if expert and not experts_here:
                continue
            if not expert and dp_rank != 0 and not dp_sharded:
                continue
            if tp_rank != 0 and not isinstance(program.param_sharding(canonical), Shard):
                continue
            grad = module.get_parameter(local).grad
            if grad is not None:
                owned[canonical] = _local(grad)
    return list(owned.values())


def squared_norm_share(grads: list[torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
    """The sum of squares of `grads` in fp32 (a 0-d tensor): one rank's share of the squared global norm."""
    if not grads:
        return torch.zeros((), dtype=torch.float32, device=device)
    # a sparse gradient (nn.EmbeddingBag(sparse=True)) counts its stored values, summed where repeated
    grads = [g.coalesce().values() if g.is_sparse else g for g in grads]
    return torch.nn.utils.get_total_norm(grads, 2.0).float().square()


def all_grads(stages: Mapping[int, nn.Module]) -> list[torch.Tensor]:
    """Every gradient this rank holds, each tensor once (tied copies on two stages are two tensors)."""
    seen: dict[int, torch.Tensor] = {}
    for module in stages.values():
        for p in module.parameters():
            if p.grad is not None:
                seen.setdefault(id(p), _local(p.grad))
    return list(seen.values())


def clip_factor(total_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """`clip_grad_norm_`'s factor: min(1, max_norm / (norm + 1e-6))."""
    return torch.clamp(max_norm / (total_norm + CLIP_EPS), max=1.0)


def global_norm_and_clip(
    program: Program,
    stages: Mapping[int, nn.Module],
    tp_rank: int,
    dp_rank: int,
    dp_sharded: bool,
    max_norm: float | None,
    all_reduce_sum: Callable[[torch.Tensor], None],
) -> float:
    """The global gradient norm (every rank gets the same value); with `max_norm`, every gradient on
    this rank scaled by the same clip factor. `all_reduce_sum` sums a 0-d tensor over all ranks in place."""
    with torch.no_grad():  # an FSDP gradient's local shard is a view: scaled in place, never recorded
        return _norm_and_clip(program, stages, tp_rank, dp_rank, dp_sharded, max_norm, all_reduce_sum)


def _norm_and_clip(program: Program, stages: Mapping[int, nn.Module], tp_rank: int, dp_rank: int, dp_sharded: bool,
                   max_norm: float | None, all_reduce_sum: Callable[[torch.Tensor], None]) -> float:
    owned = owned_grads(program, stages, tp_rank, dp_rank, dp_sharded)
    device = next((g.device for g in all_grads(stages)), torch.device("cpu"))
    share = squared_norm_share(owned, device)
    all_reduce_sum(share)
    total = share.sqrt()
    if max_norm is not None:
        factor = clip_factor(total, max_norm)
        for g in all_grads(stages):
            g.mul_(factor.to(g.dtype))
    return float(total)
