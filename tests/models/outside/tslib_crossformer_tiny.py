"""thuml/Time-Series-Library's Crossformer (tslib/models/Crossformer.py and the layers it imports,
unchanged) at a tiny long-term-forecasting configuration, built as run.py builds it. Written with einops
(`rearrange`, `repeat` of learned router and position tensors over the batch): graphsplit traces it
with torch.fx through einops (ir/einops_proxies.py). Two-stage attention (across time, then across
dimensions through a small set of learned routers), segment merging between scales, a decoder that
predicts per scale and sums."""

from tslib_setup import configs, example_inputs, example_target, loss_fn, seed  # noqa: F401

from models.Crossformer import Model


def build_model():
    seed()
    return Model(configs())
