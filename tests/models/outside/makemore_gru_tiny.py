"""karpathy/makemore's RNN language model with a GRU cell (makemore/makemore.py, unchanged; its training code
sits under `if __name__ == '__main__':`) at a small size, on its own data (names.txt through create_datasets /
CharDataset: vocab 27, block_size 16), trained as its main loop does:

    model = RNN(config, cell_type='gru')   # --type gru
    logits, loss = model(X, Y)             # its own cross-entropy, ignore_index=-1

Exercises: a learned start state `self.start.expand((b, -1))`, a Python loop over the 16 time steps through
a hand-written GRUCell (three Linear layers on `torch.cat([xt, hprev], dim=1)`, sigmoid/tanh gates), the
hidden states stacked along time, and the loss masked with -1."""

import torch
from makemore.makemore import RNN
from makemore_setup import batch, config


def build_model():
    cfg = config(n_layer=4, n_embd=16, n_embd2=32)
    torch.manual_seed(0)
    return RNN(cfg, cell_type="gru")


def example_inputs():
    X, Y = batch()
    return (X, Y)
