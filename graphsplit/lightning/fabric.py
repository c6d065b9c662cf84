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
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.strategies import ParallelStrategy
from lightning.fabric.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.fabric.utilities.distributed import _sync_ddp_if_available

from ..errors import GraphsplitError
from ..pipelined import PipelinedModule
from ..plan import Plan
from .processes import PlannedProcesses


class GraphsplitFabricStrategy(PlannedProcesses, ParallelStrategy):
    """Pipeline, tensor and data parallelism (DDP or FSDP2), expert and context parallelism,
    checkpointing and autocast for your own Fabric loop, planned by graphsplit.

    `plan`: a `Plan` or a plan.json path, or its fields (`pp=2, tp=2, ...`); dp is the devices left.
    `loss_fn(output, target)`: the loss the loop computed from the model's output (None: the model's own)."""

    def __init__(self, plan: Plan | str | Path | None = None, loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
                 timeout_s: float = 120.0, **fields: Any) -> None:
        super().__init__()
        if isinstance(plan, str) and plan == "auto":
            raise GraphsplitError("GraphsplitFabricStrategy(plan='auto') is not built: Fabric shares the data out "
                                  "(setup_dataloaders) before graphsplit sees a batch; give the plan (fields, a Plan, "
                                  "or the plan.json `graphsplit plan --out` writes), or use the Trainer's "
                                  "GraphsplitStrategy(plan='auto')")
        self._take_plan(plan, fields, timeout_s, "GraphsplitFabricStrategy")
        self._loss_fn = loss_fn

    def _configure_launcher(self) -> None:
        assert self.cluster_environment is not None
        if not self.cluster_environment.creates_processes_externally:
            self._launcher = _SubprocessScriptLauncher(self.cluster_environment, self.num_processes, self.num_nodes)

    def setup_environment(self) -> None:
        super().setup_environment()
        self._join("Fabric")

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
