"""openai/whisper's whisper/model.py (whisper_repo/whisper/, unchanged; only that file is copied)
at a tiny size: `Whisper(ModelDimensions(...))`, called as its decoding and timing code call it
(`model(mel, tokens)` -> logits; `model.decoder(tokens, model.encoder(mel))`) and trained on next-token
cross-entropy over the logits, as fine-tuning scripts for it do (the repository has no trainer).

Imports: model.py imports `.decoding` and `.transcribe` at the top, for its decode()/transcribe()
methods only; those pull in tiktoken and numba, which this machine lacks. This file registers two
stand-in modules, whisper.decoding and whisper.transcribe, that hold only the three names model.py
imports (never called in forward), and leaves `whisper` a namespace package (no __init__.py: the
repository's imports audio, decoding, transcribe and the tokenizer). The decoder's
`positional_embedding` is `nn.Parameter(torch.empty(...))`, filled only by a checkpoint; build_model()
stands in for the checkpoint with seeded normal(0, 0.02) values.

What it exercises: an encoder-decoder with cross-attention, two 1-D convolutions (stride 2) over the
mel input with subclassed Conv1d/Linear/LayerNorm that cast weights to the input dtype, sinusoidal
positions as a buffer and a value check `assert x.shape[1:] == self.positional_embedding.shape`,
SDPA with `is_causal` decided by `mask is not None and n_ctx > 1`, the decoder's causal mask as a
non-persistent -inf buffer, `alignment_heads` as a non-persistent *sparse* bool buffer, a tied output
projection `x @ token_embedding.weight.T` with `.float()`, a class attribute `use_sdpa`."""

import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent / "whisper_repo"))


def _stand_in(name, **names):
    if name not in sys.modules:
        module = types.ModuleType(name)
        module.__dict__.update(names)
        sys.modules[name] = module


def _unused(*args, **kwargs):
    raise NotImplementedError("inference helpers are not staged")


_stand_in("whisper.decoding", decode=_unused, detect_language=_unused)
_stand_in("whisper.transcribe", transcribe=_unused)
from whisper.model import ModelDimensions, Whisper  # noqa: E402

VOCAB, BATCH, MELS, AUDIO_CTX, TEXT = 96, 4, 16, 16, 12


def build_model():
    torch.manual_seed(0)
    model = Whisper(ModelDimensions(n_mels=MELS, n_audio_ctx=AUDIO_CTX, n_audio_state=32, n_audio_head=4,
                                    n_audio_layer=2, n_vocab=VOCAB, n_text_ctx=16, n_text_state=32,
                                    n_text_head=4, n_text_layer=2))
    with torch.no_grad():  # in place of the checkpoint: torch.empty otherwise
        model.decoder.positional_embedding.normal_(0.0, 0.02)
    return model


def _data():
    g = torch.Generator().manual_seed(1)
    mel = torch.randn(BATCH, MELS, 2 * AUDIO_CTX, generator=g)  # conv2 has stride 2: 2 * n_audio_ctx frames
    tokens = torch.randint(0, VOCAB, (BATCH, TEXT + 1), generator=g)
    return mel, tokens


def example_inputs():
    mel, tokens = _data()
    return (mel, tokens[:, :-1].clone())


def example_target():
    return _data()[1][:, 1:].clone()


def loss_fn(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
