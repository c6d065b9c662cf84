"""lucidrains/x-transformers (x_transformers/, the package laid flat and unchanged; it imports itself as
`x_transformers.*`) at a tiny config, built and trained as its train_enwik8.py does:

    model = TransformerWrapper(num_tokens = 256, max_seq_len = seq_len,
        attn_layers = Decoder(dim = 512, depth = 6, heads = 8, rotary_pos_emb = False,
                              polar_pos_emb = True, pre_and_post_norm = True))
    model = AutoregressiveWrapper(model)
    loss = model(next(train_loader))     # a (batch, seq_len + 1) tensor of byte ids

AutoregressiveWrapper.forward splits the sequence into input and target itself (`x, x[:, 1:]`), replaces
`ignore_index` tokens by `pad_value` with torch.where, runs the net with `return_intermediates=True`, drops the
last logit and returns F.cross_entropy over the rest (its own loss). Exercises: einops rearrange/pack/unpack
everywhere, einx, the polar positional embedding (PolarEmbedding: complex-free cos/sin of learned frequencies
plus a learned bias), pre- and post-norm residual blocks, namedtuple intermediates, many `exists(...)` Python
branches. Here num_tokens 128 (ids < 128), dim 32, depth 2, heads 4; dropouts are 0 by default."""

import torch
from x_transformers.x_transformers import TransformerWrapper, Decoder
from x_transformers.autoregressive_wrapper import AutoregressiveWrapper

VOCAB, BATCH, SEQ = 128, 4, 16


def build_model():
    torch.manual_seed(0)
    model = TransformerWrapper(
        num_tokens=VOCAB,
        max_seq_len=SEQ,
        attn_layers=Decoder(dim=32, depth=2, heads=4, rotary_pos_emb=False, polar_pos_emb=True, pre_and_post_norm=True),
    )
    return AutoregressiveWrapper(model)


def example_inputs():
    g = torch.Generator().manual_seed(1)
    # TextSamplerDataset: `full_seq = self.data[rand_start: rand_start + self.seq_len + 1].long()`
    return (torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g),)
