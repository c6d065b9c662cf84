"""Under torchrun: for each plan given, build this rank's part of a model with parallelize(), train one
AdamW step, and record the bytes this rank holds: parameters, gradients, optimizer state (what the
planner predicts exactly). One JSON file per rank in OUT.

    python -m torch.distributed.run --nproc-per-node W tests/workers/measure_memory.py MODEL OUT PLAN.json...
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from graphsplit import Plan, parallelize
from graphsplit.loader import load_model
from graphsplit.runtime.microbatch import split_microbatches


def local_bytes(t: torch.Tensor) -> int:
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def main() -> None:
    model_path, out = sys.argv[1], Path(sys.argv[2])
    plans = [Plan.from_json(text) for text in sys.argv[3:]]
    loaded = load_model(model_path)
    found = []
    for plan in plans:
        model = loaded.build("cpu", seed=0)
        rank = int(os.environ["RANK"])
        dp_rank = rank // (plan.pp * plan.tp)  # the mesh is (dp, pp, tp)
        inputs = split_microbatches(loaded.args, plan.dp)[dp_rank]
        target = split_microbatches(loaded.target, plan.dp)[dp_rank]
        module = parallelize(model, plan, example_inputs=inputs, loss_fn=loaded.loss_fn, example_target=target)
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
        module.train_step(*inputs, target=target)
        grads = sum(local_bytes(p.grad) for p in module.parameters() if p.grad is not None)
        module.optimizer_step(optimizer)
        found.append({
            "pp_rank": (rank // plan.tp) % plan.pp, "dp_rank": dp_rank,
            "parameters": sum(local_bytes(p) for p in module.parameters()),
            "gradients": grads,
            "optimizer_state": sum(local_bytes(t) for s in optimizer.state.values() for t in s.values()
                                   if isinstance(t, torch.Tensor) and t.dim()),
        })
        dist.barrier()
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(found))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
