"""mistralai/mistral-inference's `MoeLayer` (mistral_moe/mistral_inference/moe.py, unchanged), the
reference implementation of Mixtral's mixture of experts, in a small pre-norm decoder built as its
transformer_layers.py builds a block (`MoeLayer(experts=[FeedForward(...)], gate=nn.Linear(dim,
num_experts, bias=False), moe_args=MoeArgs(...))`, SwiGLU experts as its FeedForward): the decoder and
FeedForward here are ours (its transformer_layers.py imports xformers), the layer is theirs. Each
expert picks its tokens with `batch_idx, nth_expert = torch.where(selected_experts == i)` and writes
back with `results[batch_idx] += ...`: sizes that follow the data (how many tokens each expert gets),
over the flattened tokens, as its transformer flattens them. Trained on next-token cross-entropy."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from mistral_moe.mistral_inference.moe import MoeArgs, MoeLayer

VOCAB, BATCH, SEQ, DIM, HEADS, EXPERTS = 64, 4, 8, 32, 4, 4


class FeedForward(nn.Module):  # as mistral_inference.transformer_layers.FeedForward (without LoRA)
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = nn.RMSNorm(DIM)
        self.wqkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.ffn_norm = nn.RMSNorm(DIM)
        self.feed_forward = MoeLayer(experts=[FeedForward(DIM, 2 * DIM) for _ in range(EXPERTS)],
                                     gate=nn.Linear(DIM, EXPERTS, bias=False),
                                     moe_args=MoeArgs(num_experts=EXPERTS, num_experts_per_tok=2))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.wqkv(self.attention_norm(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, HEADS, d // HEADS).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        h = x + self.wo(a)
        return h + self.feed_forward(self.ffn_norm(h).view(-1, d)).view(b, t, d)


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([Block() for _ in range(2)])
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        for p in self.parameters():  # a checkpoint's scale, not nn.Linear's
            if p.dim() > 1:
                nn.init.normal_(p, std=1 / math.sqrt(DIM))

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def build_model():
    torch.manual_seed(0)
    return Decoder()


def _data():
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))


def example_inputs():
    return (_data()[:, :-1].clone(),)


def example_target():
    return _data()[:, 1:].clone()


def loss_fn(logits, target):
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))
