"""A GPT-J / PaLM-style parallel-residual model: `x + attn(ln(x)) + mlp(ln(x))`, one norm shared
by both branches. Tensor parallelism sums the two row-parallel outputs before one collective."""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, WIDTH, HEADS, LAYERS, SEQ, BATCH = 64, 32, 4, 2, 8, 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(WIDTH)
        self.q_proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.k_proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.v_proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.out_proj = nn.Linear(WIDTH, WIDTH, bias=False)  # GPT-J: no bias on the attention output
        self.fc_in = nn.Linear(WIDTH, 4 * WIDTH)
        self.fc_out = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.ln(x)
        q, k, v = (p(h).view(b, t, HEADS, c // HEADS).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        return x + self.out_proj(y) + self.fc_out(F.gelu(self.fc_in(h)))


class ParallelResidualLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build_model() -> nn.Module:
    return ParallelResidualLM()


def example_inputs() -> tuple[torch.Tensor]:
    return (torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0)),)


def example_target() -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
