"""`graphsplit run`: launch torchrun on this machine, train, and (with --check) prove parity.

Each rank runs the model's constructor with the plan's seed keeping only its
own stages' parameters (runtime/exact_init.py: the values are those of the whole
model's init); when the init code reads tensors a rank drops, the parent
builds the model once on CPU and saves it, and each rank memory-maps that file
and copies only its own tensors. With `check`, the parent also trains the untouched model on
the same micro-batches with the same optimizer, and compares step 1's loss,
output and every gradient (each rank's copy), plus the loss of every step.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ..errors import GraphsplitError
from ..ir.program import Program
from ..loader import LoadedModel, load_model
from ..plan import Plan
from ..planner.schedules import underfilled_note
from ..rewrite import rewrite_loaded
from ..runtime.dcp.record import read_info
from ..runtime.dcp.series import require_save_folder, resolve_checkpoint
from ..runtime.exact_init import exact_init_works
from ..runtime.fast_init import fast_model
from ..runtime.init_mode import choose_init
from ..runtime.materialize import model_tensors
from ..runtime.schedule import check_schedule
from ..runtime.training import OptimConfig, objective
from ..runtime.weights import check_weights, open_weights
from .faults import Faults
from .loss_combination import combination_notes
from .parity import Comparison
from .random_ops import find_random_ops, no_dropout, seeded
from .reference import reference_run, reference_with_weights
from .run_check import check_run, weight_tolerance
from .state_notes import state_notes
from .supervise import DEFAULT_COLLECTIVE_TIMEOUT_S, supervise
from .tolerance import Precision
from .worker import RunSpec


@dataclass
class RunOptions:
    steps: int = 5
    optimizer: str = "sgd"
    lr: float = 0.01
    # the optimizer's other settings: OptimConfig's fields less optimizer and lr (weight_decay, betas,
    # lr_schedule, warmup_steps, grad_clip)
    optim: dict[str, Any] = field(default_factory=dict)
    check: bool = False
    timeout_s: float = 600.0
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S  # once set-up is over: how long a rank may not answer
    weights: str | None = None  # the user's weights file; default: the model's own init with the plan's seed
    save: str | None = None  # a folder of checkpoints step-<N>: one after the last step
    save_every: int = 0  # and one every this many steps (0: only after the last)
    keep_last: int = 3  # the newest checkpoints kept in `save` (0: all)
    resume: str | None = None  # a DCP checkpoint (written at any plan), or a `save` folder: its newest
    eval_every: int = 0  # evaluate on eval_data() every this many steps (0: never)
    metrics: str | None = None  # a JSON-lines file: one line per step
    tensorboard: str | None = None  # a TensorBoard log folder: the same numbers as scalars
    nodes: Nodes | None = None  # several machines (torchrun's multi-node rendezvous); None: this one alone
    print_command: bool = False  # print the torchrun command line and stop
    init: str = "auto"  # without weights: exact, fast or auto (runtime/init_mode.py)


@dataclass(frozen=True)
class Nodes:
    """torchrun's multi-node settings: `count` machines of `per_node` processes each, this one being
    `rank`, meeting at `endpoint` (HOST:PORT of node 0, static rendezvous: node ranks as given; ""
    with one node: a standalone rendezvous)."""

    count: int
    rank: int
    endpoint: str
    per_node: int

    def check(self, world: int) -> None:
        if self.count < 1 or self.per_node < 1:
            raise GraphsplitError(f"--nnodes and --nproc-per-node must be at least 1, got {self.count} and {self.per_node}")
        if not 0 <= self.rank < self.count:
            raise GraphsplitError(f"--node-rank must be in 0..{self.count - 1} for --nnodes {self.count}, got {self.rank}")
        host, _, port = self.endpoint.rpartition(":")
        if (self.endpoint or self.count > 1) and (not host or not port.isdigit()):
            raise GraphsplitError(f"--rdzv-endpoint must be HOST:PORT (node 0's address), got {self.endpoint!r}")
        if self.count * self.per_node != world:
            raise GraphsplitError(f"the plan needs {world} processes but --nnodes {self.count} x --nproc-per-node "
                                  f"{self.per_node} = {self.count * self.per_node}; start {world} processes in all")


def torchrun_command(spec_path: Path, world: int, nodes: Nodes | None = None) -> list[str]:
    """The torchrun command line that starts this machine's ranks."""
    if nodes is None or (nodes.count == 1 and not nodes.endpoint):  # this machine alone: a rendezvous of its own
        where = ["--standalone", f"--nproc-per-node={world}"]
    else:
        where = [f"--nnodes={nodes.count}", f"--node-rank={nodes.rank}", f"--nproc-per-node={nodes.per_node}",
                 "--rdzv-backend=static", f"--rdzv-endpoint={nodes.endpoint}"]
    return [sys.executable, "-m", "torch.distributed.run", *where, "-m", "graphsplit.launch.worker", str(spec_path)]


def _launch(spec_path: Path, world: int, timeout_s: float, log: Path,
            collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S, nodes: Nodes | None = None) -> None:
    """torchrun on this machine, supervised: on a failure, a stop or the timeout, none of this machine's
    ranks outlives this."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    cmd = torchrun_command(spec_path, world, nodes)
    local = nodes.per_node if nodes is not None else world
    supervise(cmd, env, local, spec_path.parent, timeout_s, log, collective_timeout_s)


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
    if opts.tensorboard:  # before the model loads: a missing optional package is the first thing said
        from .tensorboard import require_tensorboard

        require_tensorboard()
    loaded = load_model(model_spec, plan.seed)  # the batch each rank loads: the same seed
    if opts.save_every < 0 or opts.keep_last < 0:
        raise GraphsplitError(f"--save-every and --keep-last must be at least 0, got {opts.save_every} and {opts.keep_last}")
    if opts.save_every and not opts.save:
        raise GraphsplitError("--save-every needs --save DIR, the folder to write the checkpoints to")
    config = OptimConfig(opts.optimizer, opts.lr, **opts.optim)  # a bad setting is one line here
    if opts.nodes is not None:
        opts.nodes.check(plan.world_size)
        if opts.check and opts.nodes.count > 1:
            raise GraphsplitError("--check compares every rank's dumps in one place, so it runs on one node; "
                                  "compare a multi-node run's --metrics losses with a one-node run instead")
    if opts.check and plan.fp8 is not None and plan.autocast is not None:
        raise GraphsplitError(f"--check under --fp8 compares with torchao's float8 model in fp32; with --autocast "
                              f"{plan.autocast} it is not built yet: check --fp8 without --autocast")
    if opts.save:
        require_save_folder(opts.save)  # before training, not after it
    Faults.for_rank(0, opts.check)  # GRAPHSPLIT_FAULT (--check's own tests): a wrong name before anything starts
    done = 0
    if opts.resume:  # a clear error before anything starts; a --save folder gives its newest checkpoint
        from ..runtime.dcp.safe_read import check_checkpoint

        resume = resolve_checkpoint(opts.resume)
        check_checkpoint(resume)
        opts = replace(opts, resume=str(resume))
        done = read_info(resume)["step"]
        echo(f"resuming from {resume} (step {done})")
    # the ranks run in their own working directory: give them absolute paths
    opts = replace(opts, resume=opts.resume and str(Path(opts.resume).resolve()),
                   save=opts.save and str(Path(opts.save).resolve()),
                   metrics=opts.metrics and str(Path(opts.metrics).resolve()),
                   tensorboard=opts.tensorboard and str(Path(opts.tensorboard).resolve()))
    if opts.steps < (0 if opts.resume else 1) or (opts.check and opts.steps < 1):
        raise GraphsplitError(f"--steps must be at least 1 (0 only to re-save a checkpoint with --resume), got {opts.steps}")
    check_schedule(config.lr_schedule, config.warmup_steps, done + opts.steps)
    data_start = _check_data(loaded, plan, opts, echo)
    # Compile here first: a bad plan or model fails in one process, before torchrun starts.
    program = rewrite_loaded(loaded, plan, fixed_cuts).program
    plan = program.plan  # with the micro-batches decided for this batch
    require_parameters(program)
    randoms = find_random_ops(program.traced.gm)
    if opts.weights is not None:  # a wrong weights file, too, is one line here rather than on every rank
        check_weights(open_weights(opts.weights), loaded.build("meta"), opts.weights)
    # --print-command: the spec (and any weights file) stay for the printed command to use
    folder = contextlib.nullcontext(tempfile.mkdtemp(prefix="graphsplit-run-")) if opts.print_command else \
        tempfile.TemporaryDirectory(prefix="graphsplit-run-")
    with folder as tmp_str:
        tmp = Path(tmp_str)
        tensors = "exact"
        mode = "exact"
        if opts.weights is not None and opts.init == "fast":
            raise GraphsplitError("--init fast draws a new model and --weights gives one; drop one of them")
        echo(f"training on {objective(program, loaded.loss_fn)}")
        echo(f"batch: {program.batch.describe(program.traced.input_names)}")
        for line in program.batch.notes:
            echo(f"note: {line}")
        for line in [*combination_notes(program), *state_notes(program)]:
            echo(f"note: {line}")
        if opts.weights is None:
            mode, why = choose_init(opts.init, loaded.build("meta"), opts.check)
            echo(f"initialization: {why}")
        if mode == "fast":
            # each rank draws its own blocks (runtime/fast_init.py); the whole model at tp 1 holds the
            # same values, so it is the reference
            tensors = "fast"
            weights = None
            model = fast_model(loaded, plan.seed) if opts.check else None
        elif opts.weights is None:
            # the model's own initialization: each rank runs the constructor keeping only its tensors
            # (runtime/exact_init.py), or, when the init code reads other tensors, the model is built here once
            # and saved for the ranks to slice
            per_rank = exact_init_works(loaded)
            tensors = "exact" if per_rank else "file"
            weights = None if per_rank else str(tmp / "weights.pt")
            model = loaded.build("cpu", seed=plan.seed) if opts.check or not per_rank else None
            if not per_rank:
                torch.save(model_tensors(model), weights)
            echo("initialization: each rank runs the constructor keeping only its own parameters" if per_rank else
                 "initialization: the init code reads tensors across the model, so it is built once here and the ranks slice it")
        else:
            tensors = "user_file"
            weights = str(Path(opts.weights).resolve())
            model = reference_with_weights(loaded, weights, plan) if opts.check else None
        if not opts.check:
            del model
        spec = RunSpec(
            model=str(Path(loaded.path).resolve()) + (f":{loaded.factory}" if ":" in model_spec else ""),
            plan=plan.to_dict(), steps=opts.steps, optimizer=opts.optimizer, lr=opts.lr, optim=dict(opts.optim),
            fixed_cuts=list(fixed_cuts) if fixed_cuts is not None else None,
            tensors=tensors, weights=weights, dump_dir=str(tmp) if opts.check else None,
            save_dir=opts.save, save_every=opts.save_every, keep_last=opts.keep_last,
            resume_dir=opts.resume, timeout_s=opts.timeout_s,
            collective_timeout_s=opts.collective_timeout_s, run_dir=str(tmp),
            train_data=loaded.train_data is not None, eval_every=opts.eval_every, metrics=opts.metrics,
            tensorboard=opts.tensorboard, dropout_off=opts.check and bool(randoms.dropouts),
        )
        spec.save(tmp / "spec.json")
        if opts.print_command:
            echo(shlex.join(torchrun_command(tmp / "spec.json", plan.world_size, opts.nodes)))
            return None
        here = f" ({opts.nodes.per_node} on this node, node {opts.nodes.rank} of {opts.nodes.count})" \
            if opts.nodes is not None and opts.nodes.count > 1 else ""
        echo(f"launching {plan.world_size} processes{here}: dp={plan.dp}{' (fsdp)' if plan.fsdp else ''}{f' (ep={plan.ep})' if plan.ep > 1 else ''}{f' (cp={plan.cp})' if plan.cp > 1 else ''} x pp={plan.pp} x tp={plan.tp} ({plan.num_stages} stages, {plan.schedule}, "
             f"{plan.num_microbatches} micro-batch{'es' if plan.num_microbatches > 1 else ''})")
        if note := underfilled_note(plan):
            echo(f"note: {note}")
        _launch(tmp / "spec.json", plan.world_size, opts.timeout_s, tmp / "torchrun.log", opts.collective_timeout_s,
                opts.nodes)
        if not opts.check:
            return None
        first_step = done + 1
        # after the run: the reference skips the fp16 steps an overflow made the program skip
        skipped = set(json.loads((tmp / "skipped.json").read_text()))
        if skipped:
            echo(f"fp16: step(s) {', '.join(map(str, sorted(skipped)))} skipped on overflow (the reference skips them too)")
        # as the ranks ran: dropout off, draws from the plan's seed (worker.py)
        if plan.fp8 is not None:  # the reference is the untouched model as torchao converts it
            from .fp8_reference import float8_reference

            model = float8_reference(model, program.fp8_modules, plan.fp8)
        initial = {k: p.detach().clone() for k, p in model.named_parameters(remove_duplicate=False)}
        with no_dropout() if randoms.dropouts else contextlib.nullcontext(), seeded(plan.seed):
            # the reference's twin, whose distance is its own spread (tolerance.py): under --autocast the
            # model under torch.autocast; else in float64, unless the model draws (float64 draws other numbers)
            reference = reference_run(model, loaded, plan, opts.steps, config, opts.resume, first_step, skipped,
                                      train_data=loaded.train_data is not None, data_start=data_start,
                                      eval_every=opts.eval_every, program=program,
                                      precise=plan.autocast is not None or not randoms.draws, autocast=plan.autocast,
                                      nudge=plan.fp8 is not None)
        return check_run(program, tmp, reference, echo, first_step, grads=first_step not in skipped, model=model,
                         initial=initial, weights_rtol=weight_tolerance(Precision.of(plan)),
                         randoms=randoms)


def _check_data(loaded: LoadedModel, plan: Plan, opts: RunOptions, echo: Callable[[str], None]) -> int:
    """Where train_data() starts (the resumed checkpoint's position), after reading its first batch
    and, with --eval-every, eval_data()'s: a wrong structure is one line before anything starts."""
    from ..runtime.data import DataSource, is_dataset
    from ..runtime.dcp.record import data_position

    if opts.eval_every < 0:
        raise GraphsplitError(f"--eval-every must be at least 0, got {opts.eval_every}")
    if opts.eval_every and loaded.eval_data is None:
        raise GraphsplitError(f"--eval-every needs eval_data() in {loaded.path}: define it, returning an iterable "
                              "of (inputs, target) batches or a torch.utils.data.Dataset")
    start = data_position(read_info(opts.resume)) if opts.resume else 0
    example = (loaded.args, loaded.kwargs)
    if loaded.train_data is not None:
        source = DataSource("train_data", loaded.train_data, example, plan.seed)
        replicas = plan.sample_replicas
        next(source.global_batches(replicas, start))
        kind = f"a dataset of {len(source.source)} samples" if is_dataset(source.source) else "batches"
        shared = f" (each shared by {plan.cp} cp ranks, one shard of every sequence each)" if plan.cp > 1 else ""
        echo(f"data: train_data() gives {kind}; global batch {source.rows}, each of {replicas} {'dp' if plan.cp == 1 else 'sample'} replica(s){shared} "
             f"trains on {source.rows // replicas}" + (f"; resuming at batch {start}" if start else ""))
    if opts.eval_every:
        assert loaded.eval_data is not None
        next(DataSource("eval_data", loaded.eval_data, example, plan.seed, shuffle=False).global_batches(plan.sample_replicas, cycle=False))
    return start
