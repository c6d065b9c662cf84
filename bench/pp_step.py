"""Pipeline step time: graphsplit's pp=2 program against `torch.distributed.pipelining`'s own
`pipeline()` + `PipelineStage`, split at the same layer, same schedule, same micro-batches.

    python bench/pp_step.py                              # llama dim 256, 8 layers, batch 8, seq 128, 1f1b + gpipe
    python bench/pp_step.py --schedules 1f1b --rounds 4  # a quick run
    python bench/pp_step.py --profile 25                 # also cProfile both on rank 0 (top 25 by own time; --profile-rank 1: the last stage)

Two gloo CPU processes (`torch.multiprocessing.spawn`, one thread each) build
examples/llama.py (untied LM head, rotary tables as buffers) from the same seed and train
it as pp=2, cut at the start of `layers.{layers // 2}`, two ways per schedule:

- graphsplit: `parallelize(model, Plan(pp=2, schedule=..., microbatches=M,
  split_at=("layers.K",)), example_inputs=(x,), loss_fn=cross_entropy)`; `train_step`.
- torch: `pipeline(model, mb_args=(one micro-batch,), split_spec={"layers.K":
  SplitPoint.BEGINNING})`, `pipe.build_stage(rank, cpu)`, the same schedule class with the
  same `n_microbatches`, `loss_fn` and `scale_grads=True`; `schedule.step(x)` on rank 0,
  `schedule.step(target=y, losses=...)` on rank 1.

A step is forward + backward over the micro-batches + `torch.optim.SGD.step()` (gradients
set to None first). Step 1's loss of each is printed (same weights, same batch: they must
agree) before any timing. Then every side is warmed up and timed in interleaved rounds
(each round times --steps steps of each side, graphsplit and torch alternating which goes
first), so machine noise falls on both alike. Printed per side: the median over rounds of
the per-step wall time (the slower rank's clock) and the median per-step process CPU time
(mean of the ranks); ratios are graphsplit / torch (target <= 1.0): of the wall medians and
the median of the per-round ratios (each round's two measurements are back to back).
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tp_step import free_port  # noqa: E402

PP = 2
SCHEDULE_CLASSES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe"}


def load_llama() -> Any:
    path = Path(__file__).resolve().parent.parent / "examples" / "llama.py"
    spec = importlib.util.spec_from_file_location("bench_llama", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def build(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(0)
    return load_llama().build_model(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                                    n_kv_heads=args.heads // 2, max_seq_len=args.seq)


def data(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    return x, torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)


def make_graphsplit(args: argparse.Namespace, schedule: str, split: str, x: torch.Tensor,
                    y: torch.Tensor) -> Callable[[], torch.Tensor | None]:
    from graphsplit import Plan, parallelize

    plan = Plan(pp=PP, schedule=schedule, microbatches=args.microbatches, split_at=(split,))
    module = parallelize(build(args), plan, example_inputs=(x,), loss_fn=loss_fn)
    params = list(module.parameters())
    optimizer = torch.optim.SGD(params, lr=args.lr)

    def step() -> torch.Tensor | None:
        optimizer.zero_grad(set_to_none=True)
        loss = module.train_step(x, target=y)
        optimizer.step()
        return loss

    return step


def make_torch(args: argparse.Namespace, schedule: str, split: str, x: torch.Tensor,
               y: torch.Tensor) -> Callable[[], torch.Tensor | None]:
    import torch.distributed.pipelining as pipelining

    rank = dist.get_rank()
    micro = x.tensor_split(args.microbatches)[0]
    pipe = pipelining.pipeline(build(args), mb_args=(micro,),
                               split_spec={split: pipelining.SplitPoint.BEGINNING})
    stage = pipe.build_stage(rank, torch.device("cpu"))
    cls = getattr(pipelining, SCHEDULE_CLASSES[schedule])
    sched = cls(stage, n_microbatches=args.microbatches, loss_fn=loss_fn, scale_grads=True)
    optimizer = torch.optim.SGD(stage.submod.parameters(), lr=args.lr)

    def step() -> torch.Tensor | None:
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            sched.step(x)
            loss = None
        else:
            losses: list[torch.Tensor] = []
            sched.step(target=y, losses=losses)
            loss = torch.stack([t.detach() for t in losses]).mean()
        optimizer.step()
        return loss

    return step


def timed(step: Callable[[], Any], steps: int) -> tuple[float, float]:
    """(wall seconds per step, slower rank; CPU seconds per step, mean of ranks)."""
    dist.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    dist.barrier()
    wall = torch.tensor([(time.perf_counter() - start) / steps])
    cpu_t = torch.tensor([(time.process_time() - cpu) / steps / PP])
    dist.all_reduce(wall, op=dist.ReduceOp.MAX)
    dist.all_reduce(cpu_t)
    return wall.item(), cpu_t.item()


def profile(step: Callable[[], Any], steps: int, top: int) -> str:
    profiler = cProfile.Profile()
    dist.barrier()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    dist.barrier()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(PP), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=PP, timeout=timedelta(seconds=300))
    x, y = data(args)
    split = f"layers.{args.layers // 2}"
    lines: list[str] = []
    for schedule in args.schedules:
        steps = {"graphsplit": make_graphsplit(args, schedule, split, x, y),
                 "torch": make_torch(args, schedule, split, x, y)}
        first = {name: step() for name, step in steps.items()}  # step 1: same weights, same batch
        for _ in range(args.warmup):
            for step in steps.values():
                step()
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
        for r in range(args.rounds):
            for name in sorted(steps, reverse=r % 2 == 1):
                samples[name].append(timed(steps[name], args.steps))
        profiles = {name: profile(step, args.steps, args.profile) for name, step in steps.items()} if args.profile else {}
        if rank == PP - 1:  # the last stage holds the loss
            gl, tl = first["graphsplit"].item(), first["torch"].item()
            wall = {n: statistics.median(w for w, _ in s) for n, s in samples.items()}
            cpu = {n: statistics.median(c for _, c in s) for n, s in samples.items()}
            paired = statistics.median(g[0] / t[0] for g, t in zip(samples["graphsplit"], samples["torch"]))
            lines.append(f"\n{schedule} ({SCHEDULE_CLASSES[schedule]}), {args.microbatches} micro-batches, split at {split}")
            lines.append(f"step 1 loss: graphsplit {gl:.6f}  torch {tl:.6f}  |diff| {abs(gl - tl):.2e}")
            lines.append(f"{'':12}{'ms/step':>9}{'min':>8}{'max':>8}{'/ torch':>9} |{'cpu ms/step':>12}{'/ torch':>9}")
            for name in steps:
                w = [s for s, _ in samples[name]]
                lines.append(f"{name:12}{wall[name] * 1e3:9.1f}{min(w) * 1e3:8.1f}{max(w) * 1e3:8.1f}"
                             f"{wall[name] / wall['torch']:8.2f}x |{cpu[name] * 1e3:12.1f}"
                             f"{cpu[name] / cpu['torch']:8.2f}x")
            lines.append(f"ratio graphsplit / torch: {wall['graphsplit'] / wall['torch']:.2f} (target <= 1.0); "
                         f"median of the per-round ratios {paired:.2f}")
        for name, text in profiles.items():
            if rank == args.profile_rank:
                print(f"\n[{schedule}] cProfile of {args.steps} {name} steps on rank {rank} (by own time):\n{text.rstrip()}")
        dist.barrier()
    if rank == PP - 1:
        n_params = sum(p.numel() for p in build(args).parameters())
        print(f"llama: {args.layers} layers, dim {args.dim}, {args.heads} heads, vocab {args.vocab}, batch {args.batch}, "
              f"seq {args.seq}, {n_params / 1e6:.2f}M parameters; pp={PP} on gloo, 1 thread per rank; "
              f"medians of {args.rounds} interleaved rounds of {args.steps} steps after {args.warmup} warm-up "
              f"(ms: wall clock of the slower rank; cpu: process CPU time, mean of ranks)")
        print("\n".join(lines))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--schedules", nargs="+", choices=tuple(SCHEDULE_CLASSES), default=["1f1b", "gpipe"])
    p.add_argument("--warmup", type=int, default=2, help="untimed steps of each before timing")
    p.add_argument("--steps", type=int, default=3, help="steps per timed round")
    p.add_argument("--rounds", type=int, default=8, help="interleaved rounds; the median is reported")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="cProfile --steps steps of each on --profile-rank; print the top N functions by own time")
    p.add_argument("--profile-rank", type=int, choices=range(PP), default=0, help="the rank whose profile is printed")
    args = p.parse_args()
    if args.heads % 2 or args.dim % args.heads or args.batch % args.microbatches:
        p.error("--heads must be even and divide --dim; --microbatches must divide --batch")
    mp.spawn(worker, args=(args, free_port()), nprocs=PP, join=True)


if __name__ == "__main__":
    main()
