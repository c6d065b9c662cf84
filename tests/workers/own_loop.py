"""A training loop written as for DDP, on `parallelize()`: run by tests/test_own_script.py under torchrun.

Each rank seeds itself (`100 + rank`) and builds its own GPT (examples/gpt.py), as a DDP script does; only
each replica's first rank is given the replica's batch, the others garbage of the same shape. The loop
builds SGD in two groups over the untouched model (matrices at one lr, the rest at another), hands it to
`parallelize`, evaluates, accumulates two batches at `scale=0.5`, clips and steps; this rank's losses,
gradients, norm and weights are saved for the test to compare with the untouched model.

    torchrun --nproc-per-node 4 tests/workers/own_loop.py --pp 2 --tp 2 --out DIR
"""

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import gpt  # noqa: E402

from graphsplit import Plan, parallelize  # noqa: E402

LR_MATRICES, LR_OTHERS = 0.1, 0.05


def batches(dp: int, dp_rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Two whole batches of 8 (the same on every rank), this replica's share of each."""
    g = torch.Generator().manual_seed(7)
    vocab, block = gpt.GPTConfig.vocab_size, gpt.GPTConfig.block_size
    whole = [(torch.randint(0, vocab, (8, block), generator=g), torch.randint(0, vocab, (8, block), generator=g))
             for _ in range(2)]
    return [(x.chunk(dp)[dp_rank], y.chunk(dp)[dp_rank]) for x, y in whole]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    torch.manual_seed(100 + rank)  # each rank its own model and its own draws
    model = gpt.build_model()
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.SGD([{"params": matrices, "lr": LR_MATRICES}, {"params": others, "lr": LR_OTHERS}])

    replica_size = args.pp * args.tp
    mine = batches(args.dp, rank // replica_size)  # the mesh is (dp, pp, tp)
    if rank % replica_size:  # not the replica's first rank: what it is given must not matter
        mine = [(torch.randint_like(x, gpt.GPTConfig.vocab_size), torch.randint_like(y, gpt.GPTConfig.vocab_size))
                for x, y in mine]

    module = parallelize(model, Plan(dp=args.dp, pp=args.pp, tp=args.tp, fsdp=args.fsdp), loss_fn=gpt.loss_fn, optimizer=optimizer)
    evaluated = module.evaluate(mine[0][0], target=mine[0][1])  # builds the model on this batch
    losses = [module.train_step(x, target=y, scale=0.5) for x, y in mine]
    grads = module.grads()
    norm = module.clip_grad_norm_(float("inf"))
    optimizer.step()
    torch.save({"tp_rank": module.tp_rank, "eval": evaluated, "losses": losses, "grads": grads, "norm": norm,
                "weights": module.pipeline.weights(), "groups": [len(g["params"]) for g in optimizer.param_groups]},
               args.out / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
