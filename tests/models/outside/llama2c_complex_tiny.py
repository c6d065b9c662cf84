"""karpathy/llama2.c's model.py as it was on 2023-07-25 (llama2c_complex/, unchanged), before its
RoPE table was split into real cos/sin tables for ONNX export: `freqs_cis` is a complex64 buffer
(torch.polar), the rotation multiplies view_as_complex'd queries and keys by it. Its forward
returns (logits, loss) when given targets: graphsplit trains on that loss. Dropout on."""

import torch
from llama2c_complex.model import ModelArgs, Transformer

VOCAB, BATCH, SEQ = 96, 4, 16


def build_model():
    torch.manual_seed(0)
    return Transformer(ModelArgs(dim=32, n_layers=4, n_heads=4, vocab_size=VOCAB,
                                 multiple_of=16, max_seq_len=32, dropout=0.1))


def example_inputs():
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return {"tokens": data[:, :-1].clone(), "targets": data[:, 1:].clone()}
