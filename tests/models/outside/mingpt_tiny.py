"""karpathy/minGPT's mingpt/model.py (mingpt/, unchanged) at a tiny config, trained as its trainer.py
does: `logits, self.loss = model(x, y)`; explicit causal-mask buffer, its default dropout 0.1
(random ops: embedding, attention and residual dropout)."""

import torch
from mingpt.model import GPT

VOCAB, BATCH, SEQ = 96, 4, 16


def build_model():
    torch.manual_seed(0)
    config = GPT.get_default_config()
    config.model_type = None
    config.n_layer, config.n_head, config.n_embd = 4, 4, 32
    config.vocab_size, config.block_size = VOCAB, 32
    return GPT(config)


def example_inputs():
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return {"idx": data[:, :-1].clone(), "targets": data[:, 1:].clone()}  # contiguous, as a loader stacks them
