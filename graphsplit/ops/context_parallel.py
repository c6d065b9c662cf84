"""Context parallelism's attention exchange, as functions stage graphs can call by name.

Under context parallelism over N ranks each rank holds 1/N of every sample's sequence. For causal
attention a plain cut would leave the last rank with N times the first one's work (its queries see
the whole sequence), so the sequence is cut into 2N chunks and rank r holds chunks r and 2N-1-r
(the load-balanced order torchtitan and torch's `context_parallel` use): every rank then attends
over 2N+1 chunks of keys.

- `shard_sequence(x, dim, rank, cp)` / `unshard_sequence(shards, dim)`: a whole tensor's shard for
  rank `rank` in that order, and the whole tensor back from every rank's shard.
- `shard_positions(length, rank, cp)`: the global positions of rank `rank`'s shard of a sequence
  of `length` (what `arange(length)` becomes on that rank: RoPE tables, position ids, masks).
- `cp_attention(q, k, v, comm, is_causal=..., scale=..., enable_gqa=...)`: SDPA on this rank's
  queries against the whole sequence's keys and values, gathered from the cp group (one
  all-gather each, in the model's dtype; backward: one reduce-scatter each, every rank's queries'
  contribution to each key summed where the key lives). A causal mask is applied by global
  position: each query chunk attends to the keys up to its own place, nothing more is computed.

The all-gather form (Llama 3's context parallelism, sec. 3.3.2 of its paper: all-gather K/V, then
local attention) keeps one whole sequence of K and V per rank for the attention; a ring exchange
would keep two chunks at a time at the cost of 2N-1 steps. Unbound (the meta analysis, or cp 1)
`cp_attention` is the model's own SDPA.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.utils._pytree as pytree

from .communicator import Communicator
from .eager import eager as _eager

CP_COMM_ATTR = "cp_comm"


class CPComm(Communicator):
    """The context-parallel ranks one graph's attention exchanges run over (see the module doc)."""

    axis = "cp"
    link: dist.ProcessGroup | None

    def __init__(self, cp: int) -> None:
        super().__init__(cp)
        self.rank = 0

    def bind(self, group: dist.ProcessGroup | None) -> None:
        super().bind(group)
        self.rank = dist.get_rank(group) if group is not None else 0

    @property
    def cp(self) -> int:
        return self.degree

    @property
    def group(self) -> dist.ProcessGroup | None:
        return self.link

    @property
    def bound(self) -> bool:
        return self.link is not None and self.degree > 1


def _chunk_order(cp: int) -> list[int]:
    """The global chunk index of each chunk in rank order: rank r's shard is chunks (r, 2cp-1-r)."""
    return [c for r in range(cp) for c in (r, 2 * cp - 1 - r)]


def shard_positions(length: int, rank: int, cp: int) -> torch.Tensor:
    """The global positions rank `rank` holds of a sequence of `length` (2cp divides it)."""
    if length % (2 * cp):
        raise ValueError(f"context parallelism over {cp} ranks cuts the sequence into {2 * cp} chunks; "
                         f"{length} tokens do not divide into them")
    chunk = length // (2 * cp)
    first, second = rank, 2 * cp - 1 - rank
    return torch.cat([torch.arange(first * chunk, (first + 1) * chunk),
                      torch.arange(second * chunk, (second + 1) * chunk)])


def shard_sequence(x: torch.Tensor, dim: int, rank: int, cp: int) -> torch.Tensor:
    """Rank `rank`'s load-balanced shard of `x` along `dim`."""
    return x.index_select(dim, shard_positions(x.shape[dim], rank, cp).to(x.device))


def unshard_sequence(shards: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The whole tensor from every rank's shard (rank order), in global order."""
    cp = len(shards)
    chunks = [c for s in shards for c in s.chunk(2, dim)]
    order = _chunk_order(cp)
    by_place = [chunks[order.index(c)] for c in range(2 * cp)]
    return torch.cat(by_place, dim)


def shard_values(values: Sequence[Any], dims: Sequence[int | None], rank: int, cp: int) -> list[Any]:
    """Each tensor of `values` cut to rank `rank`'s shard along its dim in `dims` (None: whole)."""
    return [shard_sequence(v, d, rank, cp) if isinstance(v, torch.Tensor) and d is not None else v
            for v, d in zip(values, dims)]


def shard_tree(tree: Any, dims: Sequence[int | None], rank: int, cp: int) -> Any:
    """`shard_values` over a tree's leaves (a target), `dims` one per leaf."""
    leaves, spec = pytree.tree_flatten(tree)
    if len(dims) != len(leaves):  # a stand-in target the analysis did not see: no sequence in it
        return tree
    return pytree.tree_unflatten(shard_values(leaves, dims, rank, cp), spec)


class _GatherSequence(torch.autograd.Function):
    """Every rank's shard, concatenated in rank order along `dim`; backward: each rank's part of
    the summed gradient (reduce-scatter)."""

    @staticmethod
    def forward(ctx, x, dim, comm):  # type: ignore[override]
        ctx.dim, ctx.comm = dim, comm
        moved = x.movedim(dim, 0).contiguous()
        out = moved.new_empty((comm.cp * moved.shape[0], *moved.shape[1:]))
        dist.all_gather_into_tensor(out, moved, group=comm.group)
        return out.movedim(0, dim)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        comm, dim = ctx.comm, ctx.dim
        moved = grad.movedim(dim, 0).contiguous()
        out = moved.new_empty((moved.shape[0] // comm.cp, *moved.shape[1:]))
        dist.reduce_scatter_tensor(out, moved, group=comm.group)
        return out.movedim(0, dim), None, None


def _whole_sequence(x: torch.Tensor, comm: CPComm, dim: int = -2) -> torch.Tensor:
    """Every rank's shard of `x` gathered and put in global order (the sequence along `dim`)."""
    dim = dim % x.dim()
    gathered = _GatherSequence.apply(x, dim, comm)
    order = _chunk_order(comm.cp)
    chunks = gathered.chunk(2 * comm.cp, dim)
    return torch.cat([chunks[order.index(c)] for c in range(2 * comm.cp)], dim)


@torch.fx.wrap
@_eager
def cp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: CPComm, attn_mask: Any = None,
                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                 enable_gqa: bool = False, kv_repeat: int = 1) -> torch.Tensor:
    """`F.scaled_dot_product_attention` for this rank's queries over the whole sequence (module doc).
    q, k, v: [..., sequence shard, head dim], the shard in the load-balanced order. `kv_repeat`: k and
    v come before the model's grouped-query `repeat_interleave(kv_repeat, dim=-3)`, which runs after
    the gather (the exchange moves the key/value heads, not their copies)."""
    if kv_repeat > 1 and not comm.bound:
        k, v = k.repeat_interleave(kv_repeat, dim=-3), v.repeat_interleave(kv_repeat, dim=-3)
    if not comm.bound:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    if attn_mask is not None:
        raise RuntimeError("context parallelism computes the causal mask from positions; an explicit "
                           "attention mask is not supported under it")
    keys, values = _whole_sequence(k, comm), _whole_sequence(v, comm)
    if kv_repeat > 1:
        keys, values = keys.repeat_interleave(kv_repeat, dim=-3), values.repeat_interleave(kv_repeat, dim=-3)
    if not is_causal:
        return F.scaled_dot_product_attention(q, keys, values, dropout_p=dropout_p, scale=scale,
                                              enable_gqa=enable_gqa)
    cp, rank = comm.cp, comm.rank
    chunk = q.shape[-2] // 2
    outs = []
    for part, place in zip(q.split(chunk, -2), (rank, 2 * cp - 1 - rank)):
        seen = (place + 1) * chunk  # keys up to this chunk's end; the rest are masked anyway
        # query i of the chunk (global place*chunk + i) sees keys 0 .. place*chunk + i
        mask = torch.ones(chunk, seen, dtype=torch.bool, device=q.device).tril(place * chunk)
        outs.append(F.scaled_dot_product_attention(part, keys[..., :seen, :], values[..., :seen, :], attn_mask=mask,
                                                   dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa))
    return torch.cat(outs, -2)


@torch.fx.wrap
def cp_positions(length: int, comm: CPComm, device: Any = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`arange(length)` for this rank's shard of `length` tokens: the global positions it holds."""
    if not comm.bound:
        return torch.arange(length, device=device, dtype=dtype)
    return shard_positions(length * comm.cp, comm.rank, comm.cp).to(device=device, dtype=dtype or torch.long)


@torch.fx.wrap
def cp_take(table: torch.Tensor, dim: int, length: int, comm: CPComm) -> torch.Tensor:
    """`table` sliced to the first `length` entries along `dim`, for this rank's shard: the entries
    at the global positions it holds (a RoPE table, a position embedding, a position-id buffer)."""
    if not comm.bound:
        return table.narrow(dim, 0, length)
    return table.index_select(dim, cp_positions(length, comm, table.device))
