"""Lightning-AI/litgpt's GPT (litgpt_repo/litgpt/model.py, unchanged) fine-tuned as litgpt/finetune/full.py
fine-tunes it: `loss = chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])` (litgpt/utils.py,
unchanged: the logits flattened to rows of tokens, cut into chunks of 128 rows, a cross-entropy per chunk,
concatenated, summed and divided by the count of counted tokens, at least one), the prompt's tokens
masked with -100 as its instruction datasets mask them (prompts of different lengths: each sample counts
another number of tokens). At a tiny Pythia-style config (`Config.from_name("pythia-14m", ...)`: parallel
residual, LayerNorm, partial rotary), 4 sequences of 64 predicted tokens: 256 rows, two chunks.

litgpt's package __init__ (its API, tokenizer, prompts) is not copied: model.py, config.py, utils.py,
constants.py, types.py and scripts/convert_hf_checkpoint.py (which model.py imports) are, and the
repository root goes on sys.path (the files import `litgpt.*`)."""

import sys
from pathlib import Path

import torch

ROOT = str(Path(__file__).parent / "litgpt_repo")
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from litgpt.config import Config  # noqa: E402
from litgpt.model import GPT  # noqa: E402
from litgpt.utils import chunked_cross_entropy  # noqa: E402

VOCAB, BATCH, SEQ = 64, 4, 64


def build_model():
    torch.manual_seed(0)
    config = Config.from_name("pythia-14m", n_layer=2, n_head=4, n_embd=32, block_size=SEQ + 1, vocab_size=VOCAB,
                              padded_vocab_size=VOCAB)
    return GPT(config)


def _data():
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))


def example_inputs():
    return (_data(),)


def example_target():
    labels = _data().clone()
    for i, prompt in enumerate((5, 17, 30, 2)):  # the prompt's tokens are not trained on
        labels[i, :prompt] = -100
    return labels


def loss_fn(logits, targets):
    # shift the targets such that output n predicts token n+1
    return chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])
