"""thuml/Time-Series-Library's FEDformer (tslib/models/FEDformer.py and the layers it imports,
unchanged) at a tiny long-term-forecasting configuration, built as run.py builds it (fixed seeds,
its default Fourier version with randomly selected modes). Complex-valued weights and spectra
(torch.fft, einsum over cfloat, in-place writes into a complex buffer), Python loops over the
selected modes with conditions on sizes, series decomposition by moving averages, dropout."""

from tslib_setup import configs, example_inputs, example_target, loss_fn, seed  # noqa: F401

from models.FEDformer import Model


def build_model():
    seed()
    return Model(configs())
