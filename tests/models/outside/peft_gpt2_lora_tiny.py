"""peft's LoRA (package peft 0.21.2, unchanged) on transformers' GPT2LMHeadModel at a tiny config (no
download), as PEFT's docs apply it to GPT-2: `LoraConfig(task_type="CAUSAL_LM", target_modules=
["c_attn"], fan_in_fan_out=True)` (GPT-2's fused q/k/v projection is a Conv1D whose weight is stored
transposed), then trained with `labels=` (the model's own shifted cross-entropy, -100 ignored: here the
padded tail of two rows). Exercises the PEFT wrapper around a Conv1D (`lora.Linear` over a
`transformers.pytorch_utils.Conv1D` base layer), frozen base weights, a tied LM head, and an attention
mask with padding. Dropouts 0."""

import torch
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB, BATCH, SEQ = 64, 4, 16


def build_model():
    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, use_cache=False, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
    ))
    config = LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["c_attn"],
                        fan_in_fan_out=True)
    return get_peft_model(base, config)


def example_inputs():
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    lengths = torch.tensor([16, 12, 16, 9])
    attention_mask = (torch.arange(SEQ) < lengths[:, None]).long()
    labels = torch.where(attention_mask.bool(), input_ids, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
