"""What each torchrun process runs for `graphsplit run`.

    python -m torch.distributed.run --nproc-per-node W -m graphsplit.launch.worker SPEC.json

SPEC.json (written by `graphsplit run`) names the model file, the plan, the
saved split, the step count, the optimizer and its schedule and clipping, the
weights file to slice this rank's stage from (mmap: no rank reads what it does
not hold), whether batches come from train_data(), and where to dump step 1
(and the losses, gradient norms and final weights) for `--check`.

Each step: this replica's share of the next global batch, forward and backward
through the pipeline, the global gradient norm (clipped with --grad-clip), the
optimizer step, the lr schedule's step; every --eval-every steps a forward-only
pass over eval_data().
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections import ChainMap
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..errors import GraphsplitError
from ..runtime.transfer import to_device
from .faults import Faults, runners
from .random_ops import no_dropout
from .supervise import DEFAULT_COLLECTIVE_TIMEOUT_S, RankReporter, set_collective_timeout

if TYPE_CHECKING:
    from ..backends.rank import TensorSource
    from ..backends.torch_distributed import DistributedPipeline
    from ..ir.program import Program
    from ..loader import LoadedModel
    from ..runtime.data import Batch
    from ..runtime.fast_init import FastInit
    from ..runtime.training import OptimConfig


@dataclass
class RunSpec:
    model: str
    plan: dict[str, Any]
    steps: int = 5
    optimizer: str = "sgd"
    lr: float = 0.01
    # the rest of the optimizer's settings (runtime/training.py OptimConfig, less optimizer and lr)
    optim: dict[str, Any] = field(default_factory=dict)
    fixed_cuts: list[str] | None = None
    # where each rank's tensors come from (one choice, `_tensor_source`): "exact", the model's constructor
    # keeping only this rank's parameters; "fast", only this rank's blocks drawn (runtime/fast_init.py);
    # "file", `weights`, the whole model saved by the launcher; "user_file", `weights`, the user's file
    # (parameters, persistent buffers: the other buffers from the constructor with parameters on meta)
    tensors: str = "exact"
    weights: str | None = None
    dump_dir: str | None = None
    timeout_s: float = 600.0  # collectives during set-up (imports, materializing a large stage)
    # collectives once set-up is over: a rank that stops answering is noticed within this
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    run_dir: str | None = None  # the launcher's folder: pids and failure records (launch/supervise.py)
    save_dir: str | None = None  # the --save folder: a checkpoint step-<N> in it after the last step
    save_every: int = 0  # and every this many steps (0: only after the last)
    keep_last: int = 3  # the newest checkpoints kept in save_dir (0: all)
    resume_dir: str | None = None  # a DCP checkpoint folder to start from (written at any plan)
    train_data: bool = False  # draw each step's batch from the model file's train_data()
    eval_every: int = 0  # evaluate on eval_data() every this many steps (0: never)
    metrics: str | None = None  # a JSON-lines file, one line per step (the rank holding the loss writes it)
    tensorboard: str | None = None  # a TensorBoard log folder, the same numbers as scalars (the same rank)
    # --check on a model with dropout: every dropout runs at p = 0, as in the reference (launch/random_ops.py)
    dropout_off: bool = False

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> RunSpec:
        return cls(**json.loads(path.read_text()))

    def optim_config(self) -> OptimConfig:
        from ..runtime.training import OptimConfig

        return OptimConfig(optimizer=self.optimizer, lr=self.lr, **self.optim)


def _tensor_source(spec: RunSpec, loaded: LoadedModel, program: Program) -> TensorSource:
    """Where this rank's tensors come from: the plan's seed through the model's own constructor,
    keeping only this rank's parameters (exact init), fast init drawing only this rank's blocks,
    or a weights file mapped into memory."""

    def tensors(stages: Sequence[int]) -> Mapping[str, torch.Tensor] | FastInit | None:
        if spec.tensors == "fast":
            from ..runtime.fast_init import FastInit

            return FastInit.for_model(loaded, program.plan.seed)
        if spec.tensors == "exact":
            from ..runtime.exact_init import exact_build

            keep = {c for s in stages for c in program.stages[s].param_sources.values()}
            keep |= {n for c in keep for n in program.expert_slots.get(c, ())}  # a loop's experts: any rank's
            return exact_build(loaded, program.plan.seed, keep)
        assert spec.weights is not None, spec.tensors
        from ..runtime.weights import open_weights

        source = open_weights(spec.weights)
        if spec.tensors == "user_file":  # the user's file holds no non-persistent buffer: the constructor makes them
            buffers = dict(loaded.build_buffers_only().named_buffers(remove_duplicate=False))
            return ChainMap(source, buffers)  # type: ignore[arg-type]
        return source

    return tensors


def run(spec: RunSpec, reporter: RankReporter | None = None) -> None:
    from ..backends.rank import assemble_rank
    from ..loader import load_model
    from ..plan import Plan
    from ..rewrite import rewrite_loaded
    from ..runtime.dcp.record import data_position, model_names, read_info
    from ..runtime.microbatch import gather_outputs
    from ..runtime.schedule import advance, make_scheduler
    from .metrics import StepLog, work_per_step
    from .parity import RankStep

    plan = Plan.from_dict(spec.plan)
    reporter = reporter or RankReporter(None)
    loaded = load_model(spec.model, plan.seed)
    fixed = tuple(spec.fixed_cuts) if spec.fixed_cuts is not None else None
    program = rewrite_loaded(loaded, plan, fixed).program
    rank = assemble_rank(program, _tensor_source(spec, loaded, program), loaded.loss_fn, model_names(loaded.build("meta")),
                         spec.timeout_s, spec.collective_timeout_s, observer=reporter)
    pipe = rank.pipeline
    # errors injected on purpose, only under --check: how the suite proves the check fails them (faults.py)
    faults = Faults.for_rank(dist.get_rank(), bool(spec.dump_dir))
    faults.after_build(program, rank.modules, runners(pipe.schedule))
    settings = spec.optim_config()
    # ZeRO-1: the optimizer states sharded over the dp replicas
    optimizer = settings.make_optimizer(pipe.parameters(), rank.mesh.get_group("dp") if plan.zero == 1 else None)
    done = rank.load_checkpoint(spec.resume_dir, optimizer) if spec.resume_dir else 0
    last = done + spec.steps
    scheduler = make_scheduler(optimizer, settings.lr_schedule, settings.warmup_steps, last, done)
    position = data_position(read_info(spec.resume_dir)) if spec.resume_dir and spec.train_data else 0
    batches = _train_batches(spec, loaded, program, rank.dp_rank, position, rank.device)
    prints_loss = pipe.is_last and rank.dp_rank == 0 and rank.tp_rank == 0
    unit, per_step = work_per_step(loaded.args, loaded.kwargs, program.batch.size)
    log = StepLog(spec.metrics if prints_loss else None, unit, per_step, rank.device, append=bool(spec.resume_dir),
                  tensorboard=spec.tensorboard if prints_loss else None)
    losses: list[float] = []
    norms: list[float] = []
    eval_losses: dict[int, float] = {}
    skipped: list[int] = []  # fp16 steps an overflow skipped (every rank agrees)
    set_collective_timeout(pipe.process_groups(), spec.collective_timeout_s)
    record = rank.record(spec.model, spec.optimizer)

    def save(step: int) -> None:
        """Checkpoint `step-<step>` in the --save folder; every rank takes part."""
        reporter.at(f"while saving step {step}")
        # every rank writes its blocks: the slowest writer may take long, so set-up's timeout again
        set_collective_timeout(pipe.process_groups(), spec.timeout_s)
        record["data"] = {"train_batches": position + step - done} if spec.train_data else {}
        folder = rank.save_series(spec.save_dir, optimizer, step, record, spec.keep_last, keep=spec.resume_dir)
        set_collective_timeout(pipe.process_groups(), spec.collective_timeout_s)
        if dist.get_rank() == 0:
            print(f"saved step {step} to {folder}", flush=True)

    if spec.dump_dir:  # --check: the model's random draws start where the reference's do (random_ops.py)
        torch.manual_seed(plan.seed)
    for step in range(done + 1, last + 1):
        reporter.at(f"during step {step}")
        inputs, target = faults.batch(program, *next(batches))
        started = time.perf_counter()
        # the output only where --check compares it: kept, a language model's logits (and their merged
        # copy) would outlive the backward and the optimizer step
        loss, output = pipe.step(inputs, target, keep_output=step == done + 1 and bool(spec.dump_dir))
        expert_tokens = pipe.expert_tokens()  # every rank: one all-reduce under ep (before eval adds its own)
        faults.grads(pipe.parameters())
        if step == done + 1 and spec.dump_dir:
            whole = faults.output(gather_outputs(program, output, pipe.tp_comm))
            dump = RankStep(dist.get_rank(), tuple(sorted(rank.modules)), pipe.grads(), loss,
                            to_device(whole, torch.device("cpu")), rank.tp_rank, rank.dp_rank)
            torch.save(vars(dump), Path(spec.dump_dir) / f"rank{dist.get_rank()}.pt")
        norm = pipe.clip_grads(optimizer, settings.grad_clip)
        lr = optimizer.param_groups[0]["lr"]
        stepped = pipe.optimizer_step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        advance(scheduler)
        if rank.device.type == "cuda":
            torch.cuda.synchronize(rank.device)
        seconds = time.perf_counter() - started
        if not stepped:
            skipped.append(step)
        evaluated = None
        if spec.eval_every and step % spec.eval_every == 0:
            reporter.at(f"while evaluating after step {step}")
            evaluated = _evaluate(loaded, program, pipe, rank.dp_rank, rank.device)
            if evaluated is not None:
                eval_losses[step] = evaluated
        norms.append(norm)
        if prints_loss:
            assert loss is not None
            losses.append(float(loss))
            clipped = settings.grad_clip is not None and norm > settings.grad_clip
            log.step(step, float(loss), lr, norm, seconds, clipped, not stepped, evaluated, expert_tokens)
        if spec.save_dir and spec.save_every and step % spec.save_every == 0 and step != last:
            save(step)  # so a crash loses at most save_every steps
    log.close()
    if prints_loss and spec.dump_dir:
        folder = Path(spec.dump_dir)
        (folder / "losses.json").write_text(json.dumps(faults.curve(losses)))
        (folder / "skipped.json").write_text(json.dumps(skipped))
        (folder / "norms.json").write_text(json.dumps(norms))
        (folder / "eval.json").write_text(json.dumps(eval_losses))
    if spec.dump_dir and "no_weights" not in faults:  # the weights after the last step: this rank's shards
        torch.save(pipe.weights(), Path(spec.dump_dir) / f"weights{dist.get_rank()}.pt")
    if spec.save_dir:
        save(last)
    dist.barrier()
    dist.destroy_process_group()


def _train_batches(spec: RunSpec, loaded: LoadedModel, program: Program, dp_rank: int, position: int,
                   device: torch.device) -> Iterator[tuple[tuple[torch.Tensor, ...], Any]]:
    """(flat inputs, target) on this rank's device for each step: this replica's share of the next
    global batch of train_data() from `position`, or of example_inputs() every step."""
    from ..runtime.data import Batch, DataSource
    from ..runtime.microbatch import batch_size, batch_tree_dims, split_microbatches
    from ..runtime.training import default_target

    plan = program.plan
    replicas, replica = plan.sample_replicas, dp_rank // plan.cp  # cp ranks share their samples

    if spec.train_data:
        assert loaded.train_data is not None
        source = DataSource("train_data", loaded.train_data, (loaded.args, loaded.kwargs), plan.seed, program=program)
        for batch in source.batches(replicas, replica, position):
            yield _prepared(program, batch, dp_rank, device)
        return
    target = loaded.target if loaded.target is not None else None
    whole = Batch(loaded.args, loaded.kwargs, target)
    if whole.target is None:  # the stand-in target of the whole batch: each replica takes its rows of it
        flat = program.traced.flatten_inputs(loaded.args, loaded.kwargs)
        whole.target = default_target(flat, batch_size(program, flat))
    dims = batch_tree_dims(program, whole.args, whole.kwargs, whole.target)
    share = Batch.from_tree(split_microbatches(whole.tree(), replicas, dims)[replica]) if replicas > 1 else whole
    fixed = _prepared(program, share, dp_rank, device)
    while True:
        yield fixed


def _prepared(program: Program, batch: Batch, dp_rank: int, device: torch.device) -> tuple[tuple[torch.Tensor, ...], Any]:
    """(flat inputs, target) of one sample replica's batch on `device`, each sequence cut to this
    rank's shard under context parallelism."""
    from ..runtime.microbatch import batch_size, sequence_share
    from ..runtime.training import default_target

    inputs = program.traced.flatten_inputs(batch.args, batch.kwargs)
    target = batch.target if batch.target is not None else default_target(inputs, batch_size(program, inputs))
    inputs, target = sequence_share(program, inputs, target, dp_rank % program.plan.cp)
    return to_device(inputs, device), to_device(target, device)


def _evaluate(loaded: LoadedModel, program: Program, pipe: DistributedPipeline, dp_rank: int,
              device: torch.device) -> float | None:
    """The mean loss over one pass of eval_data() (every rank runs it; the last stage gets the number)."""
    from ..runtime.data import DataSource

    assert loaded.eval_data is not None
    plan = program.plan
    source = DataSource("eval_data", loaded.eval_data, (loaded.args, loaded.kwargs), plan.seed, shuffle=False,
                        program=program)
    total, count = 0.0, 0
    for batch in source.batches(plan.sample_replicas, dp_rank // plan.cp, cycle=False):
        loss = pipe.evaluate(*_prepared(program, batch, dp_rank, device))
        count += 1
        if loss is not None:
            total += float(loss)
    return total / count if pipe.is_last and count else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = RunSpec.load(Path(argv[0]))
    reporter = RankReporter(spec.run_dir)
    try:
        with no_dropout() if spec.dropout_off else contextlib.nullcontext():
            run(spec, reporter)
    except GraphsplitError as exc:
        reporter.failed(exc)
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except BaseException as exc:
        reporter.failed(exc)  # the launcher's one line comes from this record; the traceback goes to the log
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
