"""openai/CLIP's clip/model.py (openai_clip/clip/, unchanged; its clip/__init__.py is not copied: it
imports clip.py, which needs torchvision) at a tiny config: the two-tower contrastive model, a vision
transformer (patch conv, class token, seq-first nn.MultiheadAttention blocks) and a causal text
transformer whose causal mask is a plain tensor attribute (`self.attn_mask`, not a buffer, moved with
`.to()` and stored again in every forward), the text feature read at each row's end-of-text token
(`x[torch.arange(x.shape[0]), text.argmax(dim=-1)]`), L2-normalized features and a learned
temperature. `model(image, text)` returns the batch-by-batch similarity logits
(`logits_per_image`, `logits_per_text`): every sample's logits depend on every other sample of the
batch. Trained with the loss of the paper's pseudo-code (its Figure 3): labels = arange(batch),
cross-entropy over the rows of both logits, averaged."""

import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

_spec = importlib.util.spec_from_file_location("openai_clip_model", Path(__file__).parent / "openai_clip" / "clip" / "model.py")
clip_model = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = clip_model
_spec.loader.exec_module(clip_model)

BATCH, IMAGE, CONTEXT, VOCAB = 8, 16, 8, 64


def build_model():
    torch.manual_seed(0)
    return clip_model.CLIP(
        embed_dim=32,
        image_resolution=IMAGE, vision_layers=2, vision_width=128, vision_patch_size=8,  # 128 // 64 = 2 heads
        context_length=CONTEXT, vocab_size=VOCAB, transformer_width=32, transformer_heads=4, transformer_layers=2,
    )


def example_inputs():
    g = torch.Generator().manual_seed(1)
    image = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g)
    # as clip.tokenize lays them out: tokens, the end-of-text token (the highest id), zeros after it
    text = torch.randint(1, VOCAB - 1, (BATCH, CONTEXT), generator=g)
    ends = torch.randint(2, CONTEXT, (BATCH,), generator=g)
    positions = torch.arange(CONTEXT)
    text = torch.where(positions < ends[:, None], text, 0)
    text = torch.where(positions == ends[:, None], VOCAB - 1, text)
    return (image, text)


def loss_fn(output):
    logits_per_image, logits_per_text = output
    labels = torch.arange(logits_per_image.shape[0])  # np.arange(n) in the paper
    return (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2
