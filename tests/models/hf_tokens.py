"""What the tiny HF causal-LM model files share: a batch of token ids, a target of token ids, and the
cross-entropy over the logits an HF model returns."""

import torch
import torch.nn.functional as F

VOCAB = 64
BATCH, SEQ = 4, 8


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)}


def example_target():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def loss_fn(output, target):
    logits = output.logits if hasattr(output, "logits") else output[0]
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())
