"""karpathy/llama2.c's model.py (llama2c/, unchanged) at a tiny config. Its train.py reads the loss
from an attribute (`model(X, Y)` sets `model.last_loss`), which no traced program can return, so
this file computes the same cross-entropy on the logits `model(X, Y)` returns. GQA, RoPE tables as
buffers, SwiGLU, RMSNorm, a tied output head."""

import torch
import torch.nn.functional as F
from llama2c.model import ModelArgs, Transformer

VOCAB, BATCH, SEQ = 96, 4, 16


def build_model():
    torch.manual_seed(0)
    return Transformer(ModelArgs(dim=32, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=VOCAB,
                                 multiple_of=16, max_seq_len=32, dropout=0.0))


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)


def example_inputs():
    data = _data()
    return {"tokens": data[:, :-1].clone(), "targets": data[:, 1:].clone()}


def example_target():
    return _data()[:, 1:].clone()


def loss_fn(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=-1)
