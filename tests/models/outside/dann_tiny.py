"""fungtion/DANN's models/model.py and models/functions.py (dann/, unchanged): domain-adversarial
training (Ganin & Lempitsky) of its CNNModel, whose domain classifier sits behind `ReverseLayerF`, a
torch.autograd.Function that is the identity forward (`x.view_as(x)`) and multiplies the gradient by
-alpha backward (a Python float saved on ctx). Its sizes are fixed by the file (MNIST 28x28, convs of
64 and 50 channels, BatchNorm, Dropout2d with its default p=0.5: dropout is random, so graphsplit
compares it as it can). As train/main.py trains it, one step is two forwards: the source batch (MNIST,
one channel, expanded to three inside forward through `input_data.data.shape[0]`) for the class and
domain losses, and the target batch (MNIST-M, three channels) for the domain loss, at the same alpha;
`err = err_t_domain + err_s_domain + err_s_label` with NLLLoss on its LogSoftmax outputs. The step
module below (ours) makes the two calls one forward; alpha is the schedule's value at p = 0.25,
`2 / (1 + exp(-10 p)) - 1`, a Python float as in the script."""

import math
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent / "dann" / "models"))  # model.py: `from functions import ReverseLayerF`
from model import CNNModel  # noqa: E402

BATCH, IMAGE = 8, 28
ALPHA = 2.0 / (1.0 + math.exp(-10 * 0.25)) - 1


class DANNStep(nn.Module):
    """The two calls of one training step of train/main.py, as one forward."""

    def __init__(self):
        super().__init__()
        self.net = CNNModel()

    def forward(self, s_img, t_img):
        class_output, s_domain_output = self.net(input_data=s_img, alpha=ALPHA)
        _, t_domain_output = self.net(input_data=t_img, alpha=ALPHA)
        return class_output, s_domain_output, t_domain_output


def build_model():
    torch.manual_seed(0)
    return DANNStep()


def example_inputs():
    g = torch.Generator().manual_seed(1)
    s_img = torch.randn(BATCH, 1, IMAGE, IMAGE, generator=g)  # MNIST, normalized
    t_img = torch.rand(BATCH, 3, IMAGE, IMAGE, generator=g) * 2 - 1  # MNIST-M, normalized to [-1, 1]
    return (s_img, t_img)


def example_target():
    g = torch.Generator().manual_seed(2)
    return torch.randint(0, 10, (BATCH,), generator=g)  # the source digits


def loss_fn(output, s_label):
    class_output, s_domain_output, t_domain_output = output
    err_s_label = F.nll_loss(class_output, s_label)
    err_s_domain = F.nll_loss(s_domain_output, torch.zeros_like(s_label))  # domain_label = zeros(batch)
    err_t_domain = F.nll_loss(t_domain_output, torch.ones_like(s_label))  # domain_label = ones(batch)
    return err_t_domain + err_s_domain + err_s_label
