"""thuml/Time-Series-Library's iTransformer (tslib/models/iTransformer.py and the layers it imports,
unchanged) at a tiny long-term-forecasting configuration, built as run.py builds it. Inverted: each
variable's whole series (and each time feature's) is one token (`DataEmbedding_inverted` projects the
time axis), attention runs across the variables, the output is sliced back to the series' variables
(`[:, :, :N]`), with the instance normalization of its inputs undone at the end."""

from tslib_setup import configs, example_inputs, example_target, loss_fn, seed  # noqa: F401

from models.iTransformer import Model


def build_model():
    seed()
    return Model(configs())
