"""`graphsplit run`: launch torchrun on this machine, train, and (with --check) prove parity.

Each rank runs the model's constructor with the plan's seed keeping only its
own stages' parameters (runtime/lean_init.py: the values are those of the whole
model's init); when the init code reads tensors a rank drops, the parent
builds the model once on CPU and saves it, and each rank memory-maps that file
and copies only its own tensors. With `check`, the parent also trains the untouched model on
the same micro-batches with the same optimizer, and compares step 1's loss,
output and every gradient (each rank's copy), plus the loss of every step.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..compile import compile_loaded
from ..errors import GraphsplitError
from ..ir.program import Program
from ..loader import load_model
from ..plan import Plan
from ..planner.schedules import underfilled_note
from ..runtime.dcp.record import read_info
from ..runtime.dcp.series import require_save_folder, resolve_checkpoint
from ..runtime.lean_init import lean_init_works
from ..runtime.materialize import model_tensors
from ..runtime.weights import check_weights, open_weights
from .parity import Comparison, check_run, reference_train, reference_with_weights
from .supervise import DEFAULT_COLLECTIVE_TIMEOUT_S, supervise
from .worker import RunSpec


@dataclass
class RunOptions:
    steps: int = 5
    optimizer: str = "sgd"
    lr: float = 0.01
    check: bool = False
    timeout_s: float = 600.0
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S  # once set-up is over: how long a rank may not answer
    weights: str | None = None  # the user's weights file; default: the model's own init with the plan's seed
    save: str | None = None  # a folder of checkpoints step-<N>: one after the last step
    save_every: int = 0  # and one every this many steps (0: only after the last)
    keep_last: int = 3  # the newest checkpoints kept in `save` (0: all)
    resume: str | None = None  # a DCP checkpoint (written at any plan), or a `save` folder: its newest


def _launch(spec_path: Path, world: int, timeout_s: float, log: Path,
            collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S) -> None:
    """torchrun on this machine, supervised: on a failure, a stop or the timeout, no rank outlives this."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
        "-m", "graphsplit.launch.worker", str(spec_path),
    ]
    supervise(cmd, env, world, spec_path.parent, timeout_s, log, collective_timeout_s)


def require_parameters(program: Program) -> None:
    """Training needs something to train on every pipeline rank: an optimizer over no parameters fails there."""
    plan = program.plan
    if not any(st.param_sources for st in program.stages):
        raise GraphsplitError("the model has no parameters to train; graphsplit run trains a model whose modules "
                              "hold nn.Parameters (graphsplit transform still splits it)")
    for rank in range(plan.pp):
        stages = plan.stages_of_rank(rank)
        if not any(program.stages[s].param_sources for s in stages):
            raise GraphsplitError(
                f"pipeline rank {rank} (stage(s) {', '.join(map(str, stages))}) holds no parameters, so it has "
                "nothing to train; use a smaller --pp or move --split-at so every stage holds a layer"
            )


def run_training(
    model_spec: str,
    plan: Plan,
    opts: RunOptions,
    fixed_cuts: tuple[str, ...] | None = None,
    echo: Callable[[str], None] = print,
) -> Comparison | None:
    loaded = load_model(model_spec)
    if opts.save_every < 0 or opts.keep_last < 0:
        raise GraphsplitError(f"--save-every and --keep-last must be at least 0, got {opts.save_every} and {opts.keep_last}")
    if opts.save_every and not opts.save:
        raise GraphsplitError("--save-every needs --save DIR, the folder to write the checkpoints to")
    if opts.save:
        require_save_folder(opts.save)  # before training, not after it
    if opts.resume:  # a clear error before anything starts; a --save folder gives its newest checkpoint
        from ..runtime.dcp.safe_read import check_checkpoint

        resume = resolve_checkpoint(opts.resume)
        check_checkpoint(resume)
        opts = replace(opts, resume=str(resume))
        echo(f"resuming from {resume} (step {read_info(resume)['step']})")
    # the ranks run in their own working directory: give them absolute paths
    opts = replace(opts, resume=opts.resume and str(Path(opts.resume).resolve()),
                   save=opts.save and str(Path(opts.save).resolve()))
    if opts.steps < (0 if opts.resume else 1) or (opts.check and opts.steps < 1):
        raise GraphsplitError(f"--steps must be at least 1 (0 only to re-save a checkpoint with --resume), got {opts.steps}")
    # Compile here first: a bad plan or model fails in one process, before torchrun starts.
    program = compile_loaded(loaded, plan, fixed_cuts).program
    plan = program.plan  # with the micro-batches decided for this batch
    require_parameters(program)
    if opts.weights is not None:  # a wrong weights file, too, is one line here rather than on every rank
        check_weights(open_weights(opts.weights), loaded.build("meta"), opts.weights)
    with tempfile.TemporaryDirectory(prefix="graphsplit-run-") as tmp_str:
        tmp = Path(tmp_str)
        lean = False
        if opts.weights is None:
            # the model's own initialization: each rank runs the constructor keeping only its tensors
            # (runtime/lean_init.py), or, when the init code reads other tensors, the model is built here once
            # and saved for the ranks to slice
            lean = lean_init_works(loaded)
            weights = None if lean else str(tmp / "weights.pt")
            model = loaded.build("cpu", seed=plan.seed) if opts.check or not lean else None
            if not lean:
                torch.save(model_tensors(model), weights)
            echo("initialization: each rank runs the constructor keeping only its own parameters" if lean else
                 "initialization: the init code reads tensors across the model, so it is built once here and the ranks slice it")
        else:
            weights = str(Path(opts.weights).resolve())
            model = reference_with_weights(loaded, weights, plan) if opts.check else None
        if not opts.check:
            del model
        spec = RunSpec(
            model=model_spec, plan=plan.to_dict(), steps=opts.steps, optimizer=opts.optimizer, lr=opts.lr,
            fixed_cuts=list(fixed_cuts) if fixed_cuts is not None else None,
            weights=weights, user_weights=opts.weights is not None, dump_dir=str(tmp) if opts.check else None,
            save_dir=opts.save, save_every=opts.save_every, keep_last=opts.keep_last,
            resume_dir=opts.resume, lean_init=lean, timeout_s=opts.timeout_s,
            collective_timeout_s=opts.collective_timeout_s, run_dir=str(tmp),
        )
        spec.save(tmp / "spec.json")
        echo(f"launching {plan.world_size} processes: dp={plan.dp}{' (fsdp)' if plan.fsdp else ''} x pp={plan.pp} x tp={plan.tp} ({plan.num_stages} stages, {plan.schedule}, "
             f"{plan.num_microbatches} micro-batch{'es' if plan.num_microbatches > 1 else ''})")
        if note := underfilled_note(plan):
            echo(f"note: {note}")
        _launch(tmp / "spec.json", plan.world_size, opts.timeout_s, tmp / "torchrun.log", opts.collective_timeout_s)
        if not opts.check:
            return None
        first_step = read_info(opts.resume)["step"] + 1 if opts.resume else 1
        # after the run: the reference skips the fp16 steps an overflow made the program skip
        skipped = set(json.loads((tmp / "skipped.json").read_text()))
        if skipped:
            echo(f"fp16: step(s) {', '.join(map(str, sorted(skipped)))} skipped on overflow (the reference skips them too)")
        reference = reference_train(model, loaded, plan, opts.steps, opts.optimizer, opts.lr, opts.resume,
                                    first_step, skipped)
        return check_run(program, tmp, reference, echo, first_step, grads=first_step not in skipped)
