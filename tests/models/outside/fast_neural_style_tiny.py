"""pytorch/examples' fast_neural_style/neural_style/transformer_net.py (fast_neural_style/, unchanged,
with the utils.py beside it) built as its neural_style.py trains it: `TransformerNet()` (1.7M
parameters, widths fixed in the file) on 16 x 16 images scaled to [0, 255] as its transform does
(`x.mul(255)`). Reflection padding before every convolution (9 x 9 kernels at both ends), affine
InstanceNorm2d (per-sample statistics, no running stats), stride-2 downsampling, five residual blocks
and nearest `F.interpolate` upsampling (`UpsampleConvLayer`).

The loss is neural_style.py's `content_weight * MSE + style_weight * sum of MSE of Gram matrices`
with its utils.py: `normalize_batch` (which divides the model's
output by 255 in place, `batch.div_(255.0)`) and `gram_matrix` (`view` + `bmm`), but the features
are the normalized images themselves: the script compares VGG-16 features, and its vgg.py needs
torchvision's pretrained weights. So the content loss is an MSE against the content image (the
input, as in the script) and the style loss compares the output's Gram matrix with a fixed style
image's, repeated to the batch and sliced to it (`gm_s[:n_batch]`) as the script does. Both weights
are 1: the script's (1e5, 1e10) are sized for VGG features and its Adam, which is scale invariant; on
the pixels they make a loss near 1e10 that one step of `graphsplit run`'s default SGD diverges on."""

import torch
from fast_neural_style.neural_style import utils
from fast_neural_style.neural_style.transformer_net import TransformerNet

BATCH, SIZE = 8, 16
CONTENT_WEIGHT, STYLE_WEIGHT = 1.0, 1.0  # the script's defaults, 1e5 and 1e10, are for VGG features
mse_loss = torch.nn.MSELoss()


def build_model():
    torch.manual_seed(42)  # the script's --seed
    return TransformerNet()


def _images(seed, n):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, SIZE, SIZE, generator=g).mul(255)  # ToTensor() then x.mul(255)


# as the script does before its loop: the style image repeated to the batch, its Gram matrices
_style = _images(2, 1).repeat(BATCH, 1, 1, 1)
gram_style = [utils.gram_matrix(utils.normalize_batch(_style))]  # one feature map here, four in the script


def example_inputs():
    return (_images(1, BATCH),)


def example_target():
    return _images(1, BATCH)  # the content images: the script's x


def loss_fn(y, x):
    n_batch = len(x)
    y = utils.normalize_batch(y)
    x = utils.normalize_batch(x.clone())  # in place in the script too, on each fresh batch
    features_y, features_x = [y], [x]  # the script: vgg(y), vgg(x)

    content_loss = CONTENT_WEIGHT * mse_loss(features_y[0], features_x[0])

    style_loss = 0.
    for ft_y, gm_s in zip(features_y, gram_style):
        gm_y = utils.gram_matrix(ft_y)
        style_loss += mse_loss(gm_y, gm_s[:n_batch, :, :])
    style_loss *= STYLE_WEIGHT

    return content_loss + style_loss
