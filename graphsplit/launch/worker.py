"""What each torchrun process runs for `graphsplit run`.

    python -m torch.distributed.run --nproc-per-node W -m graphsplit.launch.worker SPEC.json

SPEC.json (written by `graphsplit run`) names the model file, the plan, the
saved split, the step count and optimizer, the weights file to slice this
rank's stage from (mmap: no rank reads what it does not hold), and where to
dump step 1 for `--check`.
"""

from __future__ import annotations

import json
import sys
from collections import ChainMap
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree

from ..errors import GraphsplitError
from .supervise import DEFAULT_COLLECTIVE_TIMEOUT_S, RankReporter, set_collective_timeout

if TYPE_CHECKING:
    from ..backends.rank import TensorSource
    from ..ir.program import Program
    from ..loader import LoadedModel


@dataclass
class RunSpec:
    model: str
    plan: dict[str, Any]
    steps: int = 5
    optimizer: str = "sgd"
    lr: float = 0.01
    fixed_cuts: list[str] | None = None
    weights: str | None = None
    # True: `weights` is the user's file (parameters, persistent buffers); the other
    # buffers come from running the constructor with parameters on meta
    user_weights: bool = False
    dump_dir: str | None = None
    timeout_s: float = 600.0  # collectives during set-up (imports, materializing a large stage)
    # collectives once set-up is over: a rank that stops answering is noticed within this
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    run_dir: str | None = None  # the launcher's folder: pids and failure records (launch/supervise.py)
    save_dir: str | None = None  # the --save folder: a checkpoint step-<N> in it after the last step
    save_every: int = 0  # and every this many steps (0: only after the last)
    keep_last: int = 3  # the newest checkpoints kept in save_dir (0: all)
    resume_dir: str | None = None  # a DCP checkpoint folder to start from (written at any plan)
    lean_init: bool = False  # no weights file: run the constructor keeping only this rank's parameters

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> RunSpec:
        return cls(**json.loads(path.read_text()))


def _to(device: torch.device, value: Any) -> Any:
    return pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), value)


def _tensor_source(spec: RunSpec, loaded: LoadedModel, program: Program) -> TensorSource:
    """Where this rank's tensors come from: the plan's seed through the model's own constructor,
    keeping only this rank's parameters (lean init), or a weights file mapped into memory."""

    def tensors(stages: Sequence[int]) -> Mapping[str, torch.Tensor] | None:
        if spec.lean_init:
            from ..runtime.lean_init import lean_build

            keep = {c for s in stages for c in program.stages[s].param_sources.values()}
            return lean_build(loaded, program.plan.seed, keep)
        if not spec.weights:
            return None
        from ..runtime.weights import open_weights

        source = open_weights(spec.weights)
        if spec.user_weights:  # the user's file holds no non-persistent buffer: the constructor makes them
            buffers = dict(loaded.build_buffers_only().named_buffers(remove_duplicate=False))
            return ChainMap(source, buffers)  # type: ignore[arg-type]
        return source

    return tensors


def run(spec: RunSpec, reporter: RankReporter | None = None) -> None:
    from ..backends.rank import assemble_rank
    from ..compile import compile_loaded
    from ..loader import load_model
    from ..plan import Plan
    from ..runtime.dcp.record import model_names
    from ..runtime.microbatch import gather_outputs, split_microbatches
    from ..runtime.training import default_target, make_optimizer
    from .parity import RankStep

    plan = Plan.from_dict(spec.plan)
    reporter = reporter or RankReporter(None)
    loaded = load_model(spec.model)
    fixed = tuple(spec.fixed_cuts) if spec.fixed_cuts is not None else None
    program = compile_loaded(loaded, plan, fixed).program
    rank = assemble_rank(program, _tensor_source(spec, loaded, program), loaded.loss_fn, model_names(loaded.build("meta")),
                         spec.timeout_s, spec.collective_timeout_s, observer=reporter)
    pipe = rank.pipeline
    optimizer = make_optimizer(spec.optimizer, pipe.parameters(), spec.lr)
    done = rank.load_checkpoint(spec.resume_dir, optimizer) if spec.resume_dir else 0
    inputs = program.traced.flatten_inputs(loaded.args, loaded.kwargs)
    target = loaded.target if loaded.target is not None else default_target(inputs)
    if plan.dp > 1:  # this replica's share of the global batch
        inputs = split_microbatches(inputs, plan.dp)[rank.dp_rank]
        target = split_microbatches(target, plan.dp)[rank.dp_rank]
    inputs, target = _to(rank.device, inputs), _to(rank.device, target)
    prints_loss = pipe.is_last and rank.dp_rank == 0 and rank.tp_rank == 0
    losses: list[float] = []
    skipped: list[int] = []  # fp16 steps an overflow skipped (every rank agrees)
    set_collective_timeout(pipe.process_groups(), spec.collective_timeout_s)
    last = done + spec.steps
    record = rank.record(spec.model, spec.optimizer)

    def save(step: int) -> None:
        """Checkpoint `step-<step>` in the --save folder; every rank takes part."""
        reporter.where = f"while saving step {step}"
        # every rank writes its blocks: the slowest writer may take long, so set-up's timeout again
        set_collective_timeout(pipe.process_groups(), spec.timeout_s)
        folder = rank.save_series(spec.save_dir, optimizer, step, record, spec.keep_last, keep=spec.resume_dir)
        set_collective_timeout(pipe.process_groups(), spec.collective_timeout_s)
        if dist.get_rank() == 0:
            print(f"saved step {step} to {folder}", flush=True)

    for step in range(done + 1, last + 1):
        reporter.where = f"during step {step}"
        loss, output = pipe.step(inputs, target)
        if step == done + 1 and spec.dump_dir:
            whole = gather_outputs(program, output, pipe.tp_comm)
            dump = RankStep(dist.get_rank(), tuple(sorted(rank.modules)), pipe.grads(), loss,
                            _to(torch.device("cpu"), whole), rank.tp_rank, rank.dp_rank)
            torch.save(vars(dump), Path(spec.dump_dir) / f"rank{dist.get_rank()}.pt")
        stepped = pipe.optimizer_step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        if not stepped:
            skipped.append(step)
        if prints_loss:
            assert loss is not None
            losses.append(float(loss))
            note = "  (fp16 overflow: step skipped, loss scale halved)" if not stepped else ""
            print(f"step {step:>3}  loss {float(loss):.6f}{note}", flush=True)
        if spec.save_dir and spec.save_every and step % spec.save_every == 0 and step != last:
            save(step)  # so a crash loses at most save_every steps
    if prints_loss and spec.dump_dir:
        (Path(spec.dump_dir) / "losses.json").write_text(json.dumps(losses))
        (Path(spec.dump_dir) / "skipped.json").write_text(json.dumps(skipped))
    if spec.save_dir:
        save(last)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = RunSpec.load(Path(argv[0]))
    reporter = RankReporter(spec.run_dir)
    try:
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
