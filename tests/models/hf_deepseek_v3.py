"""HuggingFace transformers' DeepseekV3ForCausalLM (a dense first layer, then shared + routed
experts with top-2 routing; multi-head latent attention), as is, from a tiny config (no download).

    graphsplit run tests/models/hf_deepseek_v3.py --tp 2 --pp 2 --check
"""

import sys
from pathlib import Path

import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_tokens import VOCAB, example_inputs, example_target, loss_fn  # noqa: E402, F401


def build_model():
    torch.manual_seed(0)
    config = DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4,
        qk_nope_head_dim=8, v_head_dim=8,
        max_position_embeddings=64, attention_dropout=0.0, use_cache=False, return_dict=True,
        router_aux_loss_coef=0.0,
    )
    return DeepseekV3ForCausalLM(config)

