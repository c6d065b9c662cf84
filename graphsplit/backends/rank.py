"""One rank's part of a compiled program, assembled the one way `run`'s worker and `parallelize()` share.

    rank = assemble_rank(program, tensors, loss_fn, names)   # join, mesh, materialize, parallelize
    loss, output = rank.pipeline.step(inputs, target)
    rank.save_checkpoint(folder, optimizer, step, record)

`assemble_rank` joins the process group torchrun set up, builds the (dp, pp, tp)
mesh, gives this rank's stages real tensors (its pp rank's stages, its tp rank's
shards, read from `tensors(stages)`), and makes them distributed
(parallelize.py). The `RankProgram` it returns knows this rank's place in the mesh and
what it contributes to a checkpoint under the original model's names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from ..ir.program import Program
from ..runtime.fast_init import FastInit
from ..runtime.materialize import materialize_stages
from ..runtime.training import LossFn, make_loss
from .parallelize import parallelize_stages
from .torch_distributed import DEFAULT_TIMEOUT_S, DistributedPipeline, init_distributed, make_mesh

# the stages this rank holds -> the original model's tensors by name, or fast init drawing this rank's
# blocks (None: each module's own init)
TensorSource = Callable[[Sequence[int]], Mapping[str, torch.Tensor] | FastInit | None]


class SetUpObserver(Protocol):
    """Told when set-up reaches its milestones (launch/supervise.py's RankReporter)."""

    def join_diagnosis_group(self) -> None: ...

    def setup_done(self, timeout_s: float) -> None: ...


@dataclass
class RankProgram:
    """This process's part of a program, ready to train."""

    program: Program
    mesh: DeviceMesh
    device: torch.device
    pipeline: DistributedPipeline
    persistent: set[str] = field(default_factory=set)  # the original model's state_dict names
    aliases: dict[str, str] = field(default_factory=dict)  # tied alias -> its first name

    @property
    def dp_rank(self) -> int:
        return self.mesh.get_local_rank("dp")

    @property
    def pp_rank(self) -> int:
        return self.mesh.get_local_rank("pp")

    @property
    def tp_rank(self) -> int:
        return self.mesh.get_local_rank("tp")

    @property
    def modules(self) -> dict[int, nn.Module]:
        return self.pipeline.modules

    def checkpoint_state(self, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
        """What this rank contributes to a checkpoint (and reads back on resume), by original name."""
        from ..runtime.dcp.state import rank_state, scaler_state

        state = rank_state(self.program, self.modules, optimizer, self.tp_rank, self.persistent,
                           self.dp_rank % self.program.plan.ep)
        state.update(scaler_state(self.pipeline.scaler))
        return state

    def record(self, model: str, optimizer: torch.optim.Optimizer | str | None) -> dict[str, Any]:
        """What a checkpoint records beside the tensors: the plan, the model, the optimizer, tied aliases."""
        name = optimizer if isinstance(optimizer, str | None) else type(optimizer).__name__.lower()
        record = {"plan": self.program.plan.to_dict(), "model": model, "optimizer": name, "aliases": self.aliases}
        if isinstance(optimizer, torch.optim.Optimizer):  # its groups' hyper-parameters (an LR schedule's lr)
            record["param_groups"] = [_plain(group) for group in optimizer.param_groups]
        return record

    def save_checkpoint(self, directory: str | Path, optimizer: torch.optim.Optimizer | None, step: int,
                        record: dict[str, Any], extra: Any = None) -> None:
        """Every rank calls this: one checkpoint folder, written whole or not at all; `extra` (rank 0's),
        the loop's own state, saved beside the tensors."""
        from ..runtime.dcp.state import save_checkpoint

        save_checkpoint(directory, self.checkpoint_state(optimizer), step, record, extra)

    def save_series(self, root: str | Path, optimizer: torch.optim.Optimizer | None, step: int,
                    record: dict[str, Any], keep_last: int, keep: str | Path | None = None) -> Path:
        """Every rank calls this: `root/step-<step>`, the newest `keep_last` kept."""
        from ..runtime.dcp.state import save_series

        return save_series(root, self.checkpoint_state(optimizer), step, record, keep_last, keep)

    def load_checkpoint(self, directory: str | Path, optimizer: torch.optim.Optimizer | None) -> int:
        """Every rank calls this: fill this rank's tensors (and `optimizer`'s state) from a checkpoint
        written at any plan, or the newest in a `--save` folder; returns the steps it had done."""
        from ..runtime.dcp.record import read_info
        from ..runtime.dcp.series import resolve_checkpoint
        from ..runtime.dcp.state import init_optimizer_state, load_checkpoint

        directory = resolve_checkpoint(directory)
        if optimizer is not None:
            init_optimizer_state(optimizer)
        info = read_info(directory)
        # the RNG state is restored only when ranks correspond: the world laid out as it was
        same_world = info.get("plan") == self.program.plan.to_dict()
        step = load_checkpoint(directory, self.checkpoint_state(optimizer), same_world)
        saved_groups = info.get("param_groups")
        if optimizer is not None and isinstance(saved_groups, list) and len(saved_groups) == len(optimizer.param_groups):
            for group, saved in zip(optimizer.param_groups, saved_groups):  # as optimizer.load_state_dict does
                group.update({k: tuple(v) if isinstance(group.get(k), tuple) else v for k, v in saved.items()})
        return step


def assemble_rank(
    program: Program,
    tensors: TensorSource,
    user_loss: LossFn | None,
    names: tuple[set[str], dict[str, str]] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    collective_timeout_s: float | None = None,
    observer: SetUpObserver | None = None,
) -> RankProgram:
    """Inside a torchrun process: this rank's part of `program`, ready to train.

    `names`: the original model's state_dict names and tied aliases (checkpoints use them).
    `timeout_s` bounds set-up's collectives; `collective_timeout_s`, if given, every
    operation on the mesh's groups afterwards."""
    device = init_distributed(timeout_s)
    if observer is not None:
        observer.join_diagnosis_group()
    mesh = make_mesh(program.plan, device, collective_timeout_s)
    stages = program.plan.stages_of_rank(mesh.get_local_rank("pp"))
    ep_rank = mesh.get_local_rank("dp") % program.plan.ep  # each ep consecutive dp ranks form a group
    program = program.on_ep_rank(ep_rank)  # a loop's expert slots by the names of the experts held here
    source = tensors(stages)
    modules = materialize_stages(program, stages, device, source, mesh.get_local_rank("tp"), ep_rank)
    del source  # a mapped weights file or the exact build: only this rank's tensors stay
    if observer is not None:
        observer.setup_done(timeout_s)
    plan = program.plan
    replicas = mesh.get_group("dp") if plan.dp > 1 and program.batch.whole_loss else None
    pipeline = parallelize_stages(program, modules, make_loss(program, user_loss, replicas=replicas), mesh, device)
    persistent, aliases = names or (set(), {})
    return RankProgram(program, mesh, device, pipeline, set(persistent), dict(aliases))


def _plain(group: Mapping[str, Any]) -> dict[str, Any]:
    """A parameter group's hyper-parameters that JSON holds (its parameters and anything else left out)."""
    import json

    kept = {}
    for key, value in group.items():
        if key in ("params", "param_names"):
            continue
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        kept[key] = value
    return kept
