"""karpathy/nanoGPT's model.py (nanogpt/, unchanged) at a tiny config, trained as its train.py does:
`logits, loss = model(X, Y)`: the model computes its own loss (ignore_index=-1), a tied LM head,
a Python assert on the sequence length, ModuleDict of layers."""

import torch
from nanogpt.model import GPT, GPTConfig

VOCAB, BATCH, SEQ = 96, 4, 16


def build_model():
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=32, vocab_size=VOCAB, n_layer=4, n_head=4, n_embd=32, dropout=0.0, bias=True))


def example_inputs():
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return {"idx": data[:, :-1].clone(), "targets": data[:, 1:].clone()}  # contiguous, as a loader stacks them
