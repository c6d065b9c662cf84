"""thuml/Time-Series-Library's FiLM (tslib/models/FiLM.py and the layers it imports, unchanged) at a tiny
long-term-forecasting configuration, built as run.py builds it. Frequency-improved Legendre memory: each
window projected on Legendre polynomials (fixed matrices built with SciPy at construction, as buffers),
a Fourier layer over the projection (`torch.fft.rfft`, complex weights multiplied in `einsum`, `irfft`),
several windows mixed, with reversible instance normalization around it. Traced by torch.export."""

from tslib_setup import configs, example_inputs, example_target, loss_fn, seed  # noqa: F401

from models.FiLM import Model


def build_model():
    seed()
    return Model(configs())
