"""Training checkpoints with torch.distributed.checkpoint (DCP), keyed by the original model's names.

Every rank hands DCP the blocks of the original tensors it holds, at their
offsets in the whole tensor (`Pieces`): a column-parallel weight is one block,
a fused QKV weight one block per chunk (each rank holds its part of q, of k
and of v), a replicated tensor one block at offset 0. So a checkpoint written
at one plan loads at any other — DCP reads, for each block a rank needs, the
overlapping stored blocks — and `export_weights` turns it into one
`.safetensors` file the untouched model loads.

Keys: parameters and persistent buffers under their names in
`model.state_dict()` (tied aliases once, under the first name);
`optimizer/<name>/<state>` for the optimizer's per-parameter state (AdamW's
exp_avg, exp_avg_sq, step); `train/step` for the steps done. Each rank's RNG
state goes to `rng/rank<N>.pt` beside DCP's files, and `graphsplit.json`
records the plan and the names of tied aliases.

A save is written to a temporary sibling folder and renamed into place only
when every rank has finished, so a crash during a save never leaves a folder
that loads as a checkpoint (and an earlier checkpoint at the same path stays
whole until then).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType
from torch.distributed.tensor import DTensor

from .atomic import swap_into_place, temporary_sibling
from .errors import GraphsplitError
from .program import Program
from .sharding import Sharding

INFO_FILE = "graphsplit.json"
OPTIMIZER_PREFIX = "optimizer/"
STEP_KEY = "train/step"


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


def pieces_of(local: torch.Tensor, sharding: Sharding, tp_rank: int, tp: int) -> Pieces:
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
    if sharding.kind != "S" or tp == 1:
        tp_blocks.append(([0] * local.dim(), list(tp_local_shape), [0] * local.dim()))
    else:
        dim = sharding.dim
        assert dim is not None
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


class _SavePlanner(DefaultSavePlanner):
    def lookup_object(self, index: MetadataIndex) -> Any:
        obj = self.state_dict[index.fqn]
        return obj.__get_tensor_shard__(index) if isinstance(obj, Pieces) else super().lookup_object(index)


class _LoadPlanner(DefaultLoadPlanner):
    def set_up_planner(self, state_dict: dict[str, Any], metadata: Any = None, is_coordinator: bool = False) -> None:
        # DCP's set-up rebuilds the state dict and drops leaves it does not know: keep ours aside
        pieces = {k: v for k, v in state_dict.items() if isinstance(v, Pieces)}
        rest = {k: v for k, v in state_dict.items() if k not in pieces}
        super().set_up_planner(rest, metadata, is_coordinator)
        self.state_dict.update(pieces)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        obj = self.state_dict[index.fqn]
        return obj.__get_tensor_shard__(index) if isinstance(obj, Pieces) else super().lookup_tensor(index)


def rank_state(
    program: Program,
    modules: Mapping[int, nn.Module],
    optimizer: torch.optim.Optimizer | None,
    tp_rank: int,
    persistent: set[str],
) -> dict[str, Any]:
    """What this rank contributes to a checkpoint (and reads back on resume), by original name.

    `persistent`: the names `model.state_dict()` has (non-persistent buffers are
    rebuilt by the constructor and are not saved).
    """
    tp = program.plan.tp
    state: dict[str, Any] = {}
    for index, module in sorted(modules.items()):
        stage = program.stages[index]
        for local, canonical in stage.param_sources.items():
            if canonical in state:
                continue  # a tied alias in this stage, or a copy in another stage of this rank
            p = module.get_parameter(local)
            sharding = program.param_sharding(canonical)
            state[canonical] = pieces_of(p.data, sharding, tp_rank, tp)
            if optimizer is not None:
                for key, value in optimizer.state.get(p, {}).items():
                    name = f"{OPTIMIZER_PREFIX}{canonical}/{key}"
                    if isinstance(value, torch.Tensor) and value.shape == p.shape and value.dim():
                        state[name] = pieces_of(value, sharding, tp_rank, tp)
                    elif isinstance(value, DTensor):  # FSDP keeps even the scalar step as a DTensor
                        state[name] = value.to_local()
                    elif isinstance(value, torch.Tensor):
                        state[name] = value
        for local, canonical in stage.buffer_sources.items():
            if canonical in persistent and canonical not in state:
                state[canonical] = module.get_buffer(local)
    return state


def scaler_state(scaler: Any) -> dict[str, torch.Tensor]:
    """fp16: the loss scale and its growth counter (the same on every rank), so a resume goes on exactly."""
    if scaler is None:
        return {}
    return {"train/loss_scale": scaler._scale, "train/loss_scale_growth": scaler._growth_tracker}


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the per-parameter state a step would create, so a load has tensors to fill."""
    if isinstance(optimizer, torch.optim.AdamW | torch.optim.Adam):
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p not in optimizer.state:
                    optimizer.state[p] = {
                        "step": torch.tensor(0.0),
                        "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                        "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                    }
    elif isinstance(optimizer, torch.optim.SGD):
        if any(group.get("momentum", 0) for group in optimizer.param_groups):
            raise GraphsplitError("resuming SGD with momentum is not supported; use plain SGD or AdamW")
    else:
        raise GraphsplitError(f"resuming {type(optimizer).__name__} is not supported; use sgd or adamw")


def save_checkpoint(directory: str | Path, state: dict[str, Any], step: int, record: dict[str, Any]) -> None:
    """Every rank calls this: DCP writes the blocks (each stored once), then rank 0 renames into place."""
    final = Path(directory).resolve()
    rank = dist.get_rank()
    tmp_holder: list[str | None] = [None]
    if rank == 0:
        if final.exists() and not (final / INFO_FILE).is_file():
            tmp_holder[0] = "!"  # refuse to replace a folder that is not a graphsplit checkpoint
        else:
            tmp_holder[0] = str(temporary_sibling(final))
    dist.broadcast_object_list(tmp_holder, src=0)
    if tmp_holder[0] == "!":
        raise GraphsplitError(f"--save {final} exists and is not a graphsplit checkpoint; choose another folder")
    tmp = Path(str(tmp_holder[0]))
    full_state = dict(state)
    full_state[STEP_KEY] = torch.tensor(step, dtype=torch.int64)
    try:
        dcp.save(full_state, checkpoint_id=tmp, planner=_SavePlanner())
        (tmp / "rng").mkdir(exist_ok=True)
        torch.save(torch.get_rng_state(), tmp / "rng" / f"rank{rank}.pt")
        dist.barrier()
        if rank == 0:
            # the record is what makes a folder a checkpoint: written last, then the folder is renamed
            (tmp / INFO_FILE).write_text(json.dumps({**record, "step": step, "world_size": dist.get_world_size()}, indent=2))
            swap_into_place(tmp, final)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    dist.barrier()


def read_info(directory: str | Path) -> dict[str, Any]:
    """The checkpoint's record; a clear error for a folder that is not a complete checkpoint."""
    path = Path(directory)
    if not (path / INFO_FILE).is_file() or not (path / ".metadata").is_file():
        raise GraphsplitError(f"{path} is not a graphsplit checkpoint (no {INFO_FILE} or .metadata); "
                              "give a folder written by graphsplit run --save")
    return json.loads((path / INFO_FILE).read_text())


def stored_keys(directory: str | Path) -> dict[str, Any]:
    return dict(dcp.FileSystemReader(str(directory)).read_metadata().state_dict_metadata)


def _require(directory: str | Path, state: dict[str, Any]) -> None:
    """One clear error, before DCP runs, for a checkpoint that lacks a tensor of `state` or holds it in another shape."""
    read_info(directory)
    stored = stored_keys(directory)
    missing = sorted(k for k in state if k not in stored)
    if missing:
        what = "optimizer state" if missing[0].startswith(OPTIMIZER_PREFIX) else "tensor"
        raise GraphsplitError(f"checkpoint {directory} has no {what} {missing[0]!r} ({len(missing)} missing); "
                              "resume with the model and optimizer it was saved with")
    for key, value in state.items():
        md = stored[key]
        have = value.size() if isinstance(value, Pieces | torch.Tensor) else None
        if isinstance(md, TensorStorageMetadata) and have is not None and tuple(md.size) != tuple(have):
            raise GraphsplitError(f"checkpoint {directory} holds {key!r} with shape {tuple(md.size)}, "
                                  f"the model has {tuple(have)}; resume with the model it was saved with")


def load_whole_model(directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """The untouched model and its optimizer take a checkpoint's values, whole tensors, in one process
    (the reference of `run --resume --check`)."""
    init_optimizer_state(optimizer)
    persistent, _ = model_names(model)
    state: dict[str, Any] = {}
    for name, p in model.named_parameters():
        state[name] = p.data
        for key, value in optimizer.state.get(p, {}).items():
            state[f"{OPTIMIZER_PREFIX}{name}/{key}"] = value
    state.update({n: b for n, b in model.named_buffers() if n in persistent})
    _require(directory, state)
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(directory), no_dist=True)


def load_checkpoint(directory: str | Path, state: dict[str, Any], same_world: bool) -> int:
    """Fill this rank's tensors from a checkpoint written at any plan; returns the steps it had done.

    Every rank calls this. The RNG state is restored only when the world is laid
    out as it was (same plan): otherwise ranks do not correspond.
    """
    _require(directory, state)
    step = torch.tensor(0, dtype=torch.int64)
    dcp.load({**state, STEP_KEY: step}, checkpoint_id=str(directory), planner=_LoadPlanner())
    rng = Path(directory) / "rng" / f"rank{dist.get_rank()}.pt"
    if same_world and rng.is_file():
        torch.set_rng_state(torch.load(rng, weights_only=True))
    return int(step)


def export_weights(directory: str | Path, out: str | Path) -> list[str]:
    """One `.safetensors` file of the model's tensors (tied aliases included) from a checkpoint.

    Runs in one process without a process group; returns the names written.
    """
    from safetensors.torch import save_file

    out = Path(out)
    if out.suffix != ".safetensors":
        raise GraphsplitError(f"{out} should end in .safetensors")
    info = read_info(directory)
    stored = stored_keys(directory)
    names = [k for k, md in stored.items()
             if isinstance(md, TensorStorageMetadata) and not k.startswith(OPTIMIZER_PREFIX) and k != STEP_KEY]
    tensors = {k: torch.empty(tuple(stored[k].size), dtype=stored[k].properties.dtype) for k in names}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(tensors, checkpoint_id=str(directory), no_dist=True)
    for alias, canonical in info.get("aliases", {}).items():
        if canonical in tensors and alias not in tensors:
            tensors[alias] = tensors[canonical].clone()  # safetensors stores no shared tensors
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"source": "graphsplit export-weights", "step": str(info.get("step", ""))})
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return sorted(tensors)


def model_names(model: nn.Module) -> tuple[set[str], dict[str, str]]:
    """The names `model.state_dict()` has, and each tied alias -> the first name of its tensor."""
    persistent = set(model.state_dict(keep_vars=True))
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return persistent, aliases
