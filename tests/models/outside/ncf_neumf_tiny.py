"""NVIDIA/DeepLearningExamples' NCF model, NeuMF (nvidia_ncf/PyTorch/Recommendation/NCF/neumf.py, unchanged,
with that project's LICENSE.md, Apache-2.0), at a tiny size, trained as its ncf.py does:

    model = NeuMF(nb_users=..., nb_items=..., mf_dim=args.factors, mlp_layer_sizes=args.layers, dropout=args.dropout)
    criterion = nn.BCEWithLogitsLoss(reduction='none')
    outputs = model(user_batch, item_batch)
    loss = traced_criterion(outputs, label_batch.view(-1, 1))       # traced_criterion = torch.jit.trace(criterion.forward, ...)
    loss = torch.mean(loss.float().view(-1), 0)

(loss_fn below calls the criterion itself rather than its torch.jit.trace; the arithmetic is the same.)
Batches as its dataloading.py builds them: int64 user and item ids and float labels, the positives mixed with
the sampled negatives (label 0, `--negative_samples 4`: one in five is positive) by its per-epoch shuffle. Exercises: four nn.Embedding tables (GMF and MLP towers),
a GMF product, an MLP over the concatenated embeddings, torch.cat of both towers into a final Linear, a keyword
argument with a default (`sigmoid=False`) that training leaves alone, initialization through `.weight.data` and
numpy. 64 users, 96 items, factors 8, layers [32, 16, 8] (ncf.py: 64 and [256, 256, 128, 64]);
dropout 0.0 (ncf.py: 0.5; with 0 its forward skips the dropout branch)."""

import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn as nn

_spec = importlib.util.spec_from_file_location(
    "nvidia_ncf_neumf", Path(__file__).parent / "nvidia_ncf" / "PyTorch" / "Recommendation" / "NCF" / "neumf.py")
neumf = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = neumf
_spec.loader.exec_module(neumf)

USERS, ITEMS, BATCH = 64, 96, 8


def build_model():
    torch.manual_seed(0)
    return neumf.NeuMF(nb_users=USERS, nb_items=ITEMS, mf_dim=8, mlp_layer_sizes=[32, 16, 8], dropout=0.0)


def example_inputs():
    g = torch.Generator().manual_seed(1)
    users = torch.randint(0, USERS, (BATCH,), generator=g)
    items = torch.randint(0, ITEMS, (BATCH,), generator=g)
    return (users, items)


def example_target():
    g = torch.Generator().manual_seed(2)
    return (torch.rand(BATCH, 1, generator=g) < 0.2).float()


criterion = nn.BCEWithLogitsLoss(reduction="none")


def loss_fn(outputs, label_batch):
    loss = criterion(outputs, label_batch.view(-1, 1))
    return torch.mean(loss.float().view(-1), 0)
