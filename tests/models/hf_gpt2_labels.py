"""HuggingFace GPT2LMHeadModel trained as HF's own Trainer trains it: called with `labels=` it
returns `CausalLMOutput(loss=...)`, and no loss_fn is defined (graphsplit trains on `output.loss`).

    graphsplit run tests/models/hf_gpt2_labels.py --pp 2 --steps 2 --check
"""

import torch
from hf_gpt2 import BATCH, SEQ, VOCAB, build_model  # noqa: F401  (the model file's builder)


def example_inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}
