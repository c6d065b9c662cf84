"""openai/improved-diffusion's improved_diffusion/ (unet.py, gaussian_diffusion.py, respace.py,
script_util.py, nn.py, fp16_util.py, losses.py, resample.py, __init__.py: unchanged) at a tiny config,
built as scripts/image_train.py builds it (`create_model_and_diffusion(**model_and_diffusion_defaults()
| flags)`, the README's CIFAR-10 L_hybrid flags `--learn_sigma True --noise_schedule cosine` at 32x32,
with 32 channels, one res block per level, attention at 8x8, 100 steps, dropout 0) and trained as its
train_util.TrainLoop trains it: `t, weights = schedule_sampler.sample(batch)` (uniform: weights 1),
`losses = diffusion.training_losses(model, x_start, t)`, `loss = (losses["loss"] * weights).mean()`.
The step module below (ours) holds the UNet and the diffusion and returns that loss; the timesteps and
the noise come in with the batch (the sampler's NumPy draw and `th.randn_like` in the script).
Exercises a UNet with skip connections across the U, timestep embeddings with scale-shift GroupNorm,
QKV attention blocks, the schedule's NumPy arrays gathered at t in forward
(`th.from_numpy(arr).to(device)[timesteps]`), a learned variance trained through the variational
bound on a detached mean (`model_output.detach()`), and a `th.where(t == 0, decoder_nll, kl)`."""

import numpy as np
import torch
import torch.nn as nn
from improved_diffusion.script_util import create_model_and_diffusion, model_and_diffusion_defaults

BATCH, IMAGE, STEPS = 4, 32, 100


class DiffusionTrainStep(nn.Module):
    def __init__(self, model, diffusion):
        super().__init__()
        self.model = model
        self.diffusion = diffusion

    def forward(self, x_start, t, noise):
        losses = self.diffusion.training_losses(self.model, x_start, t, noise=noise)
        return losses["loss"].mean()  # (losses["loss"] * weights).mean(), the uniform sampler's weights are 1


def build_model(use_checkpoint=False):
    torch.manual_seed(0)
    args = model_and_diffusion_defaults()
    args.update(image_size=IMAGE, num_channels=32, num_res_blocks=1, num_heads=2, attention_resolutions="8",
                learn_sigma=True, diffusion_steps=STEPS, noise_schedule="cosine", dropout=0.0,
                use_checkpoint=use_checkpoint)
    model, diffusion = create_model_and_diffusion(**args)
    return DiffusionTrainStep(model, diffusion)


def example_inputs():
    g = torch.Generator().manual_seed(1)
    x_start = torch.rand(BATCH, 3, IMAGE, IMAGE, generator=g) * 2 - 1  # images scaled to [-1, 1]
    rng = np.random.RandomState(2)
    t = torch.from_numpy(rng.choice(STEPS, size=(BATCH,))).long()  # UniformSampler.sample
    t[0] = 0  # one sample at t = 0, the decoder's NLL branch
    noise = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g)
    return (x_start, t, noise)
