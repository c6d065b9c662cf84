"""`GraphsplitFabricStrategy`: Lightning Fabric runs your own loop over a model graphsplit parallelized.

    fabric = Fabric(devices=4, strategy=GraphsplitFabricStrategy(pp=2, tp=2, loss_fn=loss_fn))
    fabric.launch()
    model, optimizer = fabric.setup(model, optimizer)       # together: the optimizer is adopted
    for x, y in fabric.setup_dataloaders(loader):
        loss = model(x, target=y)    # the pipeline's forward and backward; the loss on every rank
        fabric.backward(loss)        # adds the gradients (times what the loss's backward receives)
        fabric.clip_gradients(model, optimizer, max_norm=1.0)
        optimizer.step(); optimizer.zero_grad()
    fabric.save("ckpt", {"model": model, "optimizer": optimizer, "step": step})

What changes in a Fabric loop: the model's call returns the loss, not the output (the loss is computed
on the last stage, inside the pipeline): a model that computes its own loss (HF's `labels=`,
nanoGPT's `targets`) needs nothing, otherwise give the strategy `loss_fn(output, target)` and call
`model(x, target=y)` where the loop called `loss_fn(model(x), y)`. Under `torch.no_grad()` the call
is the evaluation loss. Everything else is the loop's own: accumulation (`fabric.backward(loss / k)`
adds 1/k of the gradients), clipping over every rank's shards, Fabric's sampler per dp replica,
checkpoints (a graphsplit DCP folder, the loop's other values beside the tensors).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.fabric.strategies import ParallelStrategy
from lightning.fabric.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.fabric.utilities.distributed import _init_dist_connection, _sync_ddp_if_available
from lightning.fabric.utilities.rank_zero import rank_zero_only

from ..errors import GraphsplitError
from ..pipelined import PipelinedModule
from ..plan import Plan
from .strategy import read_plan


class GraphsplitFabricStrategy(ParallelStrategy):
    """Pipeline, tensor and data parallelism (DDP or FSDP2), expert and context parallelism,
    checkpointing and autocast for your own Fabric loop, planned by graphsplit.

    `plan`: a `Plan` or a plan.json path, or its fields (`pp=2, tp=2, ...`); dp is the devices left.
    `loss_fn(output, target)`: the loss the loop computed from the model's output (None: the model's own)."""

    def __init__(self, plan: Plan | str | Path | None = None, loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
                 timeout_s: float = 120.0, **fields: Any) -> None:
        super().__init__()
        if plan is not None and fields:
            raise GraphsplitError("give GraphsplitFabricStrategy a plan or its fields (pp=, tp=, ...), not both")
        self._plan_given = read_plan(plan) if plan is not None else None
        self._fields = fields
        self._loss_fn = loss_fn
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
        plan = self._plan_given
        return plan.pp * plan.tp if plan is not None else self._fields.get("pp", 1) * self._fields.get("tp", 1)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # the mesh is (dp, pp, tp): each dp replica reads its own share, every rank of it the same one
        size = self._replica_size()
        return {"num_replicas": self.world_size // size, "rank": self.global_rank // size}

    def _configure_launcher(self) -> None:
        assert self.cluster_environment is not None
        if not self.cluster_environment.creates_processes_externally:
            self._launcher = _SubprocessScriptLauncher(self.cluster_environment, self.num_processes, self.num_nodes)

    def setup_environment(self) -> None:
        super().setup_environment()
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)
        rank_zero_only.rank = self.global_rank
        assert self.cluster_environment is not None
        backend = "nccl" if self.root_device.type == "cuda" else "gloo"
        _init_dist_connection(self.cluster_environment, backend, timeout=timedelta(seconds=self._timeout_s))
        size = self._replica_size()
        if self.world_size % size:
            raise GraphsplitError(f"the plan's pp x tp = {size} processes per replica do not divide the "
                                  f"{self.world_size} Fabric was given; give devices= a multiple of {size}")
        self.plan = self._plan_given or Plan(dp=self.world_size // size, **self._fields)
        if self.plan.world_size != self.world_size:
            raise GraphsplitError(f"the plan needs {self.plan.world_size} processes but Fabric was given "
                                  f"{self.world_size}; give Fabric(devices=...) {self.plan.world_size}")

    # ---- the model and its optimizer -----------------------------------------------------------------

    def setup_module_and_optimizers(self, module: torch.nn.Module, optimizers: list[torch.optim.Optimizer],
                                    scheduler: Any = None) -> tuple[torch.nn.Module, list[torch.optim.Optimizer], Any]:
        from ..api import parallelize

        if len(optimizers) > 1:
            raise GraphsplitError(f"GraphsplitFabricStrategy trains with one optimizer; fabric.setup got {len(optimizers)}")
        assert self.plan is not None
        pipelined = parallelize(module, self.plan, loss_fn=self._loss_fn, timeout_s=self._timeout_s,
                                optimizer=optimizers[0] if optimizers else None)
        return pipelined, optimizers, scheduler

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        raise GraphsplitError("GraphsplitFabricStrategy sets up the model and its optimizer together (the optimizer "
                              "is changed to step this rank's parameters): fabric.setup(model, optimizer)")

    def module_to_device(self, module: torch.nn.Module) -> None:
        pass  # each rank's stages are built on its device from the model's tensors, on the first batch

    def clip_gradients_norm(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, max_norm: float | int,
                            norm_type: float | int = 2.0, error_if_nonfinite: bool = True) -> torch.Tensor:
        if norm_type != 2.0:
            raise GraphsplitError(f"GraphsplitFabricStrategy clips by the 2-norm over every rank; got norm_type={norm_type}")
        if not isinstance(module, PipelinedModule):
            raise GraphsplitError("fabric.clip_gradients takes the model fabric.setup returned")
        return module.clip_grad_norm_(float(max_norm))

    # ---- collectives -----------------------------------------------------------------------------------

    def all_reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        if isinstance(tensor, torch.Tensor):
            return _sync_ddp_if_available(tensor, group, reduce_op=reduce_op)
        return tensor

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not (dist.is_available() and dist.is_initialized()):
            return obj
        holder = [obj]
        dist.broadcast_object_list(holder, src)
        return holder[0]

    # ---- checkpoints ---------------------------------------------------------------------------------

    def save_checkpoint(self, path: Any, state: dict[str, Any], storage_options: Any = None,
                        filter: dict[str, Any] | None = None) -> None:
        if storage_options is not None or filter:
            raise GraphsplitError("GraphsplitFabricStrategy writes a DCP folder: storage_options and filter are not taken")
        module, optimizer, rest = _split_state(state)
        if module is None:
            raise GraphsplitError("fabric.save under GraphsplitFabricStrategy needs the model in the state")
        step = rest.get("step", rest.get("iteration", 0))
        module.save_checkpoint(Path(self.broadcast(str(path))), optimizer, step=int(step) if isinstance(step, int) else 0,
                               extra=rest)

    def load_checkpoint(self, path: Any, state: Any = None, strict: bool = True,
                        weights_only: bool | None = None) -> dict[str, Any]:
        path = Path(self.broadcast(str(path)))
        saved = PipelinedModule.read_extra(path)  # a bad folder fails here, in one line
        saved = dict(saved or {})
        if not isinstance(state, dict):
            raise GraphsplitError("fabric.load under GraphsplitFabricStrategy takes a state dict holding the model")
        module, optimizer, rest = _split_state(state)
        if module is None:
            raise GraphsplitError("fabric.load under GraphsplitFabricStrategy needs the model in the state")
        module.load_checkpoint(path, optimizer)
        for key in rest:
            if key in saved:
                state[key] = saved.pop(key)
            elif strict:
                raise GraphsplitError(f"{path} holds no {key!r} (it holds {', '.join(sorted(saved)) or 'nothing else'})")
        return saved


def _split_state(state: dict[str, Any]) -> tuple[PipelinedModule | None, torch.optim.Optimizer | None, dict[str, Any]]:
    """(the pipelined model, its optimizer, the loop's other values) of a Fabric state dict."""
    module = next((v for v in state.values() if isinstance(v, PipelinedModule)), None)
    optimizers = [v for v in state.values() if isinstance(v, torch.optim.Optimizer)]
    if len(optimizers) > 1:
        raise GraphsplitError("GraphsplitFabricStrategy saves one optimizer with the model")
    rest = {k: v for k, v in state.items() if not isinstance(v, PipelinedModule | torch.optim.Optimizer)}
    if any(isinstance(v, torch.nn.Module) for v in rest.values()):
        raise GraphsplitError("fabric.save/load under GraphsplitFabricStrategy takes the model fabric.setup returned")
    return module, optimizers[0] if optimizers else None, rest
