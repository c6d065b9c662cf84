"""thuml/Time-Series-Library's Transformer (tslib/models/Transformer.py and the layers it imports,
unchanged) at a tiny long-term-forecasting configuration, built as run.py builds it. The vanilla
encoder-decoder transformer of the library, the decoder causal (its masking utility builds a triangular
mask with `torch.triu` in forward), token, position and time-feature embeddings (TokenEmbedding's
circular-padding convolution), cross-attention over the encoder."""

from tslib_setup import configs, example_inputs, example_target, loss_fn, seed  # noqa: F401

from models.Transformer import Model


def build_model():
    seed()
    return Model(configs())
