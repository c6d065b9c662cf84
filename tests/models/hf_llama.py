"""HuggingFace transformers' LlamaForCausalLM, as is, from a small config (no download).

    graphsplit run tests/models/hf_llama.py --tp 2 --steps 2 --check

HF_ATTN selects the attention implementation ("sdpa" or "eager").
"""

import os

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 256
BATCH, SEQ = 4, 16
ATTN = os.environ.get("HF_ATTN", "sdpa")


def build_model():
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
        attention_dropout=0.0, use_cache=False, return_dict=True, attn_implementation=ATTN,
    )
    return LlamaForCausalLM(config)


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)}


def example_target():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def loss_fn(output, target):
    logits = output.logits if hasattr(output, "logits") else output[0]
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())
