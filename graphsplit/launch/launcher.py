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
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..compile import compile_loaded
from ..errors import GraphsplitError
from ..ir.program import Program
from ..ir.sharding import shard_tensor
from ..loader import load_model
from ..plan import Plan
from ..runtime.dcp.record import read_info
from ..runtime.dcp.series import require_save_folder, resolve_checkpoint
from ..runtime.lean_init import lean_init_works
from ..runtime.materialize import model_tensors
from ..runtime.microbatch import merge_outputs
from ..runtime.training import default_loss
from ..runtime.weights import check_weights, open_weights
from .parity import ATOL, Comparison, compare, missing_grads, reference_step
from .supervise import DEFAULT_COLLECTIVE_TIMEOUT_S, supervise
from .worker import RunSpec, make_optimizer

LOSS_CURVE_RTOL = 1e-4
# bf16 matmuls keep 8 bits of mantissa: loss and outputs agree with fp32 to about 1e-2, and
# gradients are not compared element by element (they are reported)
LOW_PRECISION_ATOL = 5e-2


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


def reference_train(model: torch.nn.Module, loaded, plan: Plan, opts: RunOptions, first_step: int = 1,
                    skipped: Collection[int] = ()):
    """The first step's result and the loss of every step for the untouched model (`skipped`: steps
    whose optimizer step the program skipped, fp16 overflows)."""
    loss_fn = loaded.loss_fn or default_loss
    target = loaded.target if loaded.target is not None else torch.zeros(_batch(loaded))
    optimizer = make_optimizer(opts.optimizer, list(model.parameters()), opts.lr)
    if opts.resume:
        from ..runtime.dcp.state import load_whole_model

        load_whole_model(opts.resume, model, optimizer)
    first, losses = None, []
    for step in range(first_step, first_step + opts.steps):
        # dp replicas x micro-batches, in order: the pieces the program's ranks see
        result = reference_step(model, loaded.args, loaded.kwargs, target, loss_fn, plan.dp * plan.num_microbatches,
                                replicas=plan.dp if plan.sync_bn else 1)
        first = first or result
        losses.append(float(result.loss))
        if step not in skipped:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return first, losses


def _reference_with_weights(loaded, weights: str, plan: Plan) -> torch.nn.Module:
    """The untouched model (one process, for --check) holding the weights file's values."""
    from ..runtime.weights import open_weights

    model = loaded.build("cpu", seed=plan.seed)
    state = open_weights(weights)
    wanted = dict(model.named_parameters(remove_duplicate=False))
    missing = [n for n in wanted if n not in state and not any(wanted[n] is wanted[m] and m in state for m in wanted)]
    if missing:
        raise GraphsplitError(f"the weights file has no tensor {missing[0]!r} ({len(missing)} missing); "
                              "save it from this model with torch.save(model.state_dict()) or safetensors")
    model.load_state_dict({k: state[k] for k in state}, strict=False)
    return model


def _batch(loaded) -> int:
    for value in (*loaded.args, *loaded.kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim():
            return value.shape[0]
    raise GraphsplitError("no batched tensor among example_inputs()")


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
            model = _reference_with_weights(loaded, weights, plan) if opts.check else None
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
             f"{plan.num_microbatches} micro-batches)")
        _launch(tmp / "spec.json", plan.world_size, opts.timeout_s, tmp / "torchrun.log", opts.collective_timeout_s)
        if not opts.check:
            return None
        first_step = read_info(opts.resume)["step"] + 1 if opts.resume else 1
        # after the run: the reference skips the fp16 steps an overflow made the program skip
        skipped = set(json.loads((tmp / "skipped.json").read_text()))
        if skipped:
            echo(f"fp16: step(s) {', '.join(map(str, sorted(skipped)))} skipped on overflow (the reference skips them too)")
        reference = reference_train(model, loaded, plan, opts, first_step, skipped)
        return _check(program, tmp, reference, plan, echo, first_step, grads=first_step not in skipped)


def _check(program, tmp: Path, reference, plan: Plan, echo: Callable[[str], None], first_step: int = 1,
           grads: bool = True) -> Comparison:
    """Compare the ranks' dumps with the reference. `grads=False`: the first step overflowed in fp16, its
    gradients are infinite by definition and are not compared (the loss curve still is)."""
    first, ref_losses = reference
    dumps = {int(p.stem.removeprefix("rank")): torch.load(p, weights_only=False) for p in sorted(tmp.glob("rank*.pt"))}
    loss, output = None, None
    replica_outputs = {}
    for dump in dumps.values():
        if dump["loss"] is not None:
            loss = dump["loss"]
            if dump.get("tp_rank", 0) == 0:
                replica_outputs[dump.get("dp_rank", 0)] = dump["output"]
    if replica_outputs:  # each dp replica computed its share of the batch
        output = program.unflatten_output(merge_outputs([replica_outputs[d] for d in sorted(replica_outputs)]))
    low = plan.autocast is not None
    atol = LOW_PRECISION_ATOL if low else ATOL
    curve_rtol = LOW_PRECISION_ATOL if low else LOSS_CURVE_RTOL
    cmp = compare(loss, output, {}, first, atol=atol)
    n_grads = 0
    for rank, dump in sorted(dumps.items()) if grads else ():
        tp_rank = dump.get("tp_rank", 0)

        def shard(name: str, full: torch.Tensor, tp_rank: int = tp_rank) -> torch.Tensor:
            return shard_tensor(full, program.param_sharding(name), tp_rank, plan.tp)

        # the mesh is (dp, pp, tp) over the global ranks in order: this rank's pipeline stages hold these
        held = {c for st in plan.stages_of_rank(rank // plan.tp % plan.pp) for c in program.stages[st].param_sources.values()}
        sub = compare(None, None, dump["grads"], first, atol=float("inf") if low else ATOL, expected=shard, held=held)
        n_grads += len(dump["grads"])
        cmp.max_diff.update({f"{k} (rank {rank})": v for k, v in sub.max_diff.items()})
        cmp.failures.extend(f"rank {rank}: {f}" for f in sub.failures)
    missing = missing_grads(first, {k for d in dumps.values() for k in d["grads"]})
    if missing and grads:
        cmp.failures.append(f"no rank produced a gradient for {', '.join(sorted(missing)[:5])}")
    curve = json.loads((tmp / "losses.json").read_text())
    worst_curve = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(curve, ref_losses))
    if not worst_curve <= curve_rtol:
        cmp.failures.append(f"loss curve: max relative difference {worst_curve:.3g} > {curve_rtol:g}")
    echo(f"check: untouched model in one process vs graphsplit dp={plan.dp}{' (fsdp)' if plan.fsdp else ''} pp={plan.pp} tp={plan.tp}, "
         f"same {plan.dp * plan.num_microbatches} micro-batches")
    echo(f"  loss step {first_step:<4}{float(first.loss):.6f} (reference) vs {float(loss):.6f}")
    out_diffs = [v for k, v in cmp.max_diff.items() if k.startswith("output")]
    grad_diffs = [v for k, v in cmp.max_diff.items() if k.startswith("grad")]
    echo(f"  output        max scaled difference {max(out_diffs, default=0.0):.3g}")
    if grads:
        echo(f"  gradients     {n_grads} tensors on {len(dumps)} ranks, max scaled difference {max(grad_diffs, default=0.0):.3g}")
    else:
        echo(f"  gradients     not compared: step {first_step} overflowed in fp16 (its gradients are infinite)")
    echo(f"  loss curve    {len(curve)} steps, max relative difference {worst_curve:.3g}")
    worst = cmp.worst
    if cmp.ok:
        rule = f"{plan.autocast} autocast: loss and outputs within {atol:g}, gradients reported" if low else \
            f"fp32 atol {ATOL:g} scaled by magnitude"
        echo(f"check passed: largest difference {worst[1]:.3g} ({worst[0]}); {rule}")
    else:
        for f in cmp.failures[:20]:
            echo(f"  MISMATCH {f}")
        echo(f"check FAILED: {len(cmp.failures)} mismatch(es); largest difference {worst[1]:.3g} ({worst[0]})")
    return cmp

