"""thuml/Time-Series-Library's DLinear (tslib/models/DLinear.py and the layers it imports,
unchanged) at a tiny long-term-forecasting configuration, built as run.py builds it. A moving-average
series decomposition (`series_decomp`: AvgPool1d over the series padded by repeating its ends, built
with `repeat` and `torch.cat` along time) and one linear map over time per part, no attention at all."""

from tslib_setup import configs, example_inputs, example_target, loss_fn, seed  # noqa: F401

from models.DLinear import Model


def build_model():
    seed()
    return Model(configs())
