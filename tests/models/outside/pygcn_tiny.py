"""tkipf/pygcn's GCN (pygcn/, the package laid flat and unchanged: models.py imports `pygcn.layers`) on a tiny
random citation-like graph, prepared with pygcn's own utils the way its utils.load_data prepares Cora
(symmetrized adjacency, `normalize(adj + sp.eye(n))` row normalization, row-normalized features,
`sparse_mx_to_torch_sparse_tensor`, labels from `encode_onehot`), and trained as its train.py does:

    model = GCN(nfeat=features.shape[1], nhid=args.hidden, nclass=labels.max().item() + 1, dropout=args.dropout)
    output = model(features, adj)
    loss_train = F.nll_loss(output[idx_train], labels[idx_train])

Exercises: `torch.spmm` of a sparse COO adjacency (a sparse input tensor, built with the legacy
`torch.sparse.FloatTensor` constructor) with a dense product, parameters made with `Parameter(torch.FloatTensor(...))`
and initialized in place, log_softmax over classes, a loss that reads only the training nodes. The whole graph
is one example: dim 0 of `features` is the nodes, which the adjacency mixes. 32 nodes, 24 features, hidden 16
(train.py's default), 4 classes; dropout 0.0 (train.py: 0.5)."""

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from pygcn.models import GCN
from pygcn.utils import encode_onehot, normalize, sparse_mx_to_torch_sparse_tensor

NODES, FEATURES, CLASSES, EDGES = 32, 24, 4, 64


def _graph():
    rng = np.random.RandomState(1)
    raw_features = sp.csr_matrix((rng.rand(NODES, FEATURES) < 0.2).astype(np.float32))
    # integer class names: encode_onehot numbers the classes in `set(labels)` order, which for strings (Cora's
    # class names) changes with each process's hash seed; small ints iterate the same in every process
    raw_labels = rng.randint(0, CLASSES, NODES)
    labels = encode_onehot(raw_labels)
    edges = rng.randint(0, NODES, (EDGES, 2))
    adj = sp.coo_matrix((np.ones(edges.shape[0]), (edges[:, 0], edges[:, 1])),
                        shape=(labels.shape[0], labels.shape[0]), dtype=np.float32)
    adj = adj + adj.T.multiply(adj.T > adj) - adj.multiply(adj.T > adj)  # as load_data
    features = normalize(raw_features)
    adj = normalize(adj + sp.eye(adj.shape[0]))
    features = torch.FloatTensor(np.array(features.todense()))
    labels = torch.LongTensor(np.where(labels)[1])
    adj = sparse_mx_to_torch_sparse_tensor(adj)
    idx_train = torch.LongTensor(range(12))
    return features, adj, labels, idx_train


def build_model():
    torch.manual_seed(0)
    return GCN(nfeat=FEATURES, nhid=16, nclass=CLASSES, dropout=0.0)


def example_inputs():
    features, adj, _, _ = _graph()
    return (features, adj)


def example_target():
    _, _, labels, idx_train = _graph()
    return (labels, idx_train)


def loss_fn(output, target):
    labels, idx_train = target
    return F.nll_loss(output[idx_train], labels[idx_train])
