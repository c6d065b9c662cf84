"""HF GPT2LMHeadModel with GPT-2's real vocabulary, 50257 tokens (a prime: no tp > 1 divides it),
its LM head tied to the embedding, at a tiny width. Token ids span the whole vocabulary, so every
tp rank's rows are looked up and every rank's logits hold targets.

    graphsplit run tests/models/hf_gpt2_vocab.py --tp 2 --steps 2 --check
"""

import hf_gpt2
import torch

VOCAB = 50257
BATCH, SEQ = 2, 16
loss_fn = hf_gpt2.loss_fn


def build_model():
    return hf_gpt2.build_model(VOCAB)


def _ids(seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    ids[0, :2] = torch.tensor([0, VOCAB - 1])  # the first and the last token: the first and the last rank
    return ids


def example_inputs():
    return {"input_ids": _ids(0)}


def example_target():
    return _ids(1)
