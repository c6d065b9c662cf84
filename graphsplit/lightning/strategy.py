"""`GraphsplitStrategy`: Lightning's Trainer trains an unmodified LightningModule through graphsplit.

    trainer = Trainer(accelerator="gpu", devices=8, strategy=GraphsplitStrategy(pp=2, tp=2))
    trainer.fit(module, datamodule)   # dp = 8 / (pp x tp) = 2

What runs where:

- `setup`: the module's optimizer from its own `configure_optimizers`, as Lightning builds it;
- the first `training_step`: the module's `training_step` is traced on that batch (steps.py) and cut
  by the plan (`parallelize`): this rank builds its stages, and the optimizer's groups are changed in
  place to its parameters (LR schedulers keep working on them);
- each `training_step`: the pipeline's forward and backward over the batch (every rank of a replica
  on its first rank's batch); the loss it returns, on every rank, is the one Lightning's closure
  divides (gradient accumulation) and calls `backward()` on, which adds the gradients
  (`PipelinedModule.deferred_step`); the step's `self.log` calls of the loss are made with it;
- gradient clipping by norm: over every rank's shards, as on the untouched model;
- `validation_step`: forward only through the pipeline, where the step computes what
  `training_step` computes (their traced graphs are compared), logged under its own names;
- checkpoints: a graphsplit DCP folder at the checkpoint's path (loadable at any other plan), with
  Lightning's own state (loops, callbacks, schedulers) beside the tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.distributed import _sync_ddp_if_available
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.strategies.parallel import ParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from ..errors import GraphsplitError
from ..pipelined import PipelinedModule
from ..plan import Plan
from .processes import PlannedProcesses
from .steps import StepLog, batch_tensors, step_module


class GraphsplitStrategy(PlannedProcesses, ParallelStrategy):
    """Pipeline, tensor and data parallelism (DDP or FSDP2), expert and context parallelism,
    checkpointing and autocast for an unmodified LightningModule, planned by graphsplit.

    `plan`: a `Plan`, or a plan.json path written by `graphsplit transform`; or give its fields
    (`pp=2, tp=2, fsdp=True, ...`). Its dp is the devices left: Lightning's world size over pp x tp.
    `plan="auto"`: the planner's fastest plan for the devices Lightning was given, each replica training
    on the DataLoader's batch (auto_plan.py); fields given with it are kept. `hardware` (a built-in
    profile name, a JSON profile, a `Hardware`; default: this device's) and `gpu_memory` (bytes or
    "80GiB"; default: this device's) are what it plans for.
    """

    strategy_name = "graphsplit"

    def __init__(self, plan: Plan | str | Path | None = None, timeout_s: float = 120.0, hardware: Any = None,
                 gpu_memory: int | str | None = None, **fields: Any) -> None:
        super().__init__()
        self._take_plan(plan, fields, timeout_s, "GraphsplitStrategy")
        if not self._auto and (hardware is not None or gpu_memory is not None):
            raise GraphsplitError("GraphsplitStrategy's hardware= and gpu_memory= are what plan='auto' plans for; "
                                  "give them with plan='auto' only")
        self._hardware, self._gpu_memory = hardware, gpu_memory
        self.pipelined: PipelinedModule | None = None
        self._train_log: StepLog | None = None
        self._val_log: StepLog | None = None
        self._val_same: bool | None = None

    # ---- where the processes are ---------------------------------------------------------------

    @property
    def is_distributed(self) -> bool:
        return True  # Lightning then gives each dp replica its own share of the data (its sampler)

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True

    @property
    def lightning_restore_optimizer(self) -> bool:
        return False  # the DCP folder holds the optimizer's state: load_checkpoint reads it

    @property
    def precision_plugin(self) -> Precision:
        return self._precision_plugin if self._precision_plugin is not None else Precision()

    @precision_plugin.setter
    def precision_plugin(self, plugin: Precision | None) -> None:
        # clipping by norm must take the norm over every rank's shards: the plugin Lightning chose, as a
        # subclass that asks the pipeline for it (a new object; the given plugin is left as it is)
        if plugin is not None and not isinstance(plugin, _NormOverRanks):
            cls = type(f"Graphsplit{type(plugin).__name__}", (_NormOverRanks, type(plugin)), {})
            clipping = cls.__new__(cls)
            clipping.__dict__.update(plugin.__dict__)
            plugin = clipping
        if plugin is not None:
            plugin._graphsplit_strategy = self
        self._precision_plugin = plugin

    def _configure_launcher(self) -> None:
        assert self.cluster_environment is not None
        if not self.cluster_environment.creates_processes_externally:
            self._launcher = _SubprocessScriptLauncher(self.cluster_environment, self.num_processes, self.num_nodes)

    def setup_environment(self) -> None:
        super().setup_environment()
        reset_seed()
        self._join("Trainer")

    def setup(self, trainer: Any) -> None:
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        module = self.lightning_module
        if not module.automatic_optimization:
            raise GraphsplitError("GraphsplitStrategy trains with Lightning's automatic optimization; "
                                  f"{type(module).__name__} sets automatic_optimization = False")
        if self.plan is None:  # plan="auto": before Lightning shares the data out
            if trainer.state.fn != TrainerFn.FITTING:
                raise GraphsplitError("GraphsplitStrategy(plan='auto') plans on the first training batch: give "
                                      "validate/test a plan (or fit first)")
            self._choose_plan(trainer)
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            if len(self.optimizers) != 1:
                raise GraphsplitError(f"GraphsplitStrategy trains with one optimizer; {type(module).__name__}."
                                      f"configure_optimizers gives {len(self.optimizers)}")
        self.setup_precision_plugin()

    def _choose_plan(self, trainer: Any) -> None:
        """plan="auto": rank 0 plans on the first training batch; every rank takes its plan."""
        from ..report.advise import parse_bytes
        from .auto_plan import auto_plan, first_batch, hardware_here

        found: tuple[Plan, str] | None = None
        if self.global_rank == 0:
            hw, memory = hardware_here(self.root_device, self._hardware, self.num_processes)
            if self._gpu_memory is not None:
                memory = parse_bytes(self._gpu_memory) if isinstance(self._gpu_memory, str) else int(self._gpu_memory)
            try:
                found = auto_plan(self.lightning_module, first_batch(trainer), self.world_size, self.num_processes,
                                  hw, memory, self._fields)
            except Exception as exc:
                # every rank fails with rank 0's line (rank 0 too), none waits for a plan
                line = str(exc) if isinstance(exc, GraphsplitError) else \
                    f"plan='auto' failed on rank 0: {type(exc).__name__}: {exc}"
                self.broadcast(line)
                if isinstance(exc, GraphsplitError):
                    raise
                raise GraphsplitError(line) from exc
        found = self.broadcast(found)
        if isinstance(found, str):
            raise GraphsplitError(found)
        assert found is not None
        self.plan, line = found
        if self.global_rank == 0:
            print(line, flush=True)

    def model_to_device(self) -> None:
        pass  # each rank's stages are built on its device from the module's tensors, on the first batch

    # ---- steps -----------------------------------------------------------------------------------

    def _build(self, batch: Any) -> None:
        from ..api import parallelize

        assert self.plan is not None
        module = self.lightning_module
        traced, self._train_log = step_module(module, "training_step", batch)
        optimizer = self.optimizers[0] if self.optimizers else None
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer._optimizer
        self.pipelined = parallelize(traced, self.plan, timeout_s=self._timeout_s, optimizer=optimizer)
        if self._resume is not None:
            self.pipelined.load_checkpoint(self._resume, optimizer)

    _resume: Path | None = None

    def training_step(self, batch: Any, batch_idx: int, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.pipelined is None:
            self._build(batch)
        assert self.pipelined is not None and self._train_log is not None
        with self.precision_plugin.train_step_context():
            loss = self.pipelined.deferred_step(*batch_tensors(batch, "training_step"))
        self._log(self._train_log, loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int, *args: Any, **kwargs: Any) -> Any:
        if self.pipelined is None:  # validation before any training step (Lightning's sanity check)
            self._build(batch)
        assert self.pipelined is not None
        if self._val_same is None:
            self._val_same, self._val_log = _same_step(self.lightning_module, batch)
        if not self._val_same:
            raise GraphsplitError(
                f"{type(self.lightning_module).__name__}.validation_step computes something other than training_step; "
                "GraphsplitStrategy validates only a step that computes the training loss: set "
                "Trainer(limit_val_batches=0) (the guide lists what does not work yet)")
        assert self._val_log is not None
        with self.precision_plugin.val_step_context():
            loss = self.pipelined.evaluate(*batch_tensors(batch, "validation_step"))
        self._log(self._val_log, loss)
        return loss

    def _log(self, log: StepLog, loss: torch.Tensor) -> None:
        for logged in log.losses:
            self.lightning_module.log(logged.name, loss.detach(), **logged.options)
        if log.others and not getattr(self, "_warned_others", False):
            self._warned_others = True
            rank_zero_warn(f"GraphsplitStrategy logs only the step's loss; not logged: {', '.join(log.others)}")

    # ---- collectives -----------------------------------------------------------------------------

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        if isinstance(tensor, torch.Tensor):
            return _sync_ddp_if_available(tensor, group, reduce_op=reduce_op)
        return tensor

    # ---- checkpoints -----------------------------------------------------------------------------

    def lightning_module_state_dict(self) -> dict[str, Any]:
        return {}  # the weights go to the DCP folder, by the module's own names

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        return {}

    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        pass  # load_checkpoint filled the tensors (or will, on the first batch)

    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        pass

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        if self.pipelined is None or not self.pipelined.built:
            raise GraphsplitError("GraphsplitStrategy saves a checkpoint once the model has trained a step")
        if storage_options is not None:
            raise GraphsplitError("GraphsplitStrategy writes a DCP folder: storage_options are not taken")
        path = Path(self.broadcast(str(filepath)))
        lightning_state = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
        optimizer = self.optimizers[0] if self.optimizers else None
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer._optimizer
        self.pipelined.save_checkpoint(path, optimizer, step=int(checkpoint.get("global_step", 0)), extra=lightning_state)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        path = Path(self.broadcast(str(checkpoint_path)))
        state = PipelinedModule.read_extra(path)  # a bad folder fails here, in one line
        if state is None:
            raise GraphsplitError(f"{path} holds no Lightning state: give a checkpoint GraphsplitStrategy saved")
        if self.pipelined is not None:
            optimizer = self.optimizers[0] if self.optimizers else None
            if isinstance(optimizer, LightningOptimizer):
                optimizer = optimizer._optimizer
            self.pipelined.load_checkpoint(path, optimizer)
        else:
            self._resume = path  # read once the model is built on the first batch
        return {**state, "state_dict": {}, "optimizer_states": []}

    def remove_checkpoint(self, filepath: Any) -> None:
        if self.is_global_zero:
            import shutil

            shutil.rmtree(filepath, ignore_errors=True)

    def teardown(self) -> None:
        assert self.cluster_environment is not None
        self.cluster_environment.teardown()
        self.precision_plugin.teardown()
        if self.accelerator is not None:
            self.accelerator.teardown()


class _NormOverRanks:
    """Mixed into the precision plugin Lightning chose: clipping by norm over every rank's gradients."""

    _graphsplit_strategy: GraphsplitStrategy

    def clip_grad_by_norm(self, optimizer: Any, clip_val: float) -> None:
        pipelined = self._graphsplit_strategy.pipelined
        assert pipelined is not None
        pipelined.clip_grad_norm_(float(clip_val))


def _same_step(module: Any, batch: Any) -> tuple[bool, StepLog]:
    """Whether `validation_step` computes what `training_step` does (their traced graphs alike), and
    what it logs."""
    from ..ir.trace import trace_model

    tensors = tuple(batch_tensors(batch, "validation_step"))
    train, _ = step_module(module, "training_step", batch)
    val, log = step_module(module, "validation_step", batch)
    try:
        same = trace_model(train, tensors, {}).gm.code == trace_model(val, tensors, {}).gm.code
    except GraphsplitError:  # a validation step graphsplit cannot trace: refused in one line by the caller
        return False, log
    return same, log
