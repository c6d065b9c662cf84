"""facebookresearch/dlrm's dlrm_s_pytorch.py (dlrm/, unchanged, with the modules it imports) at a tiny
config: DLRM_Net built as its run() builds it for the Criteo Kaggle benchmark
(bench/dlrm_s_criteo_kaggle.sh: `--arch-interaction-op dot --loss-function bce`, a sigmoid on the top
MLP's last layer, NumPy-seeded init), with four small embedding tables instead of 26 large ones, and
fed as its Criteo collate function (`collate_wrapper_criteo_offset`) feeds it: dense features
log(x + 1) [batch, 13], offsets `lS_o` = arange(batch) for every table [tables, batch] and one index
per sample per table `lS_i` [tables, batch], so the batch is dim 1 of the sparse inputs and the offsets
count positions in the whole batch. Exercises `nn.EmbeddingBag(mode="sum", sparse=True)` (sparse
gradients) over a Python loop of tables, the pairwise dot interaction (`torch.bmm`) read through index
tensors built in forward from Python lists, and the BCE of its training loop (`dlrm.loss_fn`,
`torch.nn.BCELoss(reduction="mean")`) on the clicks [batch, 1]. dlrm_s_pytorch imports scikit-learn
(`sklearn.metrics`, for its evaluation) and tensorboard (`torch.utils.tensorboard`) at its top: both are
test extras."""

import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

_root = str(Path(__file__).parent / "dlrm")
if _root not in sys.path:
    sys.path.insert(0, _root)  # it imports dlrm_data_pytorch, extend_distributed, tricks.*, optim.* from there
from dlrm_s_pytorch import DLRM_Net  # noqa: E402

BATCH, DENSE = 8, 13
LN_EMB = np.array([100, 50, 80, 20])  # rows of each table (--arch-embedding-size, or the data's counts)
M_SPA = 16  # --arch-sparse-feature-size


def build_model():
    np.random.seed(123)  # --numpy-rand-seed, as run() seeds NumPy and torch before building
    torch.manual_seed(123)
    ln_bot = np.fromstring(f"{DENSE}-32-{M_SPA}", dtype=int, sep="-")  # --arch-mlp-bot
    num_fea = LN_EMB.size + 1
    num_int = (num_fea * (num_fea - 1)) // 2 + ln_bot[-1]  # dot, without self-interaction
    ln_top = np.fromstring(f"{num_int}-32-1", dtype=int, sep="-")  # str(num_int) + "-" + --arch-mlp-top
    return DLRM_Net(
        M_SPA, LN_EMB, ln_bot, ln_top, arch_interaction_op="dot", arch_interaction_itself=False,
        sigmoid_bot=-1, sigmoid_top=ln_top.size - 2, sync_dense_params=True, loss_threshold=0.0, ndevices=-1,
        qr_flag=False, qr_operation="mult", qr_collisions=4, qr_threshold=200, md_flag=False, md_threshold=200,
        weighted_pooling=None, loss_function="bce",
    )


def example_inputs():
    g = torch.Generator().manual_seed(1)
    dense_x = torch.log(torch.randint(0, 1000, (BATCH, DENSE), generator=g).float() + 1)
    lS_i = torch.stack([torch.randint(0, int(n), (BATCH,), generator=g) for n in LN_EMB])
    lS_o = torch.tensor(range(BATCH)).repeat(len(LN_EMB), 1)
    return (dense_x, lS_o, lS_i)


def example_target():
    g = torch.Generator().manual_seed(2)
    return torch.randint(0, 2, (BATCH, 1), generator=g).float()


def loss_fn(output, target):
    return F.binary_cross_entropy(output, target)  # dlrm.loss_fn = torch.nn.BCELoss(reduction="mean")
