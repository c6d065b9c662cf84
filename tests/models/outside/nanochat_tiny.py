"""karpathy/nanochat's nanochat/gpt.py (nanochat/, unchanged, with the modules it imports) at a tiny
config, built and initialized as its training script does (`GPT(config)`, `init_weights()`), and
trained on its own loss: `model(x, y)` returns the mean cross-entropy. ModuleDict layers and value
embeddings, x0 and scaled residuals, a smear gate, a mid-layer backout, QK-norm, sliding windows,
logit soft-capping, an untied head over a padded vocabulary."""

import torch
from nanochat.gpt import GPT, GPTConfig

VOCAB, BATCH, SEQ = 96, 4, 16


def build_model():
    torch.manual_seed(0)
    model = GPT(GPTConfig(sequence_len=32, vocab_size=VOCAB, n_layer=4, n_head=4, n_kv_head=2, n_embd=32))
    model.init_weights()
    return model


def example_inputs():
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return {"idx": data[:, :-1].clone(), "targets": data[:, 1:].clone()}  # contiguous, as a loader stacks them
