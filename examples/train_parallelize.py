"""graphsplit from Python, inside torchrun: this rank builds its pipeline stage and trains.

    torchrun --standalone --nproc-per-node 2 examples/train_parallelize.py --pp 2 --steps 5
    torchrun --standalone --nproc-per-node 4 examples/train_parallelize.py --pp 2 --tp 2
    torchrun --standalone --nproc-per-node 8 examples/train_parallelize.py --dp 2 --pp 2 --tp 2
    torchrun --standalone --nproc-per-node 8 examples/train_parallelize.py --dp 2 --pp 2 --tp 2 --fsdp --save ckpt
    torchrun --standalone --nproc-per-node 4 examples/train_parallelize.py --pp 2 --tp 2 --resume ckpt

Every rank builds the model the same way (same seed); `parallelize` keeps only
this rank's stages. `--dump DIR` saves step 1's gradients per rank (tests use it).
"""

import argparse
import importlib.util
import os
from pathlib import Path

import torch
import torch.distributed as dist

from graphsplit import Plan, parallelize


def load_example(name: str):
    path = Path(__file__).resolve().parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt")
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--fsdp", action="store_true", help="shard parameters over the dp replicas (FSDP2)")
    parser.add_argument("--zero", type=int, default=None, help="1: AdamW's states sharded over the dp replicas")
    parser.add_argument("--fp8", default=None, help="tensorwise or rowwise: the linears in float8 (torchao)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dump", type=Path, default=None)
    parser.add_argument("--save", type=Path, default=None, help="checkpoint folder to write after the last step")
    parser.add_argument("--resume", type=Path, default=None, help="checkpoint folder (any plan) to start from")
    args = parser.parse_args()

    example = load_example(args.model)
    torch.manual_seed(0)
    model = example.build_model()
    inputs, target = example.example_inputs(), example.example_target()
    plan = Plan(dp=args.dp, pp=args.pp, tp=args.tp, fsdp=args.fsdp, zero=args.zero, fp8=args.fp8)
    if args.dp > 1:  # like DDP: each replica trains on its own share of the batch
        dp_rank = int(os.environ["RANK"]) // (args.pp * args.tp)  # the mesh is (dp, pp, tp)
        inputs = tuple(t.chunk(args.dp)[dp_rank] for t in inputs)
        target = target.chunk(args.dp)[dp_rank]

    module = parallelize(model, plan, example_inputs=inputs, loss_fn=example.loss_fn, example_target=target)
    optimizer = module.make_optimizer(torch.optim.AdamW, lr=1e-3)  # under zero=1 its states sharded over dp
    done = module.load_checkpoint(args.resume, optimizer) if args.resume else 0
    losses = []
    for step in range(done + 1, done + args.steps + 1):
        loss = module.train_step(*inputs, target=target)
        if step == done + 1 and args.dump is not None:
            # elements this rank stores vs its tp shards' whole size (FSDP keeps 1/dp of them)
            held = sum(getattr(p, "to_local", lambda p=p: p)().numel() for p in module.parameters())
            whole = sum(p.numel() for p in module.parameters())
            torch.save({"grads": module.grads(), "loss": loss, "tp_rank": module.tp_rank, "held": held, "whole": whole},
                       args.dump / f"rank{dist.get_rank()}.pt")
        losses.append(loss)
        module.optimizer_step(optimizer)  # optimizer.step(), through the loss scaler under fp16
        optimizer.zero_grad(set_to_none=True)
        if dist.get_rank() == 0:  # every rank holds the loss: one prints it
            print(f"step {step} loss {loss.item():.6f}", flush=True)
    if args.save is not None:  # every rank writes its blocks, under the original parameter names
        module.save_checkpoint(args.save, optimizer, step=done + args.steps)
    if args.dump is not None and dist.get_rank() == 0:
        torch.save([float(x) for x in losses], args.dump / f"losses{dist.get_rank()}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
