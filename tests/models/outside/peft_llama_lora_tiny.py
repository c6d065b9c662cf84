"""peft's LoRA (package peft 0.21.2, unchanged) on transformers' LlamaForCausalLM at a tiny config (no
download), as PEFT's causal-LM examples build it: `get_peft_model(model, LoraConfig(task_type=
"CAUSAL_LM", r=..., lora_alpha=..., target_modules=["q_proj", "v_proj"]))`, then trained with
`labels=` (the model's own shifted cross-entropy, -100 ignored). Exercises the PEFT wrapper
(PeftModelForCausalLM -> LoraModel -> the base model, its forward reached through `__getattr__`
forwarding and kwargs), `lora.Linear` layers that wrap the frozen q/v projections (base_layer plus
`lora_B(lora_A(dropout(x))) * scaling` read from per-adapter ModuleDicts), and every base weight
frozen (requires_grad=False): only the LoRA matrices train. lora_dropout 0, so runs compare (the
examples use 0.05-0.1); B is zero at init, as LoRA starts."""

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, BATCH, SEQ = 64, 4, 16


def build_model():
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, use_cache=False,
    ))
    config = LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    return get_peft_model(base, config)


def example_inputs():
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    attention_mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    labels = input_ids.clone()  # DataCollatorForLanguageModeling(mlm=False): labels = input_ids
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
