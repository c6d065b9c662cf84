"""What makes a folder a graphsplit checkpoint, and the names it stores tensors under.

Keys: parameters and persistent buffers under their names in
`model.state_dict()` (tied aliases once, under the first name);
`optimizer/<name>/<state>` for the optimizer's per-parameter state (AdamW's
exp_avg, exp_avg_sq, step); `train/step` for the steps done. `graphsplit.json`,
written last, records the plan, the step, the names of tied aliases and the data
position (`data.train_batches`: the global batches of train_data() drawn so far).

Nothing here imports torch.distributed.checkpoint: finding and naming
checkpoints costs no DCP import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch.nn as nn

from ...errors import GraphsplitError

INFO_FILE = "graphsplit.json"
EXTRA_FILE = "extra.pt"  # the training loop's own state, beside the tensors
METADATA_FILE = ".metadata"  # DCP's index of the checkpoint (a pickle)
OPTIMIZER_PREFIX = "optimizer/"
STEP_KEY = "train/step"


def is_complete(folder: str | Path) -> bool:
    """A checkpoint folder whose save finished: the record is written last, after DCP's files."""
    return (Path(folder) / INFO_FILE).is_file() and (Path(folder) / METADATA_FILE).is_file()


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


def data_position(info: dict[str, Any]) -> int:
    """The global batches of train_data() a checkpoint's run had drawn (0: it trained on example inputs)."""
    data = info.get("data")
    position = data.get("train_batches", 0) if isinstance(data, dict) else 0
    if not isinstance(position, int) or position < 0:
        raise GraphsplitError(f"the checkpoint's record gives a data position of {position!r}, not a count of batches; "
                              "the checkpoint is damaged: use another checkpoint")
    return position


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
