"""A Fabric training loop (Lightning's own kind: setup, setup_dataloaders, backward with accumulation,
clip_gradients, save) on the GPT example, under GraphsplitFabricStrategy or, as the reference, Fabric's
default strategy on one device. The one line that differs: the reference computes `loss_fn(model(x), y)`,
the pipelined model's call returns that loss (`model(x, target=y)`). Rank 0 saves its losses and (reference)
its weights. Run by tests/test_lightning.py as a script (Fabric's launcher starts the other processes).

    python tests/workers/fabric_loop.py --pp 2 --tp 1 --dp 1 --out DIR
    python tests/workers/fabric_loop.py --reference --out DIR
"""

import argparse
import sys
from pathlib import Path

import lightning as L
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import gpt  # noqa: E402

STEPS, ACCUMULATE, GLOBAL_BATCH = 3, 2, 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.reference:
        fabric, per_replica = L.Fabric(accelerator="cpu", devices=1), GLOBAL_BATCH
    else:
        from graphsplit.lightning import GraphsplitFabricStrategy

        strategy = GraphsplitFabricStrategy(pp=args.pp, tp=args.tp, loss_fn=gpt.loss_fn)
        fabric = L.Fabric(accelerator="cpu", devices=args.dp * args.pp * args.tp, strategy=strategy)
        per_replica = GLOBAL_BATCH // args.dp
    fabric.launch()
    fabric.seed_everything(0)
    model = gpt.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    g = torch.Generator().manual_seed(5)
    idx = torch.randint(0, gpt.GPTConfig.vocab_size, (GLOBAL_BATCH * ACCUMULATE * STEPS, gpt.GPTConfig.block_size), generator=g)
    data = torch.utils.data.TensorDataset(idx, torch.roll(idx, -1, dims=1))
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(data, batch_size=per_replica))
    losses, norms = [], []
    for i, (x, y) in enumerate(loader):
        loss = gpt.loss_fn(model(x), y) if args.reference else model(x, target=y)
        fabric.backward(loss / ACCUMULATE)
        losses.append(loss.item())
        if (i + 1) % ACCUMULATE == 0:
            norms.append(float(fabric.clip_gradients(model, optimizer, max_norm=0.5)))
            optimizer.step()
            optimizer.zero_grad()
    with torch.no_grad():  # a validation loss after training
        share = fabric.global_rank // (args.pp * args.tp) * per_replica  # each replica its share, in order
        x, y = data[:GLOBAL_BATCH] if args.reference else data[share:share + per_replica]
        val = float(gpt.loss_fn(model(x), y) if args.reference else model(x, target=y))
    fabric.save(args.out / "ckpt", {"model": model, "optimizer": optimizer, "step": STEPS})
    state = {"model": model, "optimizer": optimizer, "step": 0}
    fabric.load(args.out / "ckpt", state)  # read back: the loop's own values restored in place
    if fabric.global_rank == 0:
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()} if args.reference else None
        torch.save({"losses": losses, "norms": norms, "val": val, "weights": weights, "step": state["step"]},
                   args.out / "seen.pt")


if __name__ == "__main__":
    main()
