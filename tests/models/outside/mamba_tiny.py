"""johnma2006/mamba-minimal's model.py (mamba_minimal/, unchanged; needs einops) at a tiny config:
a selective state-space model whose scan is a Python loop over the sequence, depthwise causal
convolutions, a tied LM head."""

import torch
import torch.nn.functional as F
from mamba_minimal.model import Mamba, ModelArgs

VOCAB, BATCH, SEQ = 96, 4, 16


def build_model():
    torch.manual_seed(0)
    return Mamba(ModelArgs(d_model=32, n_layer=2, vocab_size=VOCAB, d_state=8))


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)


def example_inputs():
    return (_data()[:, :-1],)


def example_target():
    return _data()[:, 1:]


def loss_fn(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
