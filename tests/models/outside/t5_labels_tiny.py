"""transformers' T5ForConditionalGeneration (package transformers, unchanged) at a tiny config (no
download), trained as Seq2SeqTrainer / run_translation.py train it: `model(input_ids=...,
attention_mask=..., labels=...)` and `outputs.loss`. The model makes its own decoder inputs from the
labels (`_shift_right`: the decoder start token prepended, the -100 of padded labels replaced by the
pad id) and computes its own mean cross-entropy over the labels that are not -100 (the collator pads
labels with -100). Relative position bias, cross-attention, tied embeddings scaled by d_model**-0.5.
Dropout 0."""

import torch
from transformers import T5Config, T5ForConditionalGeneration

VOCAB, BATCH, SRC, TGT = 64, 4, 10, 8


def build_model():
    torch.manual_seed(0)
    return T5ForConditionalGeneration(T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, use_cache=False,
    ))


def example_inputs():
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(2, VOCAB, (BATCH, SRC), generator=g)
    src_len = torch.tensor([10, 7, 9, 5])
    keep = torch.arange(SRC) < src_len[:, None]
    input_ids = torch.where(keep, input_ids, 0)  # padded with the pad id, as the tokenizer pads
    labels = torch.randint(2, VOCAB, (BATCH, TGT), generator=g)
    tgt_len = torch.tensor([8, 6, 3, 7])
    labels = torch.where(torch.arange(TGT) < tgt_len[:, None], labels, -100)  # DataCollatorForSeq2Seq's padding
    return {"input_ids": input_ids, "attention_mask": keep.long(), "labels": labels}
