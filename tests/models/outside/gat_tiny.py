"""pytorch/examples' gat/main.py (gat/, unchanged): its GAT, a graph attention network trained as
that script trains it: the whole graph is one input (node features [nodes, features] and the
adjacency matrix [nodes, nodes]), attention runs over every node's neighbours, dropout 0.6 on
features and attention weights, and the loss is the NLL over the training nodes (written here as
NLL with the other nodes' labels at ignore_index, which is the same mean). No input carries a
batch: the nodes are coupled, so cutting them into micro-batches or replicas changes the model."""

import torch
import torch.nn.functional as F
from gat.main import GAT

NODES, FEATURES, CLASSES = 24, 16, 3


def build_model():
    torch.manual_seed(13)  # the script's --seed
    return GAT(in_features=FEATURES, n_hidden=8, n_heads=2, num_classes=CLASSES, concat=False, dropout=0.6)


def _graph():
    g = torch.Generator().manual_seed(1)
    features = torch.rand(NODES, FEATURES, generator=g)
    features = features / features.sum(dim=1, keepdim=True)  # row-normalized, as load_cora scales them
    edges = (torch.rand(NODES, NODES, generator=g) < 0.15).long()
    adj = torch.eye(NODES) + ((edges + edges.t()) > 0).float()  # symmetric, with self-loops
    labels = torch.randint(0, CLASSES, (NODES,), generator=g)
    train = torch.randperm(NODES, generator=g)[: NODES // 2]
    return features, adj, labels, train


def example_inputs():
    features, adj, _, _ = _graph()
    return (features, adj)


def example_target():
    _, _, labels, train = _graph()
    target = torch.full_like(labels, -100)
    target[train] = labels[train]
    return target


def loss_fn(output, target):
    return F.nll_loss(output, target)  # = the script's criterion(output[idx_train], labels[idx_train])
