"""Under torchrun (bench/planner.py starts it): time training steps of each plan given, on this world.

    python -m torch.distributed.run --nproc-per-node W bench/planner_worker.py MODEL OUT.json STEPS PLAN.json...

For each plan: parallelize() this rank's part, 2 warm-up steps, then STEPS timed steps (forward,
backward, AdamW), each between barriers; the step time is the median over steps of the slowest rank.
"""

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from graphsplit import Plan, parallelize
from graphsplit.loader import load_model
from graphsplit.runtime.microbatch import split_microbatches


def main() -> None:
    model_path, out, steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    plans = [Plan.from_json(text) for text in sys.argv[4:]]
    torch.set_num_threads(1)
    loaded = load_model(model_path)
    results = []
    for plan in plans:
        rank = int(os.environ["RANK"])
        dp_rank = rank // (plan.pp * plan.tp)
        inputs = split_microbatches(loaded.args, plan.dp)[dp_rank]
        target = split_microbatches(loaded.target, plan.dp)[dp_rank] if loaded.target is not None else None
        module = parallelize(loaded.build("cpu", seed=0), plan, example_inputs=inputs, loss_fn=loaded.loss_fn,
                             example_target=target)
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
        times = []
        for i in range(2 + steps):
            dist.barrier()
            start = time.perf_counter()
            module.train_step(*inputs, target=target)
            module.optimizer_step(optimizer)
            optimizer.zero_grad(set_to_none=True)
            dist.barrier()
            if i >= 2:
                times.append(time.perf_counter() - start)
        slowest = [0.0] * dist.get_world_size()
        dist.all_gather_object(slowest, statistics.median(times))
        results.append(max(slowest))
        del module, optimizer
    if dist.get_rank() == 0:
        out.write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
