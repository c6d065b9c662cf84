"""Pipeline step time per schedule, on one model and plan shape (pp=2), with the bubble each leaves.

    python bench/pp_schedules.py                      # tp_step.py's stack: dim 128, 8 layers, batch 8, seq 64
    python bench/pp_schedules.py --microbatches 8 --rounds 3

Two gloo CPU processes (`torch.multiprocessing.spawn`, one thread each) build the same
transformer stack (bench/tp_step.py's `Stack`) and `parallelize` it once per schedule:
gpipe and 1f1b (one stage per rank), interleaved-1f1b, looped-bfs, zero-bubble, zbv and
dualpipev (two per rank). A step is `train_step` (forward + backward over the
micro-batches). Every schedule is warmed up, then timed in interleaved rounds (each round
times --steps steps of every schedule, the order rotating); the median per step is printed
beside the planner's bubble fraction for that schedule (graphsplit/planner/schedules.py:
closed forms for the first four, torch's own action order timed with F = I = W for the
zero-bubble ones) and the ratio to 1F1B's time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tp_step import build, data, free_port, mse  # noqa: E402

PP = 2
SCHEDULES = (("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 2), ("looped-bfs", 2), ("zero-bubble", 2),
             ("zbv", 2), ("dualpipev", 2))


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(PP), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=PP, timeout=timedelta(seconds=300))
    from graphsplit import Plan, parallelize
    from graphsplit.planner.schedules import bubble_fraction

    x, y = data(args)
    modules = {}
    for name, v in SCHEDULES:
        plan = Plan(pp=PP, schedule=name, stages_per_rank=v, microbatches=args.microbatches)
        modules[name] = parallelize(build(args), plan, example_inputs=(x,), loss_fn=mse)
        for _ in range(args.warmup):
            modules[name].train_step(x, target=y)
    times: dict[str, list[float]] = {name: [] for name, _ in SCHEDULES}
    names = [name for name, _ in SCHEDULES]
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.steps):
                modules[name].train_step(x, target=y)
            dist.barrier()
            times[name].append((time.perf_counter() - start) / args.steps)
    if rank == 0:
        base = statistics.median(times["1f1b"])
        print(f"pp={PP}, {args.microbatches} micro-batches, dim {args.dim}, {args.layers} layers, batch {args.batch}, "
              f"seq {args.seq}; median of {args.rounds} interleaved rounds of {args.steps} steps")
        print(f"{'schedule':<18}{'stages/rank':>12}{'step ms':>10}{'vs 1f1b':>9}{'bubble (planner)':>18}")
        for name, v in SCHEDULES:
            t = statistics.median(times[name])
            print(f"{name:<18}{v:>12}{t * 1e3:>10.1f}{t / base:>9.2f}"
                  f"{bubble_fraction(name, PP, args.microbatches, v):>18.1%}")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    mp.spawn(worker, args=(args, free_port()), nprocs=PP, join=True)


if __name__ == "__main__":
    main()
