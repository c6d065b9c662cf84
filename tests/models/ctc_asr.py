"""A small speech model trained with CTC as speech and OCR recipes train one: a strided conv front end and
a linear head over characters, the loss in `loss_fn` from labels padded with -100 (HF's
DataCollatorCTCWithPadding), the targets concatenated by a boolean mask's selection and the lengths
counted from it, as HF's CTC heads and torchaudio's recipes compute it (`F.ctc_loss`, mean over samples
of each one's loss over its length). Written for tests/test_ctc.py; wav2vec2 in the outside zoo is the
unchanged one."""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, BATCH, SAMPLES, LABELS = 12, 8, 64, 6


class TinyASR(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, dim, kernel_size=5, stride=2)
        self.mix = nn.Linear(dim, 4 * dim)
        self.head = nn.Linear(4 * dim, VOCAB)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.conv(audio.unsqueeze(1))).transpose(1, 2)  # (batch, frames, dim)
        return self.head(F.gelu(self.mix(h)))  # (batch, frames, vocab)


def build_model():
    return TinyASR()


def example_inputs():
    return (torch.randn(BATCH, SAMPLES, generator=torch.Generator().manual_seed(1)),)


def example_target():
    g = torch.Generator().manual_seed(2)
    labels = torch.randint(1, VOCAB, (BATCH, LABELS), generator=g)
    lengths = torch.randint(2, LABELS + 1, (BATCH,), generator=g)
    return torch.where(torch.arange(LABELS) < lengths[:, None], labels, -100)


def loss_fn(logits, labels):
    mask = labels >= 0
    log_probs = logits.log_softmax(-1).transpose(0, 1)  # (frames, batch, vocab)
    frames = torch.full((logits.shape[0],), logits.shape[1], dtype=torch.long)
    return F.ctc_loss(log_probs, labels.masked_select(mask), frames, mask.sum(-1), blank=0, reduction="mean")
