"""thuml/Time-Series-Library's PatchTST (tslib/models/PatchTST.py and the layers it imports,
unchanged) at a tiny long-term-forecasting configuration, built as run.py builds it. Instance
normalization by each series' own mean and deviation over time (detached), patches cut by `unfold`, the
batch and the variables merged into one dim for a channel-independent encoder
(`torch.reshape(x, (B * N, patches, d))`) whose norms are BatchNorm1d over every token of the batch
(its statistics couple the samples: graphsplit syncs them), a flatten head and the normalization undone."""

from tslib_setup import configs, example_inputs, example_target, loss_fn, seed  # noqa: F401

from models.PatchTST import Model


def build_model():
    seed()
    return Model(configs())
