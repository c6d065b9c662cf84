"""Micro-batches: cut a batch as the pipelining schedules do, join the outputs back."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import GraphsplitError
from ..ir.program import Program


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


def join_outputs(chunks: list[Any]) -> Any:
    """The model's output over the whole batch from its outputs on equal pieces of it: batched
    tensors concatenated along dim 0, a scalar (the model's own loss, a mean) averaged as the
    pieces' losses are."""
    flat = [pytree.tree_flatten(c) for c in chunks]
    joined = []
    for leaves in zip(*(f[0] for f in flat)):
        if isinstance(leaves[0], torch.Tensor):
            joined.append(torch.cat(leaves) if leaves[0].dim() else torch.stack(leaves).mean(0))
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
