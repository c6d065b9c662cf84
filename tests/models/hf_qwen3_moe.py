"""HuggingFace transformers' Qwen3MoeForCausalLM (sparse mixture of experts, top-2 routing),
as is, from a tiny config (no download).

    graphsplit run tests/models/hf_qwen3_moe.py --tp 2 --pp 2 --check
"""

import sys
from pathlib import Path

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_tokens import VOCAB, example_inputs, example_target, loss_fn  # noqa: E402, F401


def build_model():
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_experts=4, moe_intermediate_size=32, head_dim=8, num_experts_per_tok=2,
        max_position_embeddings=64, attention_dropout=0.0, use_cache=False, return_dict=True,
        router_aux_loss_coef=0.0,
    )
    return Qwen3MoeForCausalLM(config)

