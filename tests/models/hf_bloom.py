"""HuggingFace transformers' BloomForCausalLM, as is, from a small config (no download): BLOOM's
attention written out (ALiBi's bias added by `baddbmm` over a merged batch x heads dim, softmax,
`bmm`) and its MLP's GeLU a custom autograd Function (`GeLUFunction`).

    graphsplit run tests/models/hf_bloom.py --tp 2 --autocast bf16 --steps 2 --check
"""

import torch
import torch.nn.functional as F
from transformers import BloomConfig, BloomForCausalLM

VOCAB = 256
BATCH, SEQ = 4, 16


def build_model():
    torch.manual_seed(0)
    config = BloomConfig(n_layer=2, hidden_size=64, n_head=4, vocab_size=VOCAB, attention_dropout=0.0,
                         hidden_dropout=0.0, use_cache=False, return_dict=True)
    return BloomForCausalLM(config)


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)}


def example_target():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def loss_fn(output, target):
    logits = output.logits if hasattr(output, "logits") else output[0]
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())
