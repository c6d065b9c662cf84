"""A two-tower model trained with CLIP's contrastive loss, written in loss_fn as open_clip's ClipLoss
writes it: the towers return normalized embeddings, and the loss makes the batch x batch logits and takes
`labels = torch.arange(n)` (no device). The model keeps the examples apart; the loss alone couples them,
so the loss must see the whole batch: one micro-batch per replica, the replicas' embeddings gathered."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, IMAGE, TOKENS, VOCAB, DIM = 8, 12, 6, 32, 16


class Towers(nn.Module):
    def __init__(self):
        super().__init__()
        self.image = nn.Sequential(nn.Linear(IMAGE, 32), nn.GELU(), nn.Linear(32, DIM))
        self.embed = nn.Embedding(VOCAB, 32)
        self.text = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, DIM))
        self.logit_scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, image, tokens):
        image_features = F.normalize(self.image(image), dim=-1)
        text_features = F.normalize(self.text(self.embed(tokens).mean(1)), dim=-1)
        return image_features, text_features, self.logit_scale.exp()


def build_model():
    torch.manual_seed(0)
    return Towers()


def example_inputs():
    g = torch.Generator().manual_seed(1)
    return {"image": torch.randn(BATCH, IMAGE, generator=g), "tokens": torch.randint(0, VOCAB, (BATCH, TOKENS), generator=g)}


def loss_fn(output):
    image_features, text_features, scale = output
    logits_per_image = scale * image_features @ text_features.T
    labels = torch.arange(logits_per_image.shape[0])
    return (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_image.T, labels)) / 2
