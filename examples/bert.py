"""A small BERT-style encoder: post-norm blocks, a padding attention mask given as a
second (keyword) input, and a masked-LM head tied to the word embeddings.

    graphsplit run examples/bert.py --tp 2 --steps 5 --check
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class BertConfig:
    vocab_size: int = 512
    hidden: int = 64
    layers: int = 4
    heads: int = 4
    intermediate: int = 256
    max_positions: int = 64
    type_vocab: int = 2


class SelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.heads = cfg.heads
        self.head_dim = cfg.hidden // cfg.heads
        self.query = nn.Linear(cfg.hidden, cfg.hidden)
        self.key = nn.Linear(cfg.hidden, cfg.hidden)
        self.value = nn.Linear(cfg.hidden, cfg.hidden)
        self.dense = nn.Linear(cfg.hidden, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden)

    def split_heads(self, x):
        b, t, _ = x.shape
        return x.reshape(b, t, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x, mask_bias):
        q, k, v = self.split_heads(self.query(x)), self.split_heads(self.key(x)), self.split_heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + mask_bias
        ctx = torch.matmul(scores.softmax(dim=-1), v)
        ctx = ctx.permute(0, 2, 1, 3).flatten(2)
        return self.norm(x + self.dense(ctx))


class Layer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = SelfAttention(cfg)
        self.intermediate = nn.Linear(cfg.hidden, cfg.intermediate)
        self.output = nn.Linear(cfg.intermediate, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden)

    def forward(self, x, mask_bias):
        x = self.attention(x, mask_bias)
        return self.norm(x + self.output(F.gelu(self.intermediate(x))))


class BertForMaskedLM(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.position = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.token_type = nn.Embedding(cfg.type_vocab, cfg.hidden)
        self.embed_norm = nn.LayerNorm(cfg.hidden)
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg.layers)])
        self.transform = nn.Linear(cfg.hidden, cfg.hidden)
        self.transform_norm = nn.LayerNorm(cfg.hidden)
        self.decoder = nn.Linear(cfg.hidden, cfg.vocab_size)
        self.decoder.weight = self.word.weight  # tied, as in BERT

    def forward(self, input_ids, attention_mask):
        t = input_ids.shape[1]
        positions = torch.arange(t, device=input_ids.device)
        types = torch.zeros_like(input_ids)
        x = self.embed_norm(self.word(input_ids) + self.position(positions) + self.token_type(types))
        # 1 = attend, 0 = padding -> an additive bias broadcast over heads and queries
        mask_bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, mask_bias)
        x = self.transform_norm(F.gelu(self.transform(x)))
        return self.decoder(x)


def build_model(**overrides):
    return BertForMaskedLM(BertConfig(**overrides))


def example_inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, BertConfig.vocab_size, (8, 32), generator=g)
    lengths = torch.randint(16, 33, (8,), generator=g)
    mask = (torch.arange(32)[None, :] < lengths[:, None]).long()
    return {"input_ids": ids, "attention_mask": mask}


def example_target():
    return torch.randint(0, BertConfig.vocab_size, (8, 32), generator=torch.Generator().manual_seed(1))


def loss_fn(logits, target):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())
