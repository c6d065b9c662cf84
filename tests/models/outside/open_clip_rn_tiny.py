"""mlfoundations/open_clip's CLIP with its ModifiedResNet image tower (the RN50 family: `vision_cfg.layers` a
tuple), the same unchanged files and commit as open_clip_tiny.py (open_clip_repo/src/open_clip/, 8f24b79,
2022-04-06; see there why that commit), trained as src/training/train.py does on one process:
`image_features, text_features, logit_scale = model(images, texts)`, then `ClipLoss(..., cache_labels=True,
rank=0, world_size=1)`.

Exercises, besides what open_clip_tiny.py does: BatchNorm2d in train mode in every Bottleneck (batch statistics
couple the samples inside the model too, not only in the loss), the 3-conv stem with AvgPool2d, anti-aliased
strided downsampling (an AvgPool2d before the strided 1x1 conv), and AttentionPool2d, which calls
`F.multi_head_attention_forward` itself with separate q/k/v projection weights (`use_separate_proj_weight=True`)
over the flattened spatial tokens plus their mean. RN50 is layers (3, 4, 6, 3), width 64, 224px; here
layers (1, 1, 1, 1), width 8 (heads = width * 32 // 64 = 4, final width 256), 32x32 images (1x1 after /32)."""

import torch

from open_clip_repo.src.open_clip.loss import ClipLoss
from open_clip_repo.src.open_clip.model import CLIP

BATCH, IMAGE, CONTEXT, VOCAB = 8, 32, 8, 64


def build_model():
    torch.manual_seed(0)
    model_cfg = {  # as model_configs/RN50.json, tiny
        "embed_dim": 32,
        "vision_cfg": {"image_size": IMAGE, "layers": [1, 1, 1, 1], "width": 8, "patch_size": None},
        "text_cfg": {"context_length": CONTEXT, "vocab_size": VOCAB, "width": 32, "heads": 4, "layers": 2},
    }
    return CLIP(**model_cfg)


def example_inputs():
    g = torch.Generator().manual_seed(1)
    images = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g)
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
