"""thuml/Time-Series-Library's SCINet (tslib/models/SCINet.py and the layers it imports, unchanged) at a
tiny long-term-forecasting configuration, built as run.py builds it. Sample convolution and interaction:
the series split into even and odd steps recursively (`x[:, ::2]`, `x[:, 1::2]`), convolutions
exchanging information between the halves, then zipped back into one series by interleaving; a
sinusoidal position encoding from a buffer. Traced by torch.export."""

from tslib_setup import configs, example_inputs, example_target, loss_fn, seed  # noqa: F401

from models.SCINet import Model


def build_model():
    seed()
    return Model(configs())
