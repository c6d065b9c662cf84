"""Tensor-parallel step time: graphsplit's tp=2 program against PyTorch DTensor's
`parallelize_module` with the hand-written Colwise/Rowwise plan, on one model.

    python bench/tp_step.py                            # dim 256, 4 heads, 4 layers, batch 8, seq 128
    python bench/tp_step.py --layers 2 --rounds 4      # a quick run
    python bench/tp_step.py --dtensor-plan prepared    # DTensor with one backward all-reduce per attention
    python bench/tp_step.py --profile 25               # also cProfile both on rank 0 (top 25 by own time)

Two gloo CPU processes (`torch.multiprocessing.spawn`, one thread each) build
the same transformer stack from the same seed (pre-LayerNorm blocks: separate
q/k/v `nn.Linear`s, `view(B, T, n_head, head_dim)` + transpose,
`F.scaled_dot_product_attention(is_causal=True)`, out-projection; MLP
Linear -> GELU -> Linear; residuals; a final LayerNorm), loss MSE to a fixed
target, and train it as tp=2 two ways:

- graphsplit: `parallelize(model, Plan(tp=2), example_inputs=(x,), loss_fn=mse)`
  on the model exactly as written; `module.train_step(x, target=y)`.
- DTensor: `parallelize_module` on each block with q/k/v and mlp.fc
  `ColwiseParallel()`, attn.proj and mlp.proj `RowwiseParallel()`; then
  `loss = mse(model(x), y); loss.backward()`. The model as written does not
  run under that plan: its attention views the local q/k/v shards as
  `n_head` heads, so, as every DTensor user must, the script edits the
  model after parallelizing (`attn.n_head = n_head // tp`). graphsplit needs
  no such edit: it rewrites the view sizes itself. With that plan each of
  q, k, v all-reduces its input's gradient; `--dtensor-plan prepared` adds the
  `PrepareModuleInput` on attn that an expert would, so they share one.

A step is forward + backward (no optimizer step; gradients are set to None
before each). Both are warmed up, then timed in interleaved rounds (each
round times --steps steps of one and then of the other, the order alternating),
so machine noise falls on both alike. Printed per side: the median over rounds
of the per-step wall time (the slower rank's clock), its min and max, and the
median per-step process CPU time (mean of the ranks: the work done, less
sensitive to other load on the machine). Ratios are graphsplit / DTensor,
below 1 means graphsplit is faster (target <= 0.9): of the wall medians, and
the median of the per-round ratios (each round's two measurements are
back-to-back, so this one is the most robust to load that drifts).

It also prints step 1's loss from both (same weights, same data: they must
agree), the largest difference between their gradients (each rank's shards,
matched by parameter name), and the collectives each issues per step, counted
on step 2 (graphsplit's own: each `TPComm.counts` of its graphs; DTensor's from
`CommDebugMode`).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import socket
import statistics
import time
import warnings
from collections import Counter
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

TP = 2


class Attention(nn.Module):
    def __init__(self, dim: int, n_head: int) -> None:
        super().__init__()
        self.n_head, self.head_dim = n_head, dim // n_head
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v = self.v(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, self.n_head * self.head_dim)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, 4 * dim)
        self.proj = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, dim: int, n_head: int) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(dim), Attention(dim, n_head)
        self.ln2, self.mlp = nn.LayerNorm(dim), MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Stack(nn.Module):
    def __init__(self, dim: int, n_head: int, layers: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, n_head) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)


def build(args: argparse.Namespace) -> Stack:
    torch.manual_seed(0)
    return Stack(args.dim, args.heads, args.layers)


def data(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.seq, args.dim, generator=g)
    return x, torch.randn(args.batch, args.seq, args.dim, generator=g)


def build_dtensor(args: argparse.Namespace, prepared: bool) -> Stack:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        parallelize_module,
    )

    model = build(args)
    mesh = init_device_mesh("cpu", (TP,))
    for block in model.blocks:
        shared: dict = {}
        if prepared:  # q, k, v share one replicated DTensor input: one backward all-reduce, not three
            shared["attn"] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                                                use_local_output=False)
        parallelize_module(block, mesh, {
            **shared,
            "attn.q": ColwiseParallel(),
            "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(),
            "attn.proj": RowwiseParallel(),
            "mlp.fc": ColwiseParallel(),
            "mlp.proj": RowwiseParallel(),
        })
        block.attn.n_head = args.heads // TP  # the model edit DTensor needs: local heads
    return model


def local_grads(named: dict[str, nn.Parameter]) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in named.items():
        if p.grad is not None:
            g = p.grad
            out[name] = (g.to_local() if hasattr(g, "to_local") else g).detach().clone()
    return out


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(TP), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=TP, timeout=timedelta(seconds=120))
    from torch.distributed.tensor.debug import CommDebugMode

    from graphsplit import Plan, parallelize
    from graphsplit.ops.tp_comm import tp_comms

    x, y = data(args)
    gs = parallelize(build(args), Plan(tp=TP), example_inputs=(x,), loss_fn=mse)
    dt = build_dtensor(args, args.dtensor_plan == "prepared")
    gs_params = dict(gs.named_parameters())
    dt_params = dict(dt.named_parameters())

    def gs_step() -> torch.Tensor:
        for p in gs_params.values():
            p.grad = None
        return gs.train_step(x, target=y)

    def dt_step() -> torch.Tensor:
        for p in dt_params.values():
            p.grad = None
        loss = mse(dt(x), y)
        loss.backward()
        return loss.detach()

    # Step 1: losses and gradients of both.
    gs_loss, gs_grads = gs_step(), gs.grads()
    dt_loss, dt_grads = dt_step(), local_grads(dt_params)
    # Step 2: collectives per step (step 1 of graphsplit's schedule also runs
    # torch.distributed.pipelining's metadata inference, one more forward).
    comms = [c for stage in gs.stages.values() for c in tp_comms(stage)]
    if gs.program.loss_gm is not None:
        comms += tp_comms(gs.program.loss_gm)
    before = sum((c.counts for c in comms), Counter())
    gs_step()
    gs_counts = sum((c.counts for c in comms), Counter())
    gs_counts.subtract(before)
    with CommDebugMode() as comm, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CommDebugMode's module hooks warn on inputs without grad
        dt_step()
    dt_counts = {str(k).rsplit(".", 1)[-1]: v for k, v in comm.get_comm_counts().items()}
    diffs = [(g - dt_grads[n]).abs().max().item() for n, g in gs_grads.items()
             if n in dt_grads and g.shape == dt_grads[n].shape]
    unmatched = sorted(set(gs_grads) ^ set(dt_grads))
    unmatched += [n for n, g in gs_grads.items() if n in dt_grads and g.shape != dt_grads[n].shape]
    report = torch.tensor([max(diffs, default=float("nan")), float(len(unmatched))])
    dist.all_reduce(report, op=dist.ReduceOp.MAX)

    for _ in range(args.warmup):
        gs_step()
        dt_step()

    def timed(step) -> tuple[float, float]:
        """(wall seconds per step, slower rank; CPU seconds per step, mean of ranks)."""
        dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            step()
        dist.barrier()
        wall = torch.tensor([(time.perf_counter() - start) / args.steps])
        cpu_t = torch.tensor([(time.process_time() - cpu) / args.steps / TP])
        dist.all_reduce(wall, op=dist.ReduceOp.MAX)
        dist.all_reduce(cpu_t)
        return wall.item(), cpu_t.item()

    steps = {"graphsplit": gs_step, "dtensor": dt_step}
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    for r in range(args.rounds):
        for name in sorted(steps, reverse=r % 2 == 1):
            samples[name].append(timed(steps[name]))

    profiles = {}
    for name in steps if args.profile else ():
        profiler = cProfile.Profile()
        dist.barrier()
        profiler.enable()
        for _ in range(args.steps):
            steps[name]()
        profiler.disable()
        dist.barrier()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.profile)
        profiles[name] = text.getvalue()

    if rank == 0:
        wall = {name: statistics.median(w for w, _ in s) for name, s in samples.items()}
        cpu = {name: statistics.median(c for _, c in s) for name, s in samples.items()}
        n_params = sum(p.numel() for p in build(args).parameters())
        print(f"model: {args.layers} blocks, dim {args.dim}, {args.heads} heads, batch {args.batch}, "
              f"seq {args.seq}, {n_params / 1e6:.2f}M parameters; tp={TP} on gloo, 1 thread per rank; "
              f"dtensor plan {args.dtensor_plan}")
        print(f"step 1 loss: graphsplit {gs_loss.item():.6f}  dtensor {dt_loss.item():.6f}  "
              f"|diff| {abs(gs_loss.item() - dt_loss.item()):.2e}")
        print(f"step 1 grads: max |graphsplit - dtensor| {report[0].item():.2e} over matched shards"
              + (f"; {int(report[1].item())} unmatched on some rank, e.g. {unmatched[:3]}" if report[1] else ""))
        gs_desc = ", ".join(f"{d} {k} {v}" for (d, k), v in sorted(gs_counts.items()) if v)
        dt_desc = ", ".join(f"{k} {v}" for k, v in sorted(dt_counts.items()) if v)
        print(f"collectives per step: graphsplit {sum(gs_counts.values())} ({gs_desc}); "
              f"dtensor {sum(dt_counts.values())} ({dt_desc})")
        print(f"\n{'':12}{'ms/step':>9}{'min':>8}{'max':>8}{'/ dtensor':>11} |{'cpu ms/step':>12}{'/ dtensor':>11}")
        for name in steps:
            w = [x for x, _ in samples[name]]
            print(f"{name:12}{wall[name] * 1e3:9.2f}{min(w) * 1e3:8.2f}{max(w) * 1e3:8.2f}"
                  f"{wall[name] / wall['dtensor']:10.2f}x |{cpu[name] * 1e3:12.2f}{cpu[name] / cpu['dtensor']:10.2f}x")
        print(f"(medians of {args.rounds} interleaved rounds of {args.steps} steps after {args.warmup} warm-up; "
              f"ms: wall clock of the slower rank, cpu: process CPU time, mean of ranks)")
        paired = statistics.median(g[0] / d[0] for g, d in zip(samples["graphsplit"], samples["dtensor"]))
        print(f"ratio graphsplit / dtensor: {wall['graphsplit'] / wall['dtensor']:.2f} (target <= 0.9); "
              f"median of the per-round ratios {paired:.2f}")
        for name, text in profiles.items():
            print(f"\ncProfile of {args.steps} {name} steps on rank 0 (by own time):\n{text.rstrip()}")
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps of each before timing")
    p.add_argument("--steps", type=int, default=5, help="steps per timed round")
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds; the median is reported")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="cProfile --steps steps of each on rank 0; print the top N functions by own time")
    p.add_argument("--dtensor-plan", choices=("basic", "prepared"), default="basic",
                   help="basic: the Colwise/Rowwise plan alone (3 backward all-reduces per attention); "
                   "prepared: also PrepareModuleInput on attn so q/k/v share one (1 per attention)")
    args = p.parse_args()
    if args.dim % args.heads or args.heads % TP:
        p.error(f"--dim must be divisible by --heads, and --heads by tp={TP}")
    mp.spawn(worker, args=(args, free_port()), nprocs=TP, join=True)


if __name__ == "__main__":
    main()
