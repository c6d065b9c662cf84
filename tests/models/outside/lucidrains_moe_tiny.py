"""lucidrains/mixture-of-experts' mixture_of_experts/ (lucidrains_moe/, unchanged), the GShard-style
top-2 gated MoE layer, at a tiny size, called as its README does: `out, aux_loss = moe(inputs)`
on a (batch, seq, dim) tensor. The repository has no trainer; this file trains the layer on a
mean-squared error to a target plus the returned balancing loss (`loss + aux_loss`, as its README
and the tensor2tensor code it transcribes add it).

second_policy_train='all' (the README's example uses 'random', which draws `uniform_` noise in
forward to drop second experts: a random draw no split run reproduces; 'threshold' fails eagerly at
this commit: `mask_2 *= (gate_2 > threshold).float()` lacks the `.unsqueeze(-1)` 'random' has).
What it exercises: dense capacity-based dispatch (no nonzero): top-1 twice via topk, `F.one_hot`,
exclusive cumsum for positions within each expert, capacity from Python ints, `safe_one_hot`
whose class count is `max(indexes.max() + 1, max_length)` (a tensor value compared in Python and
used as a size), 4-D dispatch/combine tensors, einsums 'bnd,bnec->ebcd' that move the batch to an
inner dim, experts as stacked 3-D parameters (`Experts.w1/w2`, einsum '...nd,...dh->...nh'), in-place
updates of gate tensors (`gate_1 /= denom`, `mask_1 *= ...`)."""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).parent / "lucidrains_moe"))  # its __init__ imports `mixture_of_experts.…`
from mixture_of_experts import MoE  # noqa: E402

DIM, BATCH, SEQ = 32, 4, 16


def build_model():
    torch.manual_seed(0)
    return MoE(dim=DIM, num_experts=4, hidden_dim=64, activation=nn.LeakyReLU,
               second_policy_train='all', second_policy_eval='all')


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, SEQ, DIM, generator=g), torch.randn(BATCH, SEQ, DIM, generator=g)


def example_inputs():
    return (_data()[0],)


def example_target():
    return _data()[1]


def loss_fn(output, target):
    out, aux_loss = output
    return F.mse_loss(out, target) + aux_loss
