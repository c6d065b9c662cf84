"""HuggingFace transformers' GPT2LMHeadModel, as is, from a small config (no download).

    graphsplit run tests/models/hf_gpt2.py --tp 2 --steps 2 --check

HF_ATTN selects the attention implementation ("sdpa" or "eager").
"""

import os

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB = 256
BATCH, SEQ = 4, 16
ATTN = os.environ.get("HF_ATTN", "sdpa")


def build_model(vocab=VOCAB):
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=vocab, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=vocab - 1, eos_token_id=vocab - 1,
        use_cache=False, return_dict=True, attn_implementation=ATTN,
    )
    return GPT2LMHeadModel(config)


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)}


def example_target():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def loss_fn(output, target):
    logits = output.logits if hasattr(output, "logits") else output[0]
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())
