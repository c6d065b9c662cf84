"""Tensor-parallel collectives as autograd functions, with Megatron's semantics.

Stage graphs call these by name, so the generated code shows every collective;
the last argument of each is the graph's communicator, `self.tp_comm` (a `TPComm`):

- `copy_to_tp(x, comm)`      f: identity forward, all-reduce of the gradient backward
                             (before a column-parallel layer whose input is replicated)
- `reduce_from_tp(x, comm)`  g: all-reduce forward, identity backward
                             (after a row-parallel layer: sums the partial results)
- `gather_from_tp(x, dim, comm)`  all-gather along `dim` forward, keep this rank's slice backward
- `scatter_to_tp(x, dim, comm)`   keep this rank's slice forward, all-gather backward
  (both take `size=`: the dim's real size where tp does not divide it; the gathered value
  is cut to it, and the scattered blocks end in zero padding; `ir/sharding.py`)
- `scatter_chunks_to_tp(x, dim, chunks, comm)`  the same chunk by chunk: each rank's block of every
  chunk (ALiBi's bias over a merged batch x heads dim)
- `reduce_scatter_to_tp(x, dim, comm)`  reduce-scatter along `dim` forward, all-gather backward
  (sequence parallelism: after a row-parallel layer, the sum left split on the sequence dim)
- `gather_for_column(x, dim, comm)`  all-gather along `dim` forward, reduce-scatter backward
  (sequence parallelism: before a column-parallel layer, whose ranks each make a partial
  gradient of the whole input)
- `column_linear_from_seq_shard(gathered, shard, weight, bias, dim, comm)`  the column-parallel
  linear of `gathered = gather_for_column(shard, dim, comm)` that keeps only the tokens' shard for
  backward and all-gathers it again there for the weight's gradient (Megatron's
  `LinearWithGradAccumulationAndAsyncCommunication` with sequence_parallel); the input's gradient
  goes to `gathered`, whose one reduce-scatter serves every linear reading it
- `vocab_parallel_embedding(ids, weight, padding_idx, comm, vocab, seq_dim=None)`: lookup in this
  rank's rows, zero elsewhere, all-reduce forward (`seq_dim`: reduce-scatter along it)
- `vocab_parallel_cross_entropy(logits, target, ignore_index, reduction, comm, vocab=None)`
  (`vocab`: the real vocabulary when the logits' last blocks end in padding columns)

The communicator (`TPComm`, its links and binding) is ops/tp_comm.py's.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.fx

from ..ir.op_kinds import OpKind, register_function_kind
from .eager import eager as _eager
from .tp_comm import TPComm


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):  # type: ignore[override]
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return ctx.comm.all_reduce(grad.clone(), "backward"), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):  # type: ignore[override]
        return comm.all_reduce(x.clone(), "forward")

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, comm, size):  # type: ignore[override]
        ctx.dim, ctx.comm, ctx.size = dim, comm, size
        return comm.all_gather(x, dim, "forward", size)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        # padding rows were cut off forward: their gradient is zero
        return ctx.comm.local_slice(grad, ctx.dim, ctx.size), None, None, None


class _ScatterToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, comm, size):  # type: ignore[override]
        ctx.dim, ctx.comm, ctx.size = dim, comm, size
        return comm.local_slice(x, dim, size)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return ctx.comm.all_gather(grad, ctx.dim, "backward", ctx.size), None, None, None


class _ReduceScatterToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, comm):  # type: ignore[override]
        ctx.dim, ctx.comm = dim, comm
        return comm.reduce_scatter(x, dim, "forward")

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return ctx.comm.all_gather(grad, ctx.dim, "backward"), None, None


class _GatherForColumn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, comm):  # type: ignore[override]
        ctx.dim, ctx.comm = dim, comm
        return comm.all_gather(x, dim, "forward")

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        # each rank's gradient of the whole input is a partial sum (its columns' share):
        # summed and split in one collective, as f's all-reduce followed by the gather's slice
        return ctx.comm.reduce_scatter(grad, ctx.dim, "backward"), None, None


class _ColumnLinearFromSeqShard(torch.autograd.Function):
    """F.linear(gathered, weight, bias) that keeps `shard` (this rank's block of `gathered` along
    `dim`) for backward instead of `gathered`: tp times less, kept until backward. Backward
    all-gathers the shard again for the weight's gradient; the input's gradient goes to `gathered`
    whole and partial (each rank's columns' share), summed with the other linears' and
    reduce-scattered once by the `gather_for_column` that made it."""

    @staticmethod
    def forward(ctx, gathered, shard, weight, bias, dim, comm):  # type: ignore[override]
        # under torch.autocast the product runs in its dtype, as F.linear's would; the shard and
        # weight are saved cast, so backward computes in that dtype with autocast off
        device = gathered.device.type
        ctx.dtypes = (gathered.dtype, weight.dtype, bias.dtype if bias is not None else None)
        autocast = torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)
        if autocast:
            low = torch.get_autocast_dtype(device)
            gathered, shard, weight = gathered.to(low), shard.to(low), weight.to(low)
            bias = bias.to(low) if bias is not None else None
        ctx.dim, ctx.comm, ctx.has_bias = dim, comm, bias is not None
        ctx.save_for_backward(shard, weight)
        with torch.autocast(device, enabled=False) if autocast else contextlib.nullcontext():
            return torch.nn.functional.linear(gathered, weight, bias)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        shard, weight = ctx.saved_tensors
        grad = grad.to(weight.dtype)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = grad.matmul(weight).to(ctx.dtypes[0])
        if ctx.needs_input_grad[2]:
            whole = ctx.comm.all_gather(shard, ctx.dim, "backward")
            grad_w = grad.flatten(0, -2).t().matmul(whole.flatten(0, -2)).to(ctx.dtypes[1])
        if ctx.has_bias and ctx.needs_input_grad[3]:
            grad_b = grad.flatten(0, -2).sum(0).to(ctx.dtypes[2])
        return grad_x, None, grad_w, grad_b, None, None


@torch.fx.wrap
@_eager
def copy_to_tp(x: torch.Tensor, comm: TPComm) -> torch.Tensor:
    return _CopyToTP.apply(x, comm)


@torch.fx.wrap
@_eager
def reduce_from_tp(x: torch.Tensor, comm: TPComm) -> torch.Tensor:
    return _ReduceFromTP.apply(x, comm)


@torch.fx.wrap
@_eager
def gather_from_tp(x: torch.Tensor, dim: int, comm: TPComm, size: int | None = None) -> torch.Tensor:
    return _GatherFromTP.apply(x, dim, comm, size)


@torch.fx.wrap
@_eager
def gather_chunks_from_tp(x: torch.Tensor, dim: int, chunks: tuple[int, ...], comm: TPComm) -> torch.Tensor:
    """The whole of a value sharded chunk by chunk (each rank holds its block of every chunk: a
    fused QKV's features, the heads inside a merged batch x heads dim): gathered rank after rank,
    then put back chunk after chunk. Its backward is the gather's (each rank's slice) through
    the reordering."""
    gathered = _GatherFromTP.apply(x, dim, comm, None)
    pieces = gathered.split([c // comm.size for c in chunks] * comm.size, dim)
    k = len(chunks)
    return torch.cat([pieces[r * k + i] for i in range(k) for r in range(comm.size)], dim)


@torch.fx.wrap
@_eager
def scatter_to_tp(x: torch.Tensor, dim: int, comm: TPComm, size: int | None = None) -> torch.Tensor:
    return _ScatterToTP.apply(x, dim, comm, size)


@torch.fx.wrap
@_eager
def scatter_chunks_to_tp(x: torch.Tensor, dim: int, chunks: tuple[int, ...], comm: TPComm) -> torch.Tensor:
    """This rank's block of every chunk of the whole `x` (`gather_chunks_from_tp`'s inverse): `x` put
    in rank order (every rank's blocks of all chunks, rank after rank), then the rank's slice of it,
    whose backward gathers the gradient's slices, put back chunk after chunk."""
    if comm.size == 1:
        return x
    dim = dim % x.dim()
    if len(set(chunks)) == 1:  # equal chunks (heads of every sample): as many as `x` holds, whatever its batch
        blocks = x.unflatten(dim, (-1, comm.size, chunks[0] // comm.size))
        ordered = blocks.transpose(dim, dim + 1).flatten(dim, dim + 2)
    else:
        pieces = [p.chunk(comm.size, dim) for p in x.split(list(chunks), dim)]
        ordered = torch.cat([blocks[r] for r in range(comm.size) for blocks in pieces], dim)
    return _ScatterToTP.apply(ordered, dim, comm, None)


@torch.fx.wrap
@_eager
def reduce_scatter_to_tp(x: torch.Tensor, dim: int, comm: TPComm) -> torch.Tensor:
    return _ReduceScatterToTP.apply(x, dim, comm)


@torch.fx.wrap
@_eager
def gather_for_column(x: torch.Tensor, dim: int, comm: TPComm) -> torch.Tensor:
    return _GatherForColumn.apply(x, dim, comm)


@torch.fx.wrap
@_eager
def column_linear_from_seq_shard(gathered: torch.Tensor, shard: torch.Tensor, weight: torch.Tensor,
                                 bias: torch.Tensor | None, dim: int, comm: TPComm) -> torch.Tensor:
    """`F.linear(gathered, weight, bias)`, `gathered` being `gather_for_column(shard, dim, comm)`,
    keeping only `shard` for backward, which all-gathers it again for the weight's gradient
    (Megatron's sequence-parallel linear). The input's gradient flows to `gathered`."""
    return _ColumnLinearFromSeqShard.apply(gathered, shard, weight, bias, dim, comm)


register_function_kind(column_linear_from_seq_shard, OpKind.LINEAR)


@torch.fx.wrap
@_eager
def vocab_parallel_embedding(ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None,
                             comm: TPComm, vocab: int | None = None, seq_dim: int | None = None) -> torch.Tensor:
    """`F.embedding` over a vocabulary split in contiguous row blocks across the tp ranks;
    `seq_dim` given (sequence parallelism): the sum left split along that dim.

    `vocab`: the real number of rows. An id outside it fails, as the untouched model's lookup
    does; masked on every rank it would silently embed as zeros (a tokenizer larger than the
    model's vocabulary). `_assert_async` is a device-side check on GPU: no host sync."""
    rows = weight.shape[0]
    if vocab is not None and ids.device.type != "meta":
        torch._assert_async(((ids >= 0) & (ids < vocab)).all(),
                            f"token id outside the vocabulary of {vocab} rows (vocab-parallel embedding): "
                            "give ids in [0, vocab) or resize the model's embedding to the tokenizer")
    start = comm.rank * rows
    outside = (ids < start) | (ids >= start + rows)
    local = (ids - start).masked_fill(outside, 0)
    local_padding = padding_idx - start if padding_idx is not None and start <= padding_idx < start + rows else None
    out = torch.nn.functional.embedding(local, weight, padding_idx=local_padding)
    out = out.masked_fill(outside.unsqueeze(-1), 0.0)
    if seq_dim is not None:
        return reduce_scatter_to_tp(out, seq_dim, comm)
    return reduce_from_tp(out, comm)


@torch.fx.wrap
def global_shape(x: torch.Tensor, dim: int, comm: TPComm, size: int | None = None) -> torch.Size:
    """`x.shape` as the unsharded tensor has it (x is sharded on `dim`; `size`: its real size,
    the blocks being padded)."""
    shape = list(x.shape)
    shape[dim] = shape[dim] * comm.size if size is None else size
    return torch.Size(shape)


def unpadded(n: int, block: int, size: int) -> int:
    """A size query's global answer on a padded dim: `n` counts `n // block` rows of `block`
    local entries each, and the whole dim has `size` real ones (no padding)."""
    return n // block * size


@torch.fx.wrap
@_eager
def vocab_parallel_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str, comm: TPComm,
    vocab: int | None = None,
) -> torch.Tensor:
    """`F.cross_entropy(logits, target)` with `logits` (N, V) split over the vocabulary.

    `vocab` given: the blocks hold ceil(vocab / tp) columns and the last ones end in
    padding; those columns take no part (-inf before the max and the exponentials, so
    their gradient is zero and no target can pick them).

    Three all-reduces of N numbers (max, sum of exponentials, the target's logit)
    instead of gathering N x V logits. Built from differentiable ops and
    `reduce_from_tp` (all-reduce forward, identity backward), so autograd gives
    each rank the gradient of its own columns: softmax - one_hot.
    """
    rows = logits.shape[-1]
    start = comm.rank * rows
    if vocab is not None and start + rows > vocab:
        columns = torch.arange(start, start + rows, device=logits.device)
        logits = logits.masked_fill(columns >= vocab, float("-inf"))
    # any shift is exact; keep it out of autograd
    global_max = comm.all_reduce(logits.detach().amax(dim=-1), "forward", op=dist.ReduceOp.MAX)
    shifted = logits.float() - global_max.unsqueeze(-1)
    sum_exp = reduce_from_tp(shifted.exp().sum(dim=-1), comm)
    outside = (target < start) | (target >= start + rows)
    local_target = (target - start).masked_fill(outside, 0)
    picked = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
    picked = reduce_from_tp(picked, comm)
    losses = torch.log(sum_exp) - picked
    valid = target != ignore_index
    losses = losses.masked_fill(~valid, 0.0)
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / valid.sum()


def gather_for_inspection(x: torch.Tensor, dim: int, comm: TPComm, size: int | None = None) -> torch.Tensor:
    """All-gather outside autograd (to show or check a sharded output), not counted; `size`: the
    blocks are padded, and the whole value is cut to its real size."""
    if not comm.bound or comm.size == 1:
        return x
    return comm.all_gather(x, dim, None, size)
