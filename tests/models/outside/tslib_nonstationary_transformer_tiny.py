"""thuml/Time-Series-Library's Nonstationary_Transformer (tslib/models/Nonstationary_Transformer.py and the
layers it imports, unchanged) at a tiny long-term-forecasting configuration, with projector layers of 16
units (run.py's default is two of 128), built as run.py builds it. The series normalized by its own
statistics, and de-stationary attention: learned projectors (an MLP over the raw series and its
statistics, a circular-padded convolution) give a scale `tau` and a shift `delta` that rescale every
attention score."""

from tslib_setup import configs, example_inputs, example_target, loss_fn, seed  # noqa: F401

from models.Nonstationary_Transformer import Model


def build_model():
    seed()
    return Model(configs(p_hidden_dims=[16, 16], p_hidden_layers=2))
