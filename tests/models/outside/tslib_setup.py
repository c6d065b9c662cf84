"""What thuml/Time-Series-Library's run.py does before it builds a model, for the tslib_*_tiny.py
model files: its root on sys.path (the library imports `layers.*`, `models.*`, `utils.*` from
there), its fixed seeds (2021, for Python's, NumPy's and torch's global generators), and its
argument namespace at a tiny configuration. Batches are made as exp_long_term_forecasting.py makes
them: the decoder's input is the label window followed by zeros; the loss is the MSE of the
prediction window."""

import random
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

ROOT = str(Path(__file__).parent / "tslib")
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

BATCH, SEQ, LABEL, PRED, CHANNELS, MARKS = 4, 32, 16, 16, 4, 4  # freq 'h' with timeF: 4 time features


def seed() -> None:
    random.seed(2021)
    torch.manual_seed(2021)
    np.random.seed(2021)


def configs(**overrides) -> SimpleNamespace:
    values = dict(task_name="long_term_forecast", seq_len=SEQ, label_len=LABEL, pred_len=PRED, enc_in=CHANNELS,
                  dec_in=CHANNELS, c_out=CHANNELS, d_model=16, n_heads=8, e_layers=2, d_layers=1, d_ff=32,
                  moving_avg=5, factor=1, distil=True, dropout=0.1, embed="timeF", freq="h", activation="gelu",
                  top_k=2, num_kernels=2, features="M")
    values.update(overrides)
    return SimpleNamespace(**values)


def _batch():
    g = torch.Generator().manual_seed(1)
    series = torch.randn(BATCH, SEQ + PRED, CHANNELS, generator=g)
    marks = torch.rand(BATCH, SEQ + PRED, MARKS, generator=g) - 0.5
    return series, marks


def example_inputs():
    series, marks = _batch()
    batch_x, batch_y = series[:, :SEQ], series[:, SEQ - LABEL:]
    dec_inp = torch.cat([batch_y[:, :LABEL, :], torch.zeros_like(batch_y[:, -PRED:, :])], dim=1)
    return (batch_x, marks[:, :SEQ], dec_inp, marks[:, SEQ - LABEL:])


def example_target():
    series, _ = _batch()
    return series[:, -PRED:].clone()


def loss_fn(output, target):
    return F.mse_loss(output[:, -PRED:, 0:], target)
