"""HF LlamaForCausalLM (tests/models/hf_llama.py) called with a padding mask (`attention_mask`, the
first sample's first 3 tokens padding): a mask computed from the inputs, which context parallelism
cannot reproduce by position, so --cp refuses it in one line."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_llama import BATCH, SEQ, VOCAB, build_model, example_target, loss_fn  # noqa: E402, F401


def example_inputs():
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[0, :3] = 0
    return {"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), "attention_mask": mask}
