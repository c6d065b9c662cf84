"""Where each input, target and output holds the batch: what micro-batching and the dp replicas cut.

`BatchDims` is decided once per program (analysis/batch/ finds it; a model file's
`batch_dims()` may say it) and read wherever a batch is cut or joined: the micro-batches of the
schedules, the replicas' shares, the analysis shapes, the reference of `--check`, the counts of
samples. A dim of None: that value has no batch and goes whole to every piece.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

Dim = int | None


@dataclass(frozen=True)
class SequenceDims:
    """Where each input, target leaf and output leaf holds the sequence that attention calls mix: what
    context parallelism cuts (None: that value has no sequence and goes whole to every cp rank)."""

    inputs: dict[str, Dim]
    target: tuple[Dim, ...]
    outputs: tuple[Dim, ...]
    length: int
    mixers: tuple[tuple[str, str], ...]  # every (graph node, why) that mixes it ("" as the node: the loss)
    merged: tuple[str, ...] = ()  # values that hold it merged with another dim ("output 0 dim 0"): not cut
    # input and target dims of the sequence's length in another class that ops mix (HF's labels, padded
    # and shifted): (what, why) - the sequence, seen by nothing that ties it to the attention's
    unmatched: tuple[tuple[str, str], ...] = ()

    def input_dims(self, names: Sequence[str]) -> list[Dim]:
        return [self.inputs.get(n) for n in names]


@dataclass(frozen=True)
class BatchDims:
    inputs: dict[str, Dim]  # by the traced input's name
    target: tuple[Dim, ...] = ()  # per leaf of the target
    outputs: tuple[Dim, ...] = ()  # per leaf of the model's output
    size: int = 0  # the example's batch (0: no input carries one)
    how: str = "found"  # "found" in the graph, or "batch_dims()" (the model file's)
    notes: tuple[str, ...] = field(default=())  # what was assumed, what couples the batch
    sequence: SequenceDims | None = None  # the sequence attention mixes, where found (context parallelism)
    # why the loss alone couples the samples (a contrastive loss over the batch x batch logits), and
    # where; "" when it does not. The model is cut as usual; the loss runs on the whole batch: one
    # micro-batch per replica, the replicas' outputs gathered before it (runtime/whole_batch.py)
    whole_loss: str = ""
    # where the model's own tail pairs or couples the samples (CLIP's logits, a contrastive loss in forward):
    # (node, batch dim, the tail's nodes that read it) of each per-sample value the tail reads, gathered
    # over the replicas before it (passes/replica_gather.py); the tail's outputs are the whole batch's,
    # whole on every replica
    gather: tuple[tuple[str, int, tuple[str, ...]], ...] = ()
    # embedding_bag calls (graph nodes) whose indices and offsets are cut with the batch, one index per
    # bag: each piece's offsets checked and counted from its first (passes/bag_offsets.py)
    bags: tuple[str, ...] = ()
    # graph nodes that sum the batch away unnormalized (a loss summed over the samples): the pieces' losses
    # add up to the whole batch's (passes/token_mean.py scales them so)
    sums: tuple[str, ...] = ()

    @classmethod
    def leading(cls, names: Sequence[str], flat: Sequence[Any]) -> BatchDims:
        """The convention before discovery: dim 0 of every tensor with dims (programs built by hand)."""
        size = next((int(t.shape[0]) for t in flat if isinstance(t, torch.Tensor) and t.dim()), 0)
        # a sparse input (a graph's adjacency) is never cut: it goes whole
        dims = {n: None if isinstance(t, torch.Tensor) and t.layout != torch.strided else 0 for n, t in zip(names, flat)}
        return cls(dims, size=size, how="dim 0")

    def input_dims(self, names: Sequence[str]) -> list[Dim]:
        return [self.inputs.get(n, 0) for n in names]

    def target_dims(self, target: Any) -> list[Dim]:
        """Per leaf of `target` (the stand-in target: one value per example, along dim 0)."""
        leaves = pytree.tree_leaves(target)
        if len(leaves) == len(self.target):
            return list(self.target)
        return [0 if self.size else None] * len(leaves)

    @property
    def batched(self) -> bool:
        """Some input holds a batch (dim 0 assumed counts, even of an empty example: refused later)."""
        return self.size > 0 or self.how == "dim 0"

    def describe(self, names: Sequence[str]) -> str:
        """`src` dim 1, `pos` whole (found in the graph)."""
        if not self.batched:
            return "no batch (every input whole: one micro-batch, no dp replicas)"
        parts = [f"{n} " + (f"dim {d}" if d is not None else "whole") for n, d in zip(names, self.input_dims(names))]
        return f"{', '.join(parts)} ({'found in the graph' if self.how == 'found' else self.how})"

    def to_dict(self, names: Sequence[str]) -> dict[str, Any]:
        return {"inputs": dict(zip(names, self.input_dims(names))), "target": list(self.target),
                "outputs": list(self.outputs), "size": self.size, "how": self.how, "notes": list(self.notes),
                "whole_loss": self.whole_loss, "gather": [[n, d, list(r)] for n, d, r in self.gather],
                "bags": list(self.bags)}
