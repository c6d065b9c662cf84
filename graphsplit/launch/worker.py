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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree

from ..errors import GraphsplitError
from .supervise import DEFAULT_COLLECTIVE_TIMEOUT_S, RankReporter, set_collective_timeout


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


def make_optimizer(name: str, params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    raise GraphsplitError(f"unknown optimizer {name!r}; choose sgd or adamw")




def _to(device: torch.device, value: Any) -> Any:
    return pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), value)


def run(spec: RunSpec, reporter: RankReporter | None = None) -> None:
    from ..backends.torch_distributed import (
        DistributedPipeline,
        init_distributed,
        make_mesh,
        materialize_rank,
    )
    from ..compile import compile_loaded
    from ..loader import load_model
    from ..plan import Plan
    from ..runtime.dcp import record, series
    from ..runtime.dcp import state as dcp_state
    from ..runtime.microbatch import gather_outputs, split_microbatches
    from ..runtime.training import make_loss
    from ..runtime.weights import open_weights

    plan = Plan.from_dict(spec.plan)
    reporter = reporter or RankReporter(None)
    device = init_distributed(spec.timeout_s)
    reporter.join_diagnosis_group()
    mesh = make_mesh(plan, device, spec.collective_timeout_s)
    loaded = load_model(spec.model)
    fixed = tuple(spec.fixed_cuts) if spec.fixed_cuts is not None else None
    program = compile_loaded(loaded, plan, fixed).program
    source = open_weights(spec.weights) if spec.weights else None
    if source is not None and spec.user_weights:
        buffers = dict(loaded.build_buffers_only().named_buffers(remove_duplicate=False))
        source = ChainMap(source, buffers)  # type: ignore[arg-type]
    if spec.lean_init:
        from ..runtime.lean_init import lean_build

        keep = {c for s in plan.stages_of_rank(mesh.get_local_rank("pp")) for c in program.stages[s].param_sources.values()}
        source = lean_build(loaded, plan.seed, keep)
    modules = materialize_rank(program, mesh, device, source)
    del source
    reporter.setup_done(spec.timeout_s)
    pipe = DistributedPipeline(program, modules, make_loss(program, loaded.loss_fn), mesh, device)
    optimizer = make_optimizer(spec.optimizer, pipe.parameters(), spec.lr)
    tp_rank = mesh.get_local_rank("tp")
    persistent, aliases = record.model_names(loaded.build("meta"))
    done = 0
    if spec.resume_dir:
        dcp_state.init_optimizer_state(optimizer)
        state = dcp_state.rank_state(program, modules, optimizer, tp_rank, persistent)
        state.update(dcp_state.scaler_state(pipe.scaler))
        same_world = record.read_info(spec.resume_dir).get("plan") == plan.to_dict()
        done = dcp_state.load_checkpoint(spec.resume_dir, state, same_world)
    inputs = program.traced.flatten_inputs(loaded.args, loaded.kwargs)
    target = loaded.target if loaded.target is not None else torch.zeros(inputs[0].shape[0])
    dp_rank = mesh.get_local_rank("dp")
    if plan.dp > 1:  # this replica's share of the global batch
        inputs = split_microbatches(inputs, plan.dp)[dp_rank]
        target = split_microbatches(target, plan.dp)[dp_rank]
    inputs, target = _to(device, inputs), _to(device, target)
    prints_loss = pipe.is_last and dp_rank == 0 and tp_rank == 0
    losses: list[float] = []
    skipped: list[int] = []  # fp16 steps an overflow skipped (every rank agrees)
    set_collective_timeout(pipe.process_groups(), spec.collective_timeout_s)
    last = done + spec.steps

    def save(step: int) -> None:
        """Checkpoint `step-<step>` in the --save folder; every rank takes part."""
        reporter.where = f"while saving step {step}"
        # every rank writes its blocks: the slowest writer may take long, so set-up's timeout again
        set_collective_timeout(pipe.process_groups(), spec.timeout_s)
        record = {"plan": plan.to_dict(), "model": spec.model, "optimizer": spec.optimizer, "aliases": aliases}
        state = dcp_state.rank_state(program, modules, optimizer, tp_rank, persistent)
        state.update(dcp_state.scaler_state(pipe.scaler))
        folder = series.save_series(spec.save_dir, state, step, record, spec.keep_last, keep=spec.resume_dir)
        set_collective_timeout(pipe.process_groups(), spec.collective_timeout_s)
        if dist.get_rank() == 0:
            print(f"saved step {step} to {folder}", flush=True)

    for step in range(done + 1, last + 1):
        reporter.where = f"during step {step}"
        loss, output = pipe.step(inputs, target)
        if step == done + 1 and spec.dump_dir:
            whole = gather_outputs(program, output, pipe.tp_comm)
            dump = {"grads": pipe.grads(), "loss": loss, "output": _to(torch.device("cpu"), whole),
                    "tp_rank": mesh.get_local_rank("tp"), "dp_rank": dp_rank}
            torch.save(dump, Path(spec.dump_dir) / f"rank{dist.get_rank()}.pt")
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
