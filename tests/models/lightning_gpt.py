"""A small GPT as a LightningModule, written as Lightning's examples write one: the network in
`self.model`, `training_step` computing the cross-entropy of `self(idx)` and logging it, the same
loss in `validation_step`, SGD with a step LR schedule from `configure_optimizers`. Nothing in it
is written for graphsplit (tests/test_lightning.py trains it under GraphsplitStrategy)."""

import sys
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from gpt import GPT, GPTConfig  # noqa: E402


class LightningGPT(L.LightningModule):
    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = GPT(GPTConfig())

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def training_step(self, batch, batch_idx):
        idx, targets = batch
        logits = self(idx)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        idx, targets = batch
        logits = self(idx)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        self.log("val_loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def dataset(n: int = 64) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, GPTConfig.vocab_size, (n, GPTConfig.block_size), generator=g)
    return torch.utils.data.TensorDataset(idx, torch.roll(idx, -1, dims=1))
