"""thuml/Time-Series-Library's TiDE (tslib/models/TiDE.py and the layers it imports, unchanged) at a tiny
long-term-forecasting configuration, built as run.py builds it. A dense encoder-decoder over each
variable's series separately, called once per variable in a Python loop and stacked (`torch.stack([...
for feature in range(x.shape[-1])], -1)`), the time features projected and concatenated, residual MLP
blocks with LayerNorm. Traced by torch.export."""

from tslib_setup import configs, example_inputs, example_target, loss_fn, seed  # noqa: F401

from models.TiDE import Model


def build_model():
    seed()
    return Model(configs())
