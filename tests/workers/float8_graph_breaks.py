"""torch.compile of one float8 linear of each tp style, and of the float8 gather and the float8 row linear's reduce-scatter, on a real 2-rank tp group
whose shards scale differently: rank 0 prints `name breaks error` lines, the graph breaks dynamo makes
and the largest difference of the outputs and gradients from the eager run's. `ring_gather` and
`ring_reduce_scatter`: their --async-tp rings, eager ops (a graph break each) whose casts are compiled
kernels (`compiled=True`, as the program runs them under --compile), against the rings with torchao's
eager casts."""

import datetime
import operator

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn

from graphsplit.ops import float8
from graphsplit.ops.float8_gather import float8_gathered_linears, float8_linear_reduce_scatter
from graphsplit.ops.float8_ring import (
    ring_float8_gathered_linears,
    ring_float8_linear_reduce_scatter,
)
from graphsplit.ops.tp_comm import TPComm, bind_tp_group


def module(name: str, rank: int, compiled: bool = True) -> fx.GraphModule:
    graph = fx.Graph()
    x = graph.placeholder("x")
    comm = None if name == "replicated" else graph.get_attr("comm")
    ring = {"compiled": compiled} if name.startswith("ring_") else {}
    if ring:  # compiled code on both sides of the eager ring: one graph break between two graphs
        x = graph.call_function(operator.mul, (x, 2.0))
    if name.endswith("gather"):
        op = ring_float8_gathered_linears if ring else float8_gathered_linears
        outs = graph.call_function(op, (x, (graph.get_attr("w"), graph.get_attr("v")), (graph.get_attr("b"), None), 1,
                                        comm, "tensorwise"), ring)
        graph.output(tuple(graph.call_function(operator.mul, (graph.call_function(operator.getitem, (outs, i)), 1.5))
                           for i in range(2)))
    elif name.endswith("reduce_scatter"):
        op = ring_float8_linear_reduce_scatter if ring else float8_linear_reduce_scatter
        out = graph.call_function(op, (x, graph.get_attr("w"), graph.get_attr("b"), 1, comm, "tensorwise"), ring)
        graph.output(graph.call_function(operator.mul, (out, 1.5)))
    else:
        graph.output(graph.call_function(float8.float8_linear, (x, graph.get_attr("w"), graph.get_attr("b"), comm,
                                                                "tensorwise", name)))
    root = nn.Module()
    g = torch.Generator().manual_seed(rank)
    root.w = nn.Parameter(torch.randn(32, 64, generator=g) * (1 + 7 * rank))
    root.v = nn.Parameter(torch.randn(16, 64, generator=g))
    root.b = nn.Parameter(torch.randn(32, generator=g))
    root.comm = TPComm(2)
    gm = fx.GraphModule(root, graph)
    bind_tp_group(gm, dist.group.WORLD)
    float8.prime(gm)
    return gm


def step(fn, gm: fx.GraphModule, x: torch.Tensor) -> list[torch.Tensor]:
    for t in [*gm.parameters(), x]:
        t.grad = None
    out = fn(x)
    outs = out if isinstance(out, tuple) else (out,)
    sum(o.sum() * (i + 1) for i, o in enumerate(outs)).backward()
    return [o.detach() for o in outs] + [t.grad.clone() for t in [x, *gm.parameters()] if t.grad is not None]


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    lines = []
    for name in ("column", "row", "replicated", "gather", "reduce_scatter", "ring_gather", "ring_reduce_scatter"):
        gm = module(name, rank)
        x = (torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(10 + rank)) * (1 + 3 * rank)).requires_grad_(True)
        plain = module(name, rank, compiled=False) if name.startswith("ring_") else gm  # torchao's eager casts
        eager = step(plain, plain, x)
        torch._dynamo.reset()
        breaks = torch._dynamo.explain(gm)(x).graph_break_count
        torch._dynamo.reset()
        compiled = step(torch.compile(gm), gm, x)
        error = max(float((a - b).abs().max()) for a, b in zip(eager, compiled))
        lines.append(f"{name} {breaks} {error}")
    if rank == 0:
        print("\n".join(lines))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
