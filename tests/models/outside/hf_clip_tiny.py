"""transformers' CLIPModel (package transformers, unchanged) at a tiny config (no download), trained on
its own contrastive loss: `model(input_ids=..., pixel_values=..., attention_mask=...,
return_loss=True)` and `outputs.loss`, as the contrastive-image-text example (run_clip.py) trains it.
The loss is `clip_loss(logits_per_text)`: cross-entropy of the batch-by-batch similarity matrix
against `torch.arange(len(logits), device=logits.device)`, for texts and images, averaged: every
sample's loss depends on every other sample of the batch. Text pooled at each row's end-of-text token
(`(input_ids == eos_token_id).int().argmax(-1)`), a learned temperature (`logit_scale.exp()`)."""

import torch
from transformers import CLIPConfig, CLIPModel

VOCAB, BATCH, CONTEXT, IMAGE = 64, 8, 8, 16
EOS = VOCAB - 1


def build_model():
    torch.manual_seed(0)
    return CLIPModel(CLIPConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=CONTEXT, pad_token_id=0, bos_token_id=1,
                         eos_token_id=EOS, attention_dropout=0.0),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           image_size=IMAGE, patch_size=8, attention_dropout=0.0),
        projection_dim=32,
    ))


def example_inputs():
    g = torch.Generator().manual_seed(1)
    pixel_values = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g)
    ends = torch.randint(2, CONTEXT, (BATCH,), generator=g)
    positions = torch.arange(CONTEXT)
    input_ids = torch.randint(2, EOS, (BATCH, CONTEXT), generator=g)
    input_ids[:, 0] = 1  # bos
    input_ids = torch.where(positions == ends[:, None], EOS, torch.where(positions < ends[:, None], input_ids, 0))
    attention_mask = (positions <= ends[:, None]).long()
    return {"input_ids": input_ids, "pixel_values": pixel_values, "attention_mask": attention_mask, "return_loss": True}
