"""jingyaogong/minimind's model/model_minimind.py (minimind/model/, unchanged) at a tiny dense
config, trained as its trainer/train_pretrain.py does: `res = model(input_ids, labels=labels)`,
`loss = res.loss + res.aux_loss` (the model shifts the labels itself, ignore_index=-100). A
transformers PreTrainedModel (`post_init()`, HF `MoeCausalLMOutputWithPast` output, tied
embedding/LM head), GQA with QK-RMSNorm, RoPE tables as non-persistent buffers sliced by a start
position, SDPA behind a `torch.all(attention_mask == 1)` test, an in-place residual add
(`hidden_states += residual`), and a value check in forward (`if self.freqs_cos[0, 0] == 0:`
recomputes the RoPE buffers lost to meta-device init). Dense SwiGLU MLP (use_moe=False)."""

import torch

from minimind.model.model_minimind import MiniMindConfig, MiniMindForCausalLM

VOCAB, BATCH, SEQ = 96, 4, 16


def config(**kw):
    return MiniMindConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                          vocab_size=VOCAB, intermediate_size=64, max_position_embeddings=64, dropout=0.0, **kw)


def build_model():
    torch.manual_seed(0)
    return MiniMindForCausalLM(config(use_moe=False))


def example_inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}  # lm_dataset.py: labels = input_ids with pads -100


def loss_fn(res):
    return res.loss + res.aux_loss  # train_pretrain.py
