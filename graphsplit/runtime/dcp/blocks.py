"""The blocks each rank hands DCP: its part of each tensor of the original model, at its offsets.

A column-parallel weight is one block, a fused QKV weight one block per chunk
(each rank holds its part of q, of k and of v), a replicated tensor one block at
offset 0, a padded vocabulary (tp does not divide it) the block of its real rows
(the padding is no part of the model); under FSDP only the part inside this dp
rank's window. DCP asks
objects it does not know for their blocks through the protocol DTensor uses, so
a checkpoint written at one plan loads at any other: DCP reads, for each block a
rank needs, the overlapping stored blocks.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import ReadItem, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.tensor import DTensor

from ...errors import GraphsplitError
from ...ir.sharding import Layout, Shard, real_rows


@dataclass
class Pieces:
    """This rank's blocks of one tensor of the original model.

    DCP asks objects it does not know for their blocks through the
    `__create_write_items__` / `__create_chunk_list__` / `__get_tensor_shard__`
    protocol DTensor uses; the blocks are views of the live tensors, so a load
    writes straight into the parameters.
    """

    global_size: torch.Size
    blocks: list[tuple[torch.Size, torch.Tensor]]  # (offsets in the whole tensor, view)

    def size(self) -> torch.Size:
        return self.global_size

    def __create_write_items__(self, fqn: str, obj: Any) -> list[WriteItem]:
        return [
            WriteItem(
                index=MetadataIndex(fqn, offsets),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=offsets, sizes=block.size()),
                    properties=TensorProperties.create_from_tensor(block),
                    size=self.global_size,
                ),
            )
            for offsets, block in self.blocks
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(offsets=offsets, sizes=block.size()) for offsets, block in self.blocks]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        for offsets, block in self.blocks:
            if offsets == index.offset:
                return block
        raise ValueError(f"{index.fqn}: this rank holds no block at offset {tuple(index.offset or ())}")


def pieces_of(local: torch.Tensor, sharding: Layout, tp_rank: int, tp: int) -> Pieces:
    """The blocks of the whole tensor that this rank's `local` tensor holds.

    `local` is this tp rank's shard, or (FSDP) a DTensor sharding that shard over
    the dp replicas: then only the part of each tp block inside this dp rank's
    window is held.
    """
    window_start, window = [0] * local.dim(), local
    if isinstance(local, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        _, offsets = compute_local_shape_and_global_offset(local.shape, local.device_mesh, local.placements)
        window_start, window = list(offsets), local.to_local()
    tp_local_shape = list(local.shape)  # this tp rank's shard, whole over dp
    full = list(tp_local_shape)
    tp_blocks: list[tuple[list[int], list[int], list[int]]] = []  # (start in the tp shard, size, start in the whole)
    if not isinstance(sharding, Shard) or tp == 1:
        tp_blocks.append(([0] * local.dim(), list(tp_local_shape), [0] * local.dim()))
    elif sharding.padded:  # only the real rows are the model's: the padding is never written nor read
        dim = sharding.dim
        full[dim] = sharding.size
        start, count = real_rows(sharding, tp_rank, tp, sharding.size)
        if count:
            size = list(tp_local_shape)
            size[dim] = count
            glo = [0] * local.dim()
            glo[dim] = start
            tp_blocks.append(([0] * local.dim(), size, glo))
    else:
        dim = sharding.dim
        full[dim] *= tp
        start_global, start_local = 0, 0
        for chunk in sharding.chunks or (full[dim],):  # each rank holds its 1/tp of every chunk of a fused dim
            width = chunk // tp
            lo, size, glo = [0] * local.dim(), list(tp_local_shape), [0] * local.dim()
            lo[dim], size[dim], glo[dim] = start_local, width, start_global + tp_rank * width
            tp_blocks.append((lo, size, glo))
            start_global += chunk
            start_local += width
    blocks = []
    for lo, size, glo in tp_blocks:  # intersect each tp block with the dp window
        view, offsets = window, []
        for d in range(local.dim()):
            a = max(lo[d], window_start[d])
            b = min(lo[d] + size[d], window_start[d] + window.shape[d])
            if b <= a:
                break
            view = view.narrow(d, a - window_start[d], b - a)
            offsets.append(glo[d] + a - lo[d])
        else:
            blocks.append((torch.Size(offsets), view))
    return Pieces(torch.Size(full), blocks)


class SavePlanner(DefaultSavePlanner):
    def lookup_object(self, index: MetadataIndex) -> Any:
        obj = self.state_dict[index.fqn]
        return obj.__get_tensor_shard__(index) if isinstance(obj, Pieces) else super().lookup_object(index)


class LoadPlanner(DefaultLoadPlanner):
    def set_up_planner(self, state_dict: dict[str, Any], metadata: Any = None, is_coordinator: bool = False) -> None:
        # DCP's set-up rebuilds the state dict and drops leaves it does not know: keep ours aside
        pieces = {k: v for k, v in state_dict.items() if isinstance(v, Pieces)}
        rest = {k: v for k, v in state_dict.items() if k not in pieces}
        super().set_up_planner(rest, metadata, is_coordinator)
        self.state_dict.update(pieces)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        obj = self.state_dict[index.fqn]
        return obj.__get_tensor_shard__(index) if isinstance(obj, Pieces) else super().lookup_tensor(index)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        # DCP's default would torch.load(weights_only=False) them: code from the file. `require_loadable`
        # refuses such keys before DCP runs; this is the last line should one get through.
        raise GraphsplitError(f"checkpoint item {read_item.dest_index.fqn!r} is pickled bytes, not a tensor; "
                              "graphsplit reads only tensors from a checkpoint: use one written by graphsplit")


def in_experts(pieces: Pieces, dim: int, ep_rank: int, ep: int) -> Pieces:
    """`pieces` of one expert-parallel rank's slice of an expert weight (its E / ep experts along `dim`)
    placed in the whole weight: the whole is ep times larger along `dim`, each block shifted to the
    rank's experts."""
    if ep == 1:
        return pieces
    width = pieces.global_size[dim]
    size = list(pieces.global_size)
    size[dim] = width * ep
    moved = []
    for offsets, block in pieces.blocks:
        at = list(offsets)
        at[dim] += ep_rank * width
        moved.append((torch.Size(at), block))
    return Pieces(torch.Size(size), moved)
