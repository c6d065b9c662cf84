"""rasbt/LLMs-from-scratch's GPT model (rasbt_llms/pkg/llms_from_scratch/{ch03,ch04}.py, unchanged: the repo's
pip package `llms_from_scratch`, the same GPTModel as the book's ch04/ch05 `gpt.py` / `previous_chapters.py`,
which need tiktoken at import) at a tiny config, trained as ch05/01_main-chapter-code/gpt_train.py does:

    logits = model(input_batch)                      # calc_loss_batch
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target_batch.flatten())

with batches from create_dataloader_v1 (GPTDatasetV1: `input_chunk = token_ids[i:i + max_length]`,
`target_chunk = token_ids[i + 1: i + max_length + 1]`). Exercises: a hand-written LayerNorm (mean / var
unbiased=False), a tanh GELU that builds `torch.tensor(2.0 / torch.pi)` inside forward, MultiHeadAttention
with separate W_query/W_key/W_value, a registered causal-mask buffer sliced to the sequence and converted with
`.bool()`, an in-place `attn_scores.masked_fill_(...)`, `pos_emb(torch.arange(seq_len))`, nn.Sequential of blocks.
GPT_CONFIG_124M's shape at a tiny size; drop_rate 0.0 (0.1 in gpt_train.py)."""

import torch
import torch.nn.functional as F
from rasbt_llms.pkg.llms_from_scratch.ch04 import GPTModel

VOCAB, BATCH, SEQ = 96, 4, 16

GPT_CONFIG_TINY = {
    "vocab_size": VOCAB,
    "context_length": 32,
    "emb_dim": 32,
    "n_heads": 4,
    "n_layers": 4,
    "drop_rate": 0.0,
    "qkv_bias": False,
}


def build_model():
    torch.manual_seed(0)
    return GPTModel(GPT_CONFIG_TINY)


def _tokens():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)


def example_inputs():
    return (_tokens()[:, :-1].clone(),)


def example_target():
    return _tokens()[:, 1:].clone()


def loss_fn(logits, target_batch):
    return F.cross_entropy(logits.flatten(0, 1), target_batch.flatten())
