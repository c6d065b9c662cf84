"""thuml/Time-Series-Library's TimeXer (tslib/models/TimeXer.py and the layers it imports, unchanged) at a
tiny long-term-forecasting configuration, patches of 8 steps, built as run.py builds it. Endogenous
patches (`unfold`) with a learnable global token per variable, exogenous variables embedded whole
(inverted, one token each), self-attention over the patches and cross-attention from the global token to
the exogenous tokens."""

from tslib_setup import configs, example_inputs, example_target, loss_fn, seed  # noqa: F401

from models.TimeXer import Model


def build_model():
    seed()
    return Model(configs(use_norm=1, patch_len=8))
