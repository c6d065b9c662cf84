"""thuml/Time-Series-Library's SegRNN (tslib/models/SegRNN.py and the layers it imports, unchanged) at a
tiny long-term-forecasting configuration, built as run.py builds it, its segments 8 steps long (its
scripts cut 96 steps into 48; run.py's default seg_len, 96, is longer than this window). Segments of the
series embedded by a linear layer, one GRU over the segments, and the prediction decoded from its last
state for every output segment at once (position and channel embeddings concatenated and repeated over
the batch x variables), with the last value subtracted first and added back (`x - seq_last`)."""

from tslib_setup import configs, example_inputs, example_target, loss_fn, seed  # noqa: F401

from models.SegRNN import Model


def build_model():
    seed()
    return Model(configs(seg_len=8))
