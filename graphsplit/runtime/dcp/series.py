"""A series of checkpoints, torchtitan's layout: `run --save DIR` writes `DIR/step-<N>`.

One checkpoint folder per save, the newest `keep_last` kept; `--resume DIR`
and `export-weights DIR` take the newest complete one. A `--save` folder holds
nothing else: graphsplit never writes into a folder it did not write.

Finding and checking a series imports no DCP; only saving does.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ...errors import GraphsplitError
from ..atomic import leftovers, remove_leftovers, require_replaceable
from .record import is_complete, read_info

STEP_NAME = r"step-\d+"
STEP_FOLDER = re.compile(r"step-(\d+)")  # DIR/step-<N>: one checkpoint of a series


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
    """A folder that holds only what `save_series` writes: checkpoints and a killed save's leftovers."""
    stale = leftovers(STEP_NAME)
    return all((STEP_FOLDER.fullmatch(e.name) and e.is_dir()) or stale.fullmatch(e.name) for e in root.iterdir())


def require_save_folder(root: str | Path) -> None:
    """Refuse, before any training, a `--save` folder that is neither new, empty nor one `--save` wrote."""
    root = Path(root)
    if is_complete(root):  # ours, but not a series: say what to do with it
        raise GraphsplitError(f"--save {root} is a single checkpoint (a folder from save_checkpoint()); --save writes "
                              "step-<N> folders into a folder of its own: choose another folder (--resume reads this one)")
    require_replaceable(root, _is_save_folder, "--save", "step-<N> checkpoints (a --save folder)")


def save_series(root: str | Path, state: dict[str, Any], step: int, record: dict[str, Any], keep_last: int,
                keep: str | Path | None = None) -> Path:
    """Every rank calls this: checkpoint `root/step-<step>` atomically, then rank 0 removes the
    temporaries of killed saves and all but the newest `keep_last` checkpoints (0 keeps all;
    `keep`, the checkpoint this run resumed from, is never removed by it). Returns the folder."""
    # DCP takes a second to import: only the ranks that save pay for it, not every caller of this module
    from .state import save_checkpoint

    root = Path(root).resolve()
    refused: list[str | None] = [None]
    if dist.get_rank() == 0:
        try:
            require_save_folder(root)
            remove_leftovers(root, STEP_NAME)
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
