"""Micro-batches: cut a batch as the pipelining schedules do, join the outputs back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import GraphsplitError
from ..ir.program import Program


def split_microbatches(value: Any, n: int, dims: Sequence[int | None] | None = None) -> list[Any]:
    """Cut every tensor in `value` into `n` pieces along its batch dim, as the pipelining schedules
    do. `dims`: per leaf of `value` (pytree order), the batch dim or None (the leaf goes whole to
    every piece); by default dim 0 of every tensor."""
    leaves, spec = pytree.tree_flatten(value)
    dims = _aligned(dims, len(leaves))
    pieces = []
    for leaf, dim in zip(leaves, dims):
        if isinstance(leaf, torch.Tensor) and dim is not None and n > 1:
            if leaf.layout != torch.strided:
                raise GraphsplitError(
                    f"a {str(leaf.layout).removeprefix('torch.')} tensor of shape {tuple(leaf.shape)} (a sparse input) "
                    f"cannot be cut into {n} micro-batches; run with --dp 1 --microbatches 1, or give batch_dims() "
                    "with None for it")
            if leaf.dim() <= dim or leaf.shape[dim] % n:
                raise GraphsplitError(
                    f"a batch tensor of shape {tuple(leaf.shape)} cannot be cut into {n} equal micro-batches "
                    f"along dim {dim}; use a batch size divisible by {n} or change --microbatches"
                )
            pieces.append(torch.tensor_split(leaf, n, dim=dim))
        else:
            pieces.append([leaf] * n)
    return [pytree.tree_unflatten([p[i] for p in pieces], spec) for i in range(n)]


def _aligned(dims: Sequence[int | None] | None, count: int) -> Sequence[int | None]:
    """Per-leaf batch dims for `count` leaves: dim 0 of each where none are known."""
    if dims is None or (not dims and count):
        return [0] * count
    if len(dims) != count:
        raise GraphsplitError(f"internal: {len(dims)} batch dims for {count} values")
    return dims


def merge_outputs(chunks: list[Any], dims: Sequence[int | None] | None = None) -> Any:
    """Concatenate per-micro-batch values along their batch dims (scalars: stacked; a value with no
    batch dim: the first piece's, as every piece holds it whole)."""
    flat = [pytree.tree_flatten(c) for c in chunks]
    spec = flat[0][1]
    columns = list(zip(*(f[0] for f in flat)))
    dims = _aligned(dims, len(columns))
    merged = []
    for leaves, dim in zip(columns, dims):
        if not isinstance(leaves[0], torch.Tensor):
            merged.append(leaves[0])
        elif leaves[0].dim() == 0:
            merged.append(torch.stack(leaves))
        else:
            merged.append(torch.cat(leaves, dim) if dim is not None else leaves[0])
    return pytree.tree_unflatten(merged, spec)


def join_outputs(chunks: list[Any], dims: Sequence[int | None] | None = None) -> Any:
    """The model's output over the whole batch from its outputs on equal pieces of it: batched
    tensors concatenated along their batch dims, a scalar (the model's own loss, a mean) averaged
    as the pieces' losses are, a value with no batch dim the first piece's."""
    flat = [pytree.tree_flatten(c) for c in chunks]
    columns = list(zip(*(f[0] for f in flat)))
    dims = _aligned(dims, len(columns))
    joined = []
    for leaves, dim in zip(columns, dims):
        if not isinstance(leaves[0], torch.Tensor):
            joined.append(leaves[0])
        elif leaves[0].dim() == 0:
            joined.append(torch.stack(leaves).mean(0))
        else:
            joined.append(torch.cat(leaves, dim) if dim is not None else leaves[0])
    return pytree.tree_unflatten(joined, flat[0][1])


def cut_batch(program: Program, inputs: Sequence[Any], target: Any, n: int) -> list[tuple[Any, Any]]:
    """`n` equal pieces of (flat inputs, target) along the program's batch dims."""
    dims = [*program.batch.input_dims(program.traced.input_names), *program.batch.target_dims(target)]
    pieces = split_microbatches((tuple(inputs), target), n, dims)
    return [(tuple(i), t) for i, t in pieces]


def batch_size(program: Program, inputs: Sequence[Any]) -> int:
    """How many examples flat `inputs` hold along the program's batch dims (1 with no batch)."""
    for t, dim in zip(inputs, program.batch.input_dims(program.traced.input_names)):
        if isinstance(t, torch.Tensor) and dim is not None and t.dim() > dim:
            return int(t.shape[dim])
    return 1


def target_batch_dim(program: Program) -> int | None:
    """The batch dim of a one-tensor target when it is not dim 0 (where torch's schedules cut it)."""
    dims = program.batch.target
    return dims[0] if len(dims) == 1 and dims[0] not in (None, 0) else None


def batch_first(program: Program, target: Any) -> Any:
    """A one-tensor target with its batch dim moved to dim 0, for torch's schedules to cut; one with no
    batch dim (a 0-dim scale, a shared table) as a copy per micro-batch along a new dim 0 (an expanded
    view), so each micro-batch's loss gets it whole (`whole_target`: the loss reads `target[0]`)."""
    if not isinstance(target, torch.Tensor):
        return target
    if whole_target(program):
        return target.unsqueeze(0).expand(program.plan.num_microbatches, *target.shape)
    moved = target_batch_dim(program)
    return target.movedim(moved, 0) if moved is not None else target


def whole_target(program: Program) -> bool:
    """The target is one tensor with no batch dim: every micro-batch and replica takes it whole."""
    dims = program.batch.target
    return len(dims) == 1 and dims[0] is None


def stage_output_dims(program: Program, per_leaf: Sequence[int | None] | None = None,
                      default: int | None = 0) -> list[int | None]:
    """Batch dims of the last stage's outputs (each the dim of the model's output leaf it is), or of
    `per_leaf` (one dim per model output leaf: the sequence's)."""
    outputs = program.batch.outputs if per_leaf is None else per_leaf
    dims: dict[int, int | None] = {}
    for k, (what, i) in enumerate(program.output_leaves):
        if what == "tensor":
            dims.setdefault(i, outputs[k] if k < len(outputs) else default)
    return [dims.get(i, default) for i in range(max(dims, default=-1) + 1)]


def call_dims(program: Program, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int | None]:
    """Batch dims per leaf of `(args, kwargs)` as the model is called: each leaf found among the
    traced inputs by identity (a leaf no input is, a flag or a size, goes whole)."""
    leaves = pytree.tree_leaves((args, kwargs))
    flat = program.traced.flatten_inputs(args, kwargs)
    by_id = {id(t): d for t, d in zip(flat, program.batch.input_dims(program.traced.input_names))}
    return [by_id.get(id(leaf)) if isinstance(leaf, torch.Tensor) else None for leaf in leaves]


def batch_tree_dims(program: Program, args: tuple[Any, ...], kwargs: dict[str, Any], target: Any) -> list[int | None]:
    """Batch dims per leaf of a `Batch.tree()`: (args, kwargs, target)."""
    return [*call_dims(program, args, kwargs), *program.batch.target_dims(target)]


def sequence_share(program: Program, inputs: Sequence[Any], target: Any, cp_rank: int) -> tuple[tuple[Any, ...], Any]:
    """Context parallelism: cp rank `cp_rank`'s load-balanced shard of every sequence in (flat inputs,
    target), one sample replica's share; unchanged without cp."""
    seq, cp = program.batch.sequence, program.plan.cp
    if cp == 1 or seq is None:
        return tuple(inputs), target
    from ..ops.context_parallel import shard_tree, shard_values

    return (tuple(shard_values(inputs, seq.input_dims(program.traced.input_names), cp_rank, cp)),
            shard_tree(target, seq.target, cp_rank, cp))


def join_sequence(program: Program, shards: list[Any]) -> Any:
    """The last stage's raw output over whole sequences from each cp rank's (rank order): sequence-
    holding tensors put back in global order, the rest (a scalar: the model's own mean loss) as
    `join_outputs` joins equal pieces."""
    seq = program.batch.sequence
    if len(shards) == 1 or seq is None:
        return shards[0]
    from ..ops.context_parallel import unshard_sequence

    dims = stage_output_dims(program, seq.outputs, default=None)
    flat = [pytree.tree_flatten(s) for s in shards]
    joined = []
    for i, leaves in enumerate(zip(*(f[0] for f in flat))):
        dim = dims[i] if i < len(dims) else None
        if isinstance(leaves[0], torch.Tensor) and dim is not None:
            joined.append(unshard_sequence(list(leaves), dim))
        elif isinstance(leaves[0], torch.Tensor) and leaves[0].dim() == 0:
            joined.append(torch.stack(leaves).mean(0))  # a mean over equal shards
        else:
            joined.append(leaves[0])
    return pytree.tree_unflatten(joined, flat[0][1])


def gather_outputs(program: Program, output: Any, comm: Any) -> Any:
    """The last stage's raw output with vocab-sharded tensors gathered (for checks and display)."""
    if not program.sharded_outputs or output is None:
        return output
    from ..ops import tp as tpops

    outs = (output,) if isinstance(output, torch.Tensor) else tuple(output)
    whole = [tpops.gather_for_inspection(t, program.sharded_outputs[i].dim, comm, program.sharded_outputs[i].size)
             if i in program.sharded_outputs else t
             for i, t in enumerate(outs)]
    return whole[0] if isinstance(output, torch.Tensor) else tuple(whole)
