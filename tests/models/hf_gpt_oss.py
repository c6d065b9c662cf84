"""HuggingFace transformers' GptOssForCausalLM (mixture of experts with per-expert biases, a clamped
SwiGLU, attention sinks, sliding and full attention layers), as is, from a tiny config (no download).

    graphsplit run tests/models/hf_gpt_oss.py --ep 2 --check
"""

import sys
from pathlib import Path

import torch
from transformers import GptOssConfig, GptOssForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_tokens import VOCAB, example_inputs, example_target, loss_fn  # noqa: E402, F401


def build_model():
    torch.manual_seed(0)
    config = GptOssConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
        sliding_window=4, layer_types=["sliding_attention", "full_attention"], use_cache=False,
        router_aux_loss_coef=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    return GptOssForCausalLM(config)
