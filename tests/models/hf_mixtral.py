"""HuggingFace transformers' MixtralForCausalLM (sparse mixture of experts, top-2 routing),
as is, from a tiny config (no download).

    graphsplit run tests/models/hf_mixtral.py --tp 2 --pp 2 --check
"""

import torch
import torch.nn.functional as F
from transformers import MixtralConfig, MixtralForCausalLM

VOCAB = 64
BATCH, SEQ = 4, 8


def build_model():
    torch.manual_seed(0)
    config = MixtralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=64, attention_dropout=0.0, use_cache=False, return_dict=True,
        router_aux_loss_coef=0.0,
    )
    return MixtralForCausalLM(config)


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)}


def example_target():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def loss_fn(output, target):
    logits = output.logits if hasattr(output, "logits") else output[0]
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())
