"""What the Trainer's and Fabric's strategies share: the plan, this process's place, the process group.

The plan is given (a `Plan` or plan.json), or made from its fields with dp the devices left over
pp x tp, or "auto": the planner's, found by the Trainer's strategy in `setup` (auto_plan.py). The
mesh is (dp, pp, tp), so each dp replica reads its own share of the data and every rank of a
replica the same one (Lightning's sampler, from `distributed_sampler_kwargs`).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.fabric.utilities.distributed import _init_dist_connection
from lightning.fabric.utilities.rank_zero import rank_zero_only

from ..errors import GraphsplitError
from ..plan import Plan


def read_plan(plan: Plan | str | Path) -> Plan:
    """A `Plan`, or the plan a plan.json holds (what `graphsplit plan --out` or `transform` write)."""
    return plan if isinstance(plan, Plan) else Plan.load(plan)


class PlannedProcesses:
    """Mixed into a Lightning strategy (before its Lightning base): the plan and the processes it runs on."""

    # set by the Lightning base class
    parallel_devices: list[torch.device] | None
    local_rank: int
    global_rank: int
    world_size: int
    node_rank: int
    cluster_environment: Any

    def _take_plan(self, plan: Plan | str | Path | None, fields: dict[str, Any], timeout_s: float, who: str) -> None:
        self._auto = isinstance(plan, str) and plan == "auto"
        if self._auto:
            from .auto_plan import constraint

            constraint(fields)  # a field Plan lacks is refused here, not after the processes start
        elif plan is not None and fields:
            raise GraphsplitError(f"give {who} a plan or its fields (pp=, tp=, ...), not both (or plan='auto' with "
                                  "the fields the planner must keep)")
        self._plan_given = read_plan(plan) if plan is not None and not self._auto else None
        self._fields = fields
        self._timeout_s = timeout_s
        self.plan: Plan | None = None
        self.num_nodes = 1

    @property
    def root_device(self) -> torch.device:
        assert self.parallel_devices is not None
        return self.parallel_devices[self.local_rank]

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices) if self.parallel_devices is not None else 0

    def _replica_size(self) -> int:
        plan = self.plan or self._plan_given
        if plan is None and self._auto:
            raise GraphsplitError("plan='auto' is found in the strategy's setup, before Lightning shares the data out; "
                                  "the data was asked for before it")
        return plan.pp * plan.tp if plan is not None else self._fields.get("pp", 1) * self._fields.get("tp", 1)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        size = self._replica_size()
        return {"num_replicas": self.world_size // size, "rank": self.global_rank // size}

    def _join(self, launcher: str) -> None:
        """This process's ranks set, the process group joined, and the plan made for the world
        (`launcher`: Trainer or Fabric, named in the one line a wrong device count gives)."""
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)
        rank_zero_only.rank = self.global_rank
        backend = "nccl" if self.root_device.type == "cuda" else "gloo"
        _init_dist_connection(self.cluster_environment, backend, timeout=timedelta(seconds=self._timeout_s))
        if self._auto:
            return  # the planner chooses it on the first batch (the Trainer's setup)
        size = self._replica_size()
        if self.world_size % size:
            raise GraphsplitError(f"the plan's pp x tp = {size} processes per replica do not divide the "
                                  f"{self.world_size} {launcher} was given; give devices= a multiple of {size}")
        plan = self._plan_given or Plan(dp=self.world_size // size, **self._fields)
        if plan.world_size != self.world_size:
            raise GraphsplitError(f"the plan needs {plan.world_size} processes but {launcher} was given "
                                  f"{self.world_size}; give {launcher}(devices={plan.world_size})")
        self.plan = plan

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not (dist.is_available() and dist.is_initialized()):
            return obj
        holder = [obj]
        dist.broadcast_object_list(holder, src)
        return holder[0]
