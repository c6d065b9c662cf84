"""A two-tower model whose forward ends in its own contrastive loss, as HF's CLIPModel(return_loss=True)
and openai's CLIP write it: the normalized embeddings, the batch x batch logits (each entry pairs an
image with a text), `labels = torch.arange(len(logits))` and the cross-entropy of both directions. Up to
the embeddings every sample is computed apart; the tail pairs and couples them. Its outputs: the loss,
the logits (the tail's: the whole batch's) and the image embeddings (one row per sample)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, IMAGE, TOKENS, VOCAB, DIM = 8, 12, 6, 32, 16


class ContrastiveTowers(nn.Module):
    def __init__(self):
        super().__init__()
        self.image = nn.Sequential(nn.Linear(IMAGE, 32), nn.GELU(), nn.Linear(32, DIM))
        self.embed = nn.Embedding(VOCAB, 32)
        self.text = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, DIM))
        self.logit_scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, image, tokens):
        image_embeds = F.normalize(self.image(image), dim=-1)
        text_embeds = F.normalize(self.text(self.embed(tokens).mean(1)), dim=-1)
        logits_per_image = self.logit_scale.exp() * image_embeds @ text_embeds.t()
        labels = torch.arange(len(logits_per_image), device=logits_per_image.device)
        loss = (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_image.t(), labels)) / 2
        return loss, logits_per_image, image_embeds


def build_model():
    torch.manual_seed(0)
    return ContrastiveTowers()


def example_inputs():
    g = torch.Generator().manual_seed(1)
    return {"image": torch.randn(BATCH, IMAGE, generator=g), "tokens": torch.randint(0, VOCAB, (BATCH, TOKENS), generator=g)}


def loss_fn(output):
    return output[0]
