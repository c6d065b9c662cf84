"""thuml/Time-Series-Library's FreTS (tslib/models/FreTS.py and the layers it imports, unchanged) at a tiny
long-term-forecasting configuration, built as run.py builds it. Frequency-domain MLPs: the tokens
embedded, `torch.fft.rfft` along the channels and along time, complex-valued MLPs written with `einsum`
on the real and imaginary parts and `torch.stack`ed, `irfft` back, `F.softshrink` on the weights'
activations."""

from tslib_setup import configs, example_inputs, example_target, loss_fn, seed  # noqa: F401

from models.FreTS import Model


def build_model():
    seed()
    return Model(configs(channel_independence=1))
