"""What FSDP2 and DDP move through memory beside the model's ops, counted on a real 2-rank gloo group:
rank 0 prints one `case op bytes count` line per op kind and case. The cases are the program's (as
backends/parallelize.py wraps its stages and as torch's pipelining stage and `LocalPipeline` drive them),
two micro-batches each:

- `fsdp3`, `fsdp2`: one stage, a unit per block and the root, bf16 gathers with fp32 reduction, each
  micro-batch's gradients reduce-scattered (ZeRO-3 resharding after forward, ZeRO-2 not);
- `fsdp_nosync`: the same under a pipeline stage, gradients kept unsharded until the last backward
  (`set_requires_gradient_sync(False)` before it, as torch's stage does);
- `ddp`: DDP with `no_sync` on the first micro-batch, fp32.

Counted: FSDP's copy-out (`fsdp.split_with_sizes_copy`, its outputs, read and written), its copy-in
(`fsdp.chunk_cat`, inputs read and output written), gradient accumulation (`add_`, two read and one
written), a gradient's upcast to fp32 (`_to_copy` of a parameter-sized bf16 tensor), and DDP's bucket
copies (`copy_` and `mul.out` of parameter-sized tensors). tests/test_grad_traffic.py holds
planner/grad_traffic.py to them.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import gc
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode

# every parameter's element count differs from every other's half (a gradient's shard), and from a micro-batch's
# output's (12 x 48)
WIDTH, BLOCKS, ROWS = 48, 2, 24


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(3 * WIDTH, WIDTH))
                                    for _ in range(BLOCKS))
        self.head = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x) + x
        return self.head(x)


class Bytes(TorchDispatchMode):
    """Bytes and calls of the ops FSDP and DDP run beside the model's, by kind."""

    def __init__(self, param_sizes: set[int]) -> None:
        super().__init__()
        self.sizes = param_sizes
        self.seen: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])

    def note(self, kind: str, nbytes: int) -> None:
        self.seen[kind][0] += nbytes
        self.seen[kind][1] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func.overloadpacket).split(".")[-1]
        size = lambda t: t.numel() * t.element_size()  # noqa: E731
        if func is torch.ops.fsdp.split_with_sizes_copy.default:
            self.note("copy_out", 2 * sum(size(t) for t in kwargs["out"]))
        elif func is torch.ops.fsdp.chunk_cat.default:
            self.note("copy_in", sum(size(t) for t in args[0]) + size(kwargs["out"]))
        elif name == "add_" and args[0].numel() in self.sizes and args[0].is_floating_point():
            self.note("accumulate", 2 * size(args[0]) + size(args[1]))
        elif name == "_to_copy" and args[0].dtype == torch.bfloat16 and kwargs.get("dtype") == torch.float32 \
                and args[0].numel() in self.sizes:
            self.note("upcast", size(args[0]) + 4 * args[0].numel())
        elif name in ("copy_", "mul") and isinstance(args[0], torch.Tensor) and args[0].numel() in self.sizes \
                and args[0].is_floating_point() and (name == "copy_" or "out" in kwargs):
            self.note("bucket", size(args[0]) + size(args[1] if name == "copy_" else out))
        return out


def run(case: str, rank: int) -> dict[str, list[int]]:
    torch.manual_seed(0)
    model = Model()
    sizes = {p.numel() for p in model.parameters()}  # a whole gradient's elements (FSDP: unsharded)
    low = case.startswith("fsdp")
    if low:
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                      cast_forward_inputs=False)
        reshard = case == "fsdp3"
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, mp_policy=policy)  # the stage: apply_fsdp's root
        step_model: nn.Module = model
    else:
        step_model = DistributedDataParallel(model, broadcast_buffers=False)
    counting = Bytes(sizes)
    x = torch.randn(2, ROWS // 2, WIDTH, dtype=torch.bfloat16 if low else torch.float32)
    with counting:
        for i in range(2):
            last = i == 1
            if case == "fsdp2":  # LocalPipeline's keep_gathered: gathered from the first forward to the last backward
                model.set_reshard_after_backward(last)
            if case == "fsdp_nosync":  # as torch's pipeline stage runs each backward
                model.set_is_last_backward(last)
                model.set_requires_gradient_sync(last)
                model.set_reshard_after_backward(last)
            skip = step_model.no_sync() if case == "ddp" and not last else contextlib.nullcontext()
            with skip:
                step_model(x[i]).float().sum().backward()
    return dict(counting.seen)


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        for case in sys.argv[1:]:
            seen = run(case, rank)
            if rank == 0:
                for kind, (nbytes, count) in sorted(seen.items()):
                    print(case, kind, nbytes, count, flush=True)
    finally:
        gc.collect()  # the DDP reducers and FSDP states go before their process group does
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
