"""thuml/Time-Series-Library's PAttn (tslib/models/PAttn.py and the layers it imports, unchanged) at a tiny
long-term-forecasting configuration, built as run.py builds it. Patches cut with `Tensor.unfold` after a
replication pad (the batch dim kept, the time dim cut into windows), einops `rearrange` merging the
batch and the channels, a transformer encoder over the patches, instance normalization undone at the
end."""

from tslib_setup import configs, example_inputs, example_target, loss_fn, seed  # noqa: F401

from models.PAttn import Model


def build_model():
    seed()
    return Model(configs())
