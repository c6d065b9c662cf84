"""transformers' Wav2Vec2ForCTC (package transformers, unchanged) at a tiny config (no download),
trained as run_speech_recognition_ctc.py trains it: `model(input_values=..., labels=...)` and
`outputs.loss`, the model's own CTC loss (`ctc_loss_reduction="mean"`, the script's default), with
labels padded by -100. Exercises a strided conv feature encoder with GroupNorm (`feat_extract_norm=
"group"`, the base model's: no attention mask passed, as for those checkpoints), a grouped
convolutional position embedding under weight norm (a parametrization), and in the loss:
`labels.max() >= vocab_size` checked with a raise, the label lengths summed from the mask,
`labels.masked_select(labels >= 0)` (a data-dependent shape) and F.ctc_loss under
cuDNN-disabled. SpecAugment's time masking (NumPy random in forward) is off (`mask_time_prob=0`) and
dropouts and layerdrop are 0, so runs compare."""

import torch
from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

VOCAB, BATCH, SAMPLES, LABELS = 32, 4, 1600, 12


def build_model():
    torch.manual_seed(0)
    return Wav2Vec2ForCTC(Wav2Vec2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        conv_dim=(16, 16, 16), conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, feat_extract_norm="group", do_stable_layer_norm=False,
        hidden_dropout=0.0, activation_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0,
        final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0, ctc_loss_reduction="mean", pad_token_id=0,
    ))


def example_inputs():
    g = torch.Generator().manual_seed(1)
    input_values = torch.randn(BATCH, SAMPLES, generator=g)  # normalized audio, 0.1 s at 16 kHz
    labels = torch.randint(1, VOCAB, (BATCH, LABELS), generator=g)
    lengths = torch.tensor([12, 9, 5, 11])
    labels = torch.where(torch.arange(LABELS) < lengths[:, None], labels, -100)  # DataCollatorCTCWithPadding
    return {"input_values": input_values, "labels": labels}
