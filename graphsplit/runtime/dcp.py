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
whole until then). `run --save DIR` keeps a series, torchtitan's layout:
`DIR/step-<N>`, one checkpoint folder per save, the newest `keep_last` kept;
`--resume DIR` and `export-weights DIR` take the newest complete one.

Reading never unpickles code: DCP's own reader runs `pickle.load` on
`.metadata` and its default planner `torch.load(weights_only=False)` on byte
items, so a crafted checkpoint could run anything. Here `.metadata` goes through
an unpickler that only builds DCP's metadata types, the loaded keys must all be
tensors (read by DCP with `weights_only=True`), and the tensor files must be the
sizes the metadata says, before DCP reads anything.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    _MEM_FORMAT_ENCODING,
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import ReadItem, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.tensor import DTensor

from ..errors import GraphsplitError
from ..ir.program import Program
from ..ir.sharding import Sharding
from .atomic import swap_into_place, temporary_sibling

INFO_FILE = "graphsplit.json"
METADATA_FILE = ".metadata"  # DCP's index of the checkpoint (a pickle)
OPTIMIZER_PREFIX = "optimizer/"
STEP_KEY = "train/step"
STEP_FOLDER = re.compile(r"step-(\d+)")  # DIR/step-<N>: one checkpoint of a series (torchtitan's layout)
# a save's temporary folder, or a replaced folder on its way out (atomic.py's names)
STALE_FOLDER = re.compile(r"\.step-\d+\.(tmp|old)-\w+")


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

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        # DCP's default would torch.load(weights_only=False) them: code from the file. `_require`
        # refuses such keys before DCP runs; this is the last line should one get through.
        raise GraphsplitError(f"checkpoint item {read_item.dest_index.fqn!r} is pickled bytes, not a tensor; "
                              "graphsplit reads only tensors from a checkpoint: use one written by graphsplit")


# Everything a DCP `.metadata` pickles, found by unpickling checkpoints written by `run --save` at
# pp 2, tp 2 x pp 2 with fp16 autocast, dp 2 x tp 2 with FSDP and dp 2 x pp 2 with BatchNorm: the
# metadata dataclasses, torch.Size, dtypes by name (`torch.float32`), layouts by name through
# torch.serialization._get_layout, the memory-format enum, and the checkpoint id (a path, mapped
# to a pure path whatever the system that wrote it). None of them runs code, whatever its arguments.
_METADATA_TYPES: dict[tuple[str, str], Any] = {
    **{("torch.distributed.checkpoint.metadata", cls.__name__): cls for cls in (
        Metadata, TensorStorageMetadata, BytesStorageMetadata, ChunkStorageMetadata, TensorProperties,
        MetadataIndex, StorageMeta, _MEM_FORMAT_ENCODING)},
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    **{(module, name): pure for module in ("pathlib", "pathlib._local")  # Python >= 3.13 says pathlib._local
       for name, pure in (("PosixPath", PurePosixPath), ("PurePosixPath", PurePosixPath),
                          ("WindowsPath", PureWindowsPath), ("PureWindowsPath", PureWindowsPath))},
}


class _Refused(pickle.UnpicklingError):
    """A `.metadata` pickle names something outside DCP's metadata types."""


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata and nothing else: a pickle can only call what `find_class` returns
    (opcodes GLOBAL, STACK_GLOBAL and the extension registry all go through it)."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = _METADATA_TYPES.get((module, name))
        if allowed is not None:
            return allowed
        if module == "torch":  # dtypes pickle as their name; vars(), not getattr: no lazy submodule import
            value = vars(torch).get(name)
            if isinstance(value, torch.dtype | torch.layout | torch.memory_format):
                return value
        raise _Refused(f"{module}.{name}")


def read_metadata(directory: str | Path) -> Metadata:
    """DCP's index of the checkpoint in `directory`, unpickled without running code and checked.

    A refused, truncated or garbage `.metadata` is one `GraphsplitError` naming the file.
    """
    path = Path(directory) / METADATA_FILE
    redo = "use another checkpoint, or save this one again with graphsplit"
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except _Refused as exc:
        raise GraphsplitError(f"{path} asks to call {exc}, which DCP's metadata never holds (a crafted checkpoint runs "
                              f"code this way); refused, nothing from it was run: {redo}") from None
    except OSError as exc:
        raise GraphsplitError(f"cannot read {path}: {exc.strerror or exc}; {redo}") from None
    except Exception as exc:  # noqa: BLE001  anything a truncated or garbage pickle raises
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:120]
        raise GraphsplitError(f"{path} is damaged, not DCP metadata ({reason}); {redo}") from None
    problem = _metadata_problem(metadata)
    if problem:
        raise GraphsplitError(f"{path} is not DCP metadata graphsplit reads ({problem}); {redo}")
    return metadata


def _metadata_problem(metadata: Any) -> str | None:
    """What makes unpickled metadata unusable, or None. The file names are checked to be plain names
    inside the checkpoint folder: DCP would open whatever path they say."""
    if not isinstance(metadata, Metadata):
        return f"it holds a {type(metadata).__name__}"
    if not isinstance(metadata.state_dict_metadata, dict) or not isinstance(metadata.storage_data, dict):
        return "it has no index of tensors and files"
    if metadata.storage_meta is not None and not isinstance(metadata.storage_meta, StorageMeta):
        return "its storage_meta is not a StorageMeta"
    for key, item in metadata.state_dict_metadata.items():
        if not isinstance(key, str) or not isinstance(item, TensorStorageMetadata | BytesStorageMetadata):
            return f"entry {key!r} is a {type(item).__name__}"
        if isinstance(item, TensorStorageMetadata) and not (
                isinstance(item.properties, TensorProperties) and isinstance(item.properties.dtype, torch.dtype)
                and isinstance(item.size, tuple) and all(isinstance(n, int) for n in item.size)):
            return f"tensor {key!r} has no dtype or shape"
    for index, info in metadata.storage_data.items():
        if not isinstance(index, MetadataIndex) or not isinstance(info, _StorageInfo):
            return f"storage entry {index!r} is a {type(info).__name__}"
        name = info.relative_path
        if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name:
            return f"{index.fqn!r} points to {name!r}, not a file of the checkpoint"
        if not (isinstance(info.offset, int) and isinstance(info.length, int) and info.offset >= 0 and info.length >= 0):
            return f"{index.fqn!r} has offset {info.offset!r} and length {info.length!r}"
        if getattr(info, "transform_descriptors", None):
            return f"{name} is stored through {info.transform_descriptors}; graphsplit writes plain files"
    return None


def _check_files(directory: str | Path, metadata: Metadata) -> None:
    """Each tensor file the metadata lists exists and is as long as it says (a deleted or truncated
    shard is one clear line here, not a traceback from inside DCP)."""
    need: dict[str, int] = {}
    for info in metadata.storage_data.values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(need.items()):
        path = Path(directory) / name
        if not path.is_file():
            raise GraphsplitError(f"checkpoint {directory} lacks its tensor file {name} (listed in {METADATA_FILE}); "
                                  "the checkpoint is incomplete: use another checkpoint")
        have = path.stat().st_size
        if have < size:
            raise GraphsplitError(f"{path} is truncated ({have} bytes, {METADATA_FILE} says at least {size}); "
                                  "the checkpoint is damaged: use another checkpoint")


class SafeReader(FileSystemReader):
    """DCP's file-system reader, with `.metadata` read by `read_metadata` (DCP's own runs pickle.load)."""

    # No **kwargs on purpose: DCP then never falls back to per-rank `__<rank>.metadata` files.
    def read_metadata(self) -> Metadata:  # type: ignore[override]
        metadata = read_metadata(self.path)
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _dcp_load(state: dict[str, Any], directory: str | Path, no_dist: bool = False) -> None:
    """`dcp.load` through `SafeReader` and `_LoadPlanner`; a failure on any rank is one GraphsplitError."""
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, storage_reader=SafeReader(str(directory)), planner=_LoadPlanner(), no_dist=no_dist)
    except CheckpointException as exc:
        first = next(iter(exc.failures.values()), (exc, None))[0]
        if isinstance(first, GraphsplitError):
            raise first from None
        reason = " ".join(f"{type(first).__name__}: {first}".split())[:160]
        raise GraphsplitError(f"checkpoint {directory}: reading its tensors failed ({reason}); the checkpoint is "
                              "damaged: use another checkpoint") from None


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
    holder: list[tuple[str, str] | None] = [None]  # ("tmp", folder) or ("error", message), rank 0's answer
    if rank == 0:
        try:
            if final.exists() and not (final / INFO_FILE).is_file():  # never replace a folder that is not ours
                raise GraphsplitError(f"--save {final} exists and is not a graphsplit checkpoint; choose another folder")
            # what a killed save of this folder left
            _remove_stale(final.parent, re.compile(rf"\.{re.escape(final.name)}\.(tmp|old)-\w+"))
            holder[0] = ("tmp", str(temporary_sibling(final)))
        except GraphsplitError as exc:  # every rank raises it, none waits for a folder
            holder[0] = ("error", str(exc))
    dist.broadcast_object_list(holder, src=0)
    kind, value = holder[0] or ("error", "rank 0 gave no folder")
    if kind == "error":
        raise GraphsplitError(value)
    tmp = Path(value)
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


def is_complete(folder: str | Path) -> bool:
    """A checkpoint folder whose save finished: the record is written last, after DCP's files."""
    return (Path(folder) / INFO_FILE).is_file() and (Path(folder) / METADATA_FILE).is_file()


def checkpoints_in(root: str | Path) -> list[tuple[int, Path]]:
    """The complete `step-<N>` checkpoints of a `--save` folder, oldest first; other names and
    incomplete folders are ignored."""
    root = Path(root)
    found = []
    if root.is_dir():
        for entry in root.iterdir():
            match = STEP_FOLDER.fullmatch(entry.name)
            if match and entry.is_dir() and is_complete(entry):
                found.append((int(match.group(1)), entry))
    return sorted(found)


def resolve_checkpoint(path: str | Path) -> Path:
    """`path` if it is a checkpoint, else the newest complete `step-<N>` in it (a `--save` folder)."""
    path = Path(path)
    if is_complete(path):
        return path
    found = checkpoints_in(path)
    if not found:
        read_info(path)  # raises: not a checkpoint and holds none
    return found[-1][1]


def _is_save_folder(root: Path) -> bool:
    """An empty folder, or one that holds only what `save_series` writes."""
    return root.is_dir() and all(
        (STEP_FOLDER.fullmatch(e.name) and e.is_dir()) or STALE_FOLDER.fullmatch(e.name) for e in root.iterdir())


def require_save_folder(root: str | Path) -> None:
    """Refuse, before any training, a `--save` folder that is neither new, empty nor one `--save` wrote."""
    root = Path(root)
    if not (root.exists() or root.is_symlink()) or _is_save_folder(root):
        return
    if is_complete(root):
        raise GraphsplitError(f"--save {root} is a single checkpoint (a folder from save_checkpoint()); --save writes "
                              "step-<N> folders into a folder of its own: choose another folder (--resume reads this one)")
    if not root.is_dir():
        raise GraphsplitError(f"--save {root} exists and is not a folder; choose another path")
    entries = sorted(e.name for e in root.iterdir())
    shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
    raise GraphsplitError(f"--save {root} is a folder graphsplit did not write (it holds {shown}); --save writes only "
                          "into a new or empty folder or one it wrote (step-<N> checkpoints): choose another folder")


def save_series(root: str | Path, state: dict[str, Any], step: int, record: dict[str, Any], keep_last: int,
                keep: str | Path | None = None) -> Path:
    """Every rank calls this: checkpoint `root/step-<step>` atomically, then rank 0 removes the
    temporaries of killed saves and all but the newest `keep_last` checkpoints (0 keeps all;
    `keep`, the checkpoint this run resumed from, is never removed by it). Returns the folder."""
    root = Path(root).resolve()
    refused: list[str | None] = [None]
    if dist.get_rank() == 0:
        try:
            require_save_folder(root)
            _remove_stale(root, STALE_FOLDER)
        except GraphsplitError as exc:
            refused[0] = str(exc)
    dist.broadcast_object_list(refused, src=0)
    if refused[0]:
        raise GraphsplitError(refused[0])
    final = root / f"step-{step}"
    save_checkpoint(final, state, step, record)
    if dist.get_rank() == 0 and keep_last > 0:
        spared = {final, Path(keep).resolve() if keep else None}
        for _, old in checkpoints_in(root)[:-keep_last]:
            if old not in spared:
                shutil.rmtree(old, ignore_errors=True)
    return final


def _remove_stale(parent: Path, names: re.Pattern[str]) -> None:
    """Remove the `.NAME.tmp-*` / `.NAME.old-*` folders (atomic.py's names) matching `names` that a
    killed save left in `parent` (one run saves into a folder at a time)."""
    if not parent.is_dir():
        return
    for entry in parent.iterdir():
        if names.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


def read_info(directory: str | Path) -> dict[str, Any]:
    """The checkpoint's record; a clear error for a folder that is not a complete checkpoint."""
    path = Path(directory)
    if not is_complete(path):
        raise GraphsplitError(f"{path} is not a graphsplit checkpoint and holds none (no {INFO_FILE} and "
                              f"{METADATA_FILE}, no step-<N> folder with them); give a folder written by graphsplit run --save")
    try:
        info = json.loads((path / INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: bad JSON or bytes that are not UTF-8
        reason = " ".join(str(getattr(exc, "strerror", None) or exc).split())[:120]
        raise GraphsplitError(f"{path / INFO_FILE} is unreadable ({reason}); the checkpoint is damaged: "
                              "use another checkpoint") from None
    if not isinstance(info, dict) or not isinstance(info.get("step"), int):
        raise GraphsplitError(f"{path / INFO_FILE} is not graphsplit's record of a checkpoint (no step count); "
                              "the checkpoint is damaged: use another checkpoint")
    return info


def stored_keys(directory: str | Path) -> dict[str, Any]:
    """The checkpoint's keys and their DCP metadata (tensor shape and dtype, or a byte item)."""
    return dict(read_metadata(directory).state_dict_metadata)


def _require(directory: str | Path, state: dict[str, Any]) -> None:
    """One clear error, before DCP runs, for a checkpoint that lacks a tensor of `state`, holds it in
    another shape or as pickled bytes (which DCP would unpickle), or misses bytes of its tensor files."""
    read_info(directory)
    metadata = read_metadata(directory)
    stored = metadata.state_dict_metadata
    missing = sorted(k for k in state if k not in stored)
    if missing:
        what = "optimizer state" if missing[0].startswith(OPTIMIZER_PREFIX) else "tensor"
        raise GraphsplitError(f"checkpoint {directory} has no {what} {missing[0]!r} ({len(missing)} missing); "
                              "resume with the model and optimizer it was saved with")
    for key, value in state.items():
        md = stored[key]
        if not isinstance(md, TensorStorageMetadata):
            raise GraphsplitError(f"checkpoint {directory} holds {key!r} as pickled bytes, not a tensor; graphsplit "
                                  "reads only tensors from a checkpoint (bytes could run code): use one written by graphsplit")
        have = value.size() if isinstance(value, Pieces | torch.Tensor) else None
        if have is not None and tuple(md.size) != tuple(have):
            raise GraphsplitError(f"checkpoint {directory} holds {key!r} with shape {tuple(md.size)}, "
                                  f"the model has {tuple(have)}; resume with the model it was saved with")
    _check_files(directory, metadata)


def check_checkpoint(directory: str | Path) -> None:
    """Everything about a checkpoint folder that can be checked before loading it, each problem one
    GraphsplitError: its record, its metadata (read without running code), its tensor files."""
    read_info(directory)
    _check_files(directory, read_metadata(directory))


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
    _dcp_load(state, directory, no_dist=True)


def load_checkpoint(directory: str | Path, state: dict[str, Any], same_world: bool) -> int:
    """Fill this rank's tensors from a checkpoint written at any plan; returns the steps it had done.

    Every rank calls this. The RNG state is restored only when the world is laid
    out as it was (same plan): otherwise ranks do not correspond.
    """
    step = torch.tensor(0, dtype=torch.int64)
    state = {**state, STEP_KEY: step}
    _require(directory, state)
    _dcp_load(state, directory)
    rng = Path(directory) / "rng" / f"rank{dist.get_rank()}.pt"
    if same_world and rng.is_file():
        try:
            torch.set_rng_state(torch.load(rng, weights_only=True))  # weights_only: tensors, no code
        except Exception as exc:  # noqa: BLE001  a truncated or foreign file
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:120]
            raise GraphsplitError(f"{rng} is damaged ({reason}); the checkpoint is damaged: use another checkpoint") from None
    return int(step)


def export_weights(directory: str | Path, out: str | Path) -> list[str]:
    """One `.safetensors` file of the model's tensors (tied aliases included) from a checkpoint.

    Runs in one process without a process group; returns the names written.
    """
    from safetensors.torch import save_file

    out = Path(out)
    if out.suffix != ".safetensors":
        raise GraphsplitError(f"{out} should end in .safetensors")
    directory = resolve_checkpoint(directory)
    info = read_info(directory)
    aliases = info.get("aliases", {})
    if not (isinstance(aliases, dict) and all(isinstance(a, str) and isinstance(c, str) for a, c in aliases.items())):
        raise GraphsplitError(f"{directory / INFO_FILE} has 'aliases' that are not names; the checkpoint is damaged: "
                              "use another checkpoint")
    stored = stored_keys(directory)
    names = [k for k, md in stored.items()
             if isinstance(md, TensorStorageMetadata) and not k.startswith(OPTIMIZER_PREFIX) and k != STEP_KEY]
    tensors = {k: torch.empty(tuple(stored[k].size), dtype=stored[k].properties.dtype) for k in names}
    _require(directory, tensors)
    _dcp_load(tensors, directory, no_dist=True)
    for alias, canonical in aliases.items():
        if canonical in tensors and alias not in tensors:
            tensors[alias] = tensors[canonical].clone()  # safetensors stores no shared tensors
    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
        os.close(fd)
        save_file(tensors, tmp, metadata={"source": "graphsplit export-weights", "step": str(info["step"])})
        os.replace(tmp, out)
    except OSError as exc:
        raise GraphsplitError(f"cannot write {out}: {exc.strerror or exc}; choose a path you can write to") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)  # gone already when the rename happened
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
