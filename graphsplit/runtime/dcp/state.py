"""Training checkpoints with torch.distributed.checkpoint (DCP), keyed by the original model's names.

Every rank hands DCP the blocks of the original tensors it holds (blocks.py), so
a checkpoint written at one plan loads at any other, and `export_weights` turns
it into one `.safetensors` file the untouched model loads. Each rank's RNG state
goes to `rng/rank<N>.pt` beside DCP's files; the record (record.py) is written
last.

A save is written to a temporary sibling folder and renamed into place only
when every rank has finished, so a crash during a save never leaves a folder
that loads as a checkpoint (and an earlier checkpoint at the same path stays
whole until then). `save_series` adds `step-<N>` to a `--save` folder (series.py)
and keeps the newest. Loads go through safe_read.py: nothing in a checkpoint runs
code.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.tensor import DTensor

from ...errors import GraphsplitError
from ...ir.program import Program
from ..atomic import remove_leftovers, replace_file, swap_into_place, temporary_sibling
from .blocks import SavePlanner, in_experts, pieces_of
from .record import EXTRA_FILE, INFO_FILE, OPTIMIZER_PREFIX, STEP_KEY, model_names, read_info
from .safe_read import dcp_load, require_loadable, stored_keys
from .series import STEP_NAME, checkpoints_in, require_save_folder, resolve_checkpoint


def rank_state(
    program: Program,
    modules: Mapping[int, nn.Module],
    optimizer: torch.optim.Optimizer | None,
    tp_rank: int,
    persistent: set[str],
    ep_rank: int = 0,
) -> dict[str, Any]:
    """What this rank contributes to a checkpoint (and reads back on resume), by original name.

    `persistent`: the names `model.state_dict()` has (non-persistent buffers are
    rebuilt by the constructor and are not saved). `ep_rank`: this rank's place in its
    expert-parallel group (its experts' slice of each expert weight).
    """
    tp, ep = program.plan.tp, program.plan.ep

    def pieces(canonical: str, value: torch.Tensor, sharding: Any) -> Any:
        found = pieces_of(value, sharding, tp_rank, tp)
        dim = program.expert_params.get(canonical)
        return in_experts(found, dim, ep_rank, ep) if dim is not None else found

    state: dict[str, Any] = {}
    optimizer = local_optimizer(optimizer) if optimizer is not None else None  # ZeRO-1: this replica's share
    for index, module in sorted(modules.items()):
        stage = program.stages[index]
        for local, canonical in stage.param_sources.items():
            if canonical in state:
                continue  # a tied alias in this stage, or a copy in another stage of this rank
            p = module.get_parameter(local)
            sharding = program.param_sharding(canonical)
            state[canonical] = pieces(canonical, p.data, sharding)
            if optimizer is not None:
                for key, value in optimizer.state.get(p, {}).items():
                    name = f"{OPTIMIZER_PREFIX}{canonical}/{key}"
                    if isinstance(value, torch.Tensor) and value.shape == p.shape and value.dim():
                        state[name] = pieces(canonical, value, sharding)
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


def local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer holding this rank's states: ZeRO-1's (ZeroRedundancyOptimizer) steps this replica's
    share of the parameters with an optimizer of its own, `optim`; any other is itself."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the per-parameter state a step would create, so a load has tensors to fill."""
    optimizer = local_optimizer(optimizer)
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


def save_checkpoint(directory: str | Path, state: dict[str, Any], step: int, record: dict[str, Any],
                    extra: Any = None) -> None:
    """Every rank calls this: DCP writes the blocks (each stored once), then rank 0 renames into place.
    `extra` (rank 0's): the training loop's own state (its counters, a scheduler's), saved beside them
    by torch.save (read back by `read_extra`)."""
    final = Path(directory).resolve()
    rank = dist.get_rank()
    holder: list[tuple[str, str] | None] = [None]  # ("tmp", folder) or ("error", message), rank 0's answer
    if rank == 0:
        try:
            if final.exists() and not (final / INFO_FILE).is_file():  # never replace a folder that is not ours
                raise GraphsplitError(f"--save {final} exists and is not a graphsplit checkpoint; choose another folder")
            # what a killed save of this folder left
            remove_leftovers(final.parent, re.escape(final.name))
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
        dcp.save(full_state, checkpoint_id=tmp, planner=SavePlanner())
        (tmp / "rng").mkdir(exist_ok=True)
        torch.save(torch.get_rng_state(), tmp / "rng" / f"rank{rank}.pt")
        dist.barrier()
        if rank == 0:
            if extra is not None:
                torch.save(extra, tmp / EXTRA_FILE)
            # the record is what makes a folder a checkpoint: written last, then the folder is renamed
            (tmp / INFO_FILE).write_text(json.dumps({**record, "step": step, "world_size": dist.get_world_size()}, indent=2))
            swap_into_place(tmp, final)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    dist.barrier()



def read_extra(directory: str | Path) -> Any:
    """What the loop saved beside a checkpoint's tensors (`save_checkpoint(extra=...)`), or None."""
    path = resolve_checkpoint(directory) / EXTRA_FILE
    return torch.load(path, weights_only=False) if path.is_file() else None


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
    require_loadable(directory, state)
    dcp_load(state, directory, no_dist=True)


def load_checkpoint(directory: str | Path, state: dict[str, Any], same_world: bool) -> int:
    """Fill this rank's tensors from a checkpoint written at any plan; returns the steps it had done.

    Every rank calls this. The RNG state is restored only when the world is laid
    out as it was (same plan): otherwise ranks do not correspond.
    """
    step = torch.tensor(0, dtype=torch.int64)
    state = {**state, STEP_KEY: step}
    require_loadable(directory, state)
    dcp_load(state, directory)
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
    require_loadable(directory, tensors)
    dcp_load(tensors, directory, no_dist=True)
    for alias, canonical in aliases.items():
        if canonical in tensors and alias not in tensors:
            tensors[alias] = tensors[canonical].clone()  # safetensors stores no shared tensors
    metadata = {"source": "graphsplit export-weights", "step": str(info["step"])}
    try:
        replace_file(out, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    except OSError as exc:
        raise GraphsplitError(f"cannot write {out}: {exc.strerror or exc}; choose a path you can write to") from None
    return sorted(tensors)

