"""karpathy/makemore's MLP language model (makemore/makemore.py, unchanged; its training code sits under
`if __name__ == '__main__':`, so importing it runs none of it) at a small size, on its own data (names.txt,
through its create_datasets / CharDataset: vocab 27, block_size 16), trained as its main loop does:

    config = ModelConfig(vocab_size=vocab_size, block_size=block_size, n_layer=..., n_embd=..., n_embd2=...)
    model = MLP(config)                    # --type mlp
    logits, loss = model(X, Y)             # its own cross-entropy, ignore_index=-1

Exercises (Bengio et al. 2003): a Python loop of block_size steps that embeds the input, then
`idx = torch.roll(idx, 1, 1)` and writes the <BLANK> token in place, `idx[:, 0] = self.vocab_size`, on
the rolled copy of the integer input; the embeddings concatenated along features, Linear-Tanh-Linear;
the loss masks padded targets with -1."""

import torch
from makemore.makemore import MLP
from makemore_setup import batch, config


def build_model():
    cfg = config(n_layer=4, n_embd=16, n_embd2=32)
    torch.manual_seed(0)
    return MLP(cfg)


def example_inputs():
    X, Y = batch()
    return (X, Y)
