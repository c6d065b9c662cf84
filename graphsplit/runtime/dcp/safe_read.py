"""Reading checkpoints that may come from anyone, without ever running code from them.

DCP's own reader runs `pickle.load` on `.metadata`, and its default planner
`torch.load(weights_only=False)` on byte items, so a crafted checkpoint could run
anything. Here `.metadata` goes through an unpickler that only builds DCP's
metadata types, the loaded keys must all be tensors (read by DCP with
`weights_only=True`), and the tensor files must be the sizes the metadata says,
before DCP reads anything. Each problem is one GraphsplitError naming the file.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
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

from ...errors import GraphsplitError
from .blocks import LoadPlanner, Pieces
from .record import METADATA_FILE, OPTIMIZER_PREFIX, read_info

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


def check_files(directory: str | Path, metadata: Metadata) -> None:
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


def dcp_load(state: dict[str, Any], directory: str | Path, no_dist: bool = False) -> None:
    """`dcp.load` through `SafeReader` and `LoadPlanner`; a failure on any rank is one GraphsplitError."""
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, storage_reader=SafeReader(str(directory)), planner=LoadPlanner(), no_dist=no_dist)
    except CheckpointException as exc:
        first = next(iter(exc.failures.values()), (exc, None))[0]
        if isinstance(first, GraphsplitError):
            raise first from None
        reason = " ".join(f"{type(first).__name__}: {first}".split())[:160]
        raise GraphsplitError(f"checkpoint {directory}: reading its tensors failed ({reason}); the checkpoint is "
                              "damaged: use another checkpoint") from None


def stored_keys(directory: str | Path) -> dict[str, Any]:
    """The checkpoint's keys and their DCP metadata (tensor shape and dtype, or a byte item)."""
    return dict(read_metadata(directory).state_dict_metadata)


def require_loadable(directory: str | Path, state: dict[str, Any]) -> None:
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
    check_files(directory, metadata)


def check_checkpoint(directory: str | Path) -> None:
    """Everything about a checkpoint folder that can be checked before loading it, each problem one
    GraphsplitError: its record, its metadata (read without running code), its tensor files."""
    read_info(directory)
    check_files(directory, read_metadata(directory))
