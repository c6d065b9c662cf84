"""A series of checkpoints, torchtitan's layout: `run --save DIR` writes `DIR/step-<N>`.

One checkpoint folder per save, the newest `keep_last` kept; `--resume DIR`
and `export-weights DIR` take the newest complete one. A `--save` folder holds
nothing else: graphsplit never writes into a folder it did not write.

Finding and checking a series imports no DCP; writing one is state.py's `save_series`.
"""

from __future__ import annotations

import re
from pathlib import Path

from ...errors import GraphsplitError
from ..atomic import leftovers, require_replaceable
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
