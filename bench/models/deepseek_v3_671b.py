"""DeepSeek-V3's shape (DeepSeek-V3 Technical Report, sections 4.2 and 4.3): 61 layers, hidden 7168, the
first 3 dense (FFN 18432), the other 58 mixtures of 256 routed experts (FFN 2048 each) plus 1 shared,
8 active per token; multi-head latent attention with 128 heads (q rank 1536, kv rank 512, 128 + 64 dims
per head); vocabulary 129,280; sequences of 4,096 tokens in batches of 15,360 (the report's final batch
size). HF transformers' DeepseekV3ForCausalLM from that config, unmodified, built on meta by the
planner: no weights exist. The report trains it on 2,048 H800s with 16-way pipeline and 64-way expert
parallelism (ZeRO-1 data parallelism, no tensor parallelism; section 3.2)."""

import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

SEQ, BATCH = 4096, 15360
CONFIG = dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
              num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
              n_routed_experts=256, routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536,
              qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=8, topk_group=4,
              num_experts_per_tok=8, first_k_dense_replace=3, norm_topk_prob=True, max_position_embeddings=SEQ,
              use_cache=False, attention_dropout=0.0)


def build_model():
    return DeepseekV3ForCausalLM(DeepseekV3Config(**CONFIG))


def example_inputs():
    return {"input_ids": torch.zeros(BATCH, SEQ, dtype=torch.long)}


def example_target():
    return torch.zeros(BATCH, SEQ, dtype=torch.long)


def loss_fn(output, target):
    return torch.nn.functional.cross_entropy(output.logits.flatten(0, 1), target.flatten())
