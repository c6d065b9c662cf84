"""thuml/Time-Series-Library's LightTS (tslib/models/LightTS.py and the layers it imports, unchanged) at a
tiny long-term-forecasting configuration, built as run.py builds it. Continuous and interval sampling of
the series (reshapes that take every k-th step and consecutive chunks apart), an IEBlock of linears
along each axis, no attention."""

from tslib_setup import configs, example_inputs, example_target, loss_fn, seed  # noqa: F401

from models.LightTS import Model


def build_model():
    seed()
    return Model(configs())
