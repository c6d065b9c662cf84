"""thuml/Time-Series-Library's TSMixer (tslib/models/TSMixer.py and the layers it imports, unchanged) at a
tiny long-term-forecasting configuration, built as run.py builds it. All-MLP mixing: residual blocks
that mix along time (a linear over the transposed series) and along the channels, then a linear
projection of the time axis."""

from tslib_setup import configs, example_inputs, example_target, loss_fn, seed  # noqa: F401

from models.TSMixer import Model


def build_model():
    seed()
    return Model(configs())
