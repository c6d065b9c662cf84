"""mlfoundations/open_clip's CLIP (open_clip_repo/src/open_clip/{model,timm_model,loss}.py, unchanged) at a
tiny config, trained as its src/training/train.py trains it on one process:

    image_features, text_features, logit_scale = model(images, texts)
    total_loss = loss(image_features, text_features, logit_scale)

with `loss = ClipLoss(local_loss=False, gather_with_grad=False, cache_labels=True, rank=0, world_size=1,
use_horovod=False)` (train.py builds it so from its args; world_size 1 here). The model returns per-sample
L2-normalized features and `logit_scale.exp()`; only ClipLoss couples the samples: it builds the
batch x batch logits, `labels = torch.arange(num_logits)` (cached in a dict on the loss module: `cache_labels`),
and averages the cross-entropy both ways.

The copy is from commit 8f24b79 (2022-04-06, 33 commits after tag v0.2-weights), the newest commit whose
model.py import chain has no torchvision: the next commit (2856dad5) added src/open_clip/utils.py with a
module-level `from torchvision.ops.misc import FrozenBatchNorm2d`, which model.py has imported ever since.
src/open_clip/__init__.py is not copied (it imports transform.py, which needs torchvision); model.py is
imported through the namespace packages `open_clip_repo.src.open_clip`, so its relative import of
`.timm_model` works (timm_model.py imports timm in a try/except: timm is not installed, and the ViT tower
does not use it).

Exercises: a ViT image tower (patch conv, class token built by `+ torch.zeros(x.shape[0], 1, ...)`,
seq-first nn.MultiheadAttention blocks), a causal text tower with a registered (non-persistent) mask buffer,
the EOT gather `x[torch.arange(x.shape[0]), text.argmax(dim=-1)]`, F.normalize, a scalar parameter
returned through exp(), and a loss module with Python-side label caching."""

import torch

from open_clip_repo.src.open_clip.loss import ClipLoss
from open_clip_repo.src.open_clip.model import CLIP

BATCH, IMAGE, CONTEXT, VOCAB = 8, 16, 8, 64


def build_model():
    torch.manual_seed(0)
    # as factory.create_model does with a model_configs/*.json: CLIP(**model_cfg)
    model_cfg = {
        "embed_dim": 32,
        "vision_cfg": {"image_size": IMAGE, "layers": 2, "width": 128, "patch_size": 8},  # heads = 128 // 64 = 2
        "text_cfg": {"context_length": CONTEXT, "vocab_size": VOCAB, "width": 32, "heads": 4, "layers": 2},
    }
    return CLIP(**model_cfg)


def example_inputs():
    g = torch.Generator().manual_seed(1)
    images = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g)
    # as tokenizer.tokenize lays them out: start token, tokens, the end-of-text token (the highest id), zeros
    texts = torch.randint(1, VOCAB - 2, (BATCH, CONTEXT), generator=g)
    ends = torch.randint(2, CONTEXT, (BATCH,), generator=g)
    positions = torch.arange(CONTEXT)
    texts = torch.where(positions < ends[:, None], texts, 0)
    texts[:, 0] = VOCAB - 2  # <start_of_text>
    texts = torch.where(positions == ends[:, None], VOCAB - 1, texts)  # <end_of_text>
    return (images, texts)


loss = ClipLoss(local_loss=False, gather_with_grad=False, cache_labels=True, rank=0, world_size=1, use_horovod=False)


def loss_fn(output):
    image_features, text_features, logit_scale = output
    return loss(image_features, text_features, logit_scale)
