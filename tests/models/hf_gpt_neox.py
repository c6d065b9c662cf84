"""HuggingFace transformers' GPTNeoXForCausalLM with its parallel residual
(`x + attn(ln1(x)) + mlp(ln2(x))`), as is, from a small config (no download).

    graphsplit run tests/models/hf_gpt_neox.py --tp 2 --steps 2 --check
"""

import torch
import torch.nn.functional as F
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

VOCAB = 128
BATCH, SEQ = 2, 8


def build_model():
    torch.manual_seed(0)
    config = GPTNeoXConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=VOCAB, max_position_embeddings=32, use_parallel_residual=True, rotary_pct=0.5,
        hidden_dropout=0.0, attention_dropout=0.0, use_cache=False, return_dict=True, attn_implementation="sdpa",
    )
    return GPTNeoXForCausalLM(config)


def example_inputs():
    return {"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))}


def example_target():
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))


def loss_fn(output, target):
    logits = output.logits if hasattr(output, "logits") else output[0]
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())
