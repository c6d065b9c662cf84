"""Lightning's Trainer fitting tests/models/lightning_gpt.py, under GraphsplitStrategy or Lightning's default
strategy on one device (the reference); run by tests/test_lightning.py as a script (Lightning's launcher
starts the other processes). Rank 0 saves what it saw: each training step's loss, the logged train and
val losses, the learning rates, and (default strategy) the trained weights.

    python tests/workers/lightning_fit.py --pp 2 --tp 1 --dp 1 --steps 4 --out DIR [--save CKPT] [--resume CKPT]
    python tests/workers/lightning_fit.py --reference --steps 4 --out DIR [--batch 8]
    python tests/workers/lightning_fit.py --auto --devices 4 --batch 4 --steps 4 --out DIR

`--auto`: GraphsplitStrategy(plan="auto", compile=False) on `--devices` processes, each replica reading
batches of `--batch`; rank 0 also saves the plan it chose (the reference then trains on `--batch` x dp).
"""

import argparse
import sys
from pathlib import Path

import lightning as L
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "models"))

from lightning_gpt import LightningGPT, dataset  # noqa: E402

GLOBAL_BATCH = 8


class Seen(L.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []
        self.logged: list[float] = []
        self.val: list[float] = []
        self.lrs: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))
        self.logged.append(float(trainer.callback_metrics["train_loss"]))
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    def on_validation_end(self, trainer, pl_module):
        if "val_loss" in trainer.callback_metrics:
            self.val.append(float(trainer.callback_metrics["val_loss"]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--save", type=Path, default=None)
    parser.add_argument("--resume", type=Path, default=None)
    parser.add_argument("--auto", action="store_true")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--batch", type=int, default=None)
    args = parser.parse_args()

    L.seed_everything(0)
    module = LightningGPT()
    if args.reference:
        strategy, devices, per_replica = "auto", 1, args.batch or GLOBAL_BATCH
    elif args.auto:
        from graphsplit.lightning import GraphsplitStrategy

        # torch.compile's stages would compile C++ for minutes on this CPU: the planner chooses the rest
        strategy, devices, per_replica = GraphsplitStrategy(plan="auto", compile=False), args.devices, args.batch
    else:
        from graphsplit.lightning import GraphsplitStrategy

        strategy, devices = GraphsplitStrategy(pp=args.pp, tp=args.tp), args.dp * args.pp * args.tp
        per_replica = GLOBAL_BATCH // args.dp  # Lightning's sampler gives each replica its share
    data = dataset(32)  # 2 steps an epoch
    # Lightning gives a distributed strategy's replicas a DistributedSampler, shuffled with the global seed;
    # the reference reads the same permutation whole (each replica's k-th batch is a share of its k-th)
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0) \
        if args.reference else None
    loader = torch.utils.data.DataLoader(data, batch_size=per_replica, sampler=sampler)
    val_loader = torch.utils.data.DataLoader(data, batch_size=per_replica)  # in order (Lightning: not shuffled)
    seen = Seen()
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_steps=args.steps,
                        accumulate_grad_batches=2, gradient_clip_val=0.5, val_check_interval=2,
                        limit_val_batches=2, num_sanity_val_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[seen])
    trainer.fit(module, loader, val_loader, ckpt_path=args.resume)
    if args.save is not None:
        trainer.save_checkpoint(args.save)
    if trainer.global_rank == 0:
        weights = {k: v.detach().clone() for k, v in module.state_dict().items()} if args.reference else None
        plan = getattr(trainer.strategy, "plan", None)
        torch.save({"losses": seen.losses, "logged": seen.logged, "val": seen.val, "lrs": seen.lrs,
                    "weights": weights, "plan": None if plan is None else plan.to_dict()}, args.out / "seen.pt")


if __name__ == "__main__":
    main()
