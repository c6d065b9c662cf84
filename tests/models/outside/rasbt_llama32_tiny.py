"""rasbt/LLMs-from-scratch's Llama 3.2 from scratch (rasbt_llms/pkg/llms_from_scratch/llama3.py, unchanged: the
repo's pip package; the same Llama3Model as ch05/07_gpt_to_llama's standalone notebooks) at a tiny config
shaped like its LLAMA32_CONFIG_1B (the same rope_freq scaling dict, GQA with n_heads / n_kv_groups = 2),
with dtype float32 instead of the config's torch.bfloat16. llama3.py imports tiktoken at its top (for its
Llama3Tokenizer), so tiktoken is installed (pip --no-deps; its deps regex and requests were present).
Trained with the book's ch05 loss (gpt_train.py / llms_from_scratch.ch05.calc_loss_batch):
`F.cross_entropy(logits.flatten(0, 1), target_batch.flatten())`, on next-token targets.

Exercises: nn.RMSNorm, SwiGLU (fc1/fc2/fc3), grouped-query attention with `repeat_interleave(group_size, dim=1)`
of keys and values, split-halves RoPE from non-persistent cos/sin buffers computed with Llama-3 frequency
smoothing (torch.where), passed into every block as arguments; a causal mask built in forward with
`torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)` and sliced; an `assert keys.shape[-1] == self.head_dim`
inside forward; a ModuleList looped over in forward; `x.to(self.cfg["dtype"])` before the LM head."""

import torch
import torch.nn.functional as F
from rasbt_llms.pkg.llms_from_scratch.llama3 import LLAMA32_CONFIG_1B, Llama3Model

VOCAB, BATCH, SEQ = 128, 4, 16

LLAMA32_CONFIG_TINY = {
    **LLAMA32_CONFIG_1B,
    "vocab_size": VOCAB,
    "context_length": 64,
    "emb_dim": 64,
    "n_heads": 4,
    "n_layers": 4,
    "hidden_dim": 128,
    "n_kv_groups": 2,
    "dtype": torch.float32,
}


def build_model():
    torch.manual_seed(0)
    return Llama3Model(LLAMA32_CONFIG_TINY)


def _tokens():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)


def example_inputs():
    return (_tokens()[:, :-1].clone(),)


def example_target():
    return _tokens()[:, 1:].clone()


def loss_fn(logits, target_batch):
    return F.cross_entropy(logits.flatten(0, 1), target_batch.flatten())
