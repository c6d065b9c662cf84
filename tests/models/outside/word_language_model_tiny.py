"""pytorch/examples' word_language_model/model.py (word_language_model/, unchanged): its
TransformerModel, sequence-first as in that example (nn.Transformer's default batch_first=False:
inputs are [sequence, batch]), with the causal mask it builds and caches on itself and
nn.Transformer's default dropout 0.1 in its encoder layers. Trained as its main.py does: NLL on
the log-probabilities."""

import torch
import torch.nn.functional as F
from word_language_model.model import TransformerModel

VOCAB, BATCH, SEQ = 96, 4, 16


def build_model():
    torch.manual_seed(0)
    return TransformerModel(VOCAB, 32, 4, 64, 2, dropout=0.0)


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (SEQ + 1, BATCH), generator=g)  # [sequence, batch], as batchify() makes it


def example_inputs():
    return (_data()[:-1],)


def example_target():
    return _data()[1:]


def loss_fn(output, target):
    return F.nll_loss(output.reshape(-1, output.size(-1)), target.reshape(-1))
