"""Trains a small UNet written here (3x3 convolutions with GroupNorm and SiLU, MaxPool2d down,
nearest Upsample(scale_factor=2) up, skip connections concatenated) to predict the noise added to
synthetic smooth images (MSE, AdamW), then denoises unseen images.

    python examples/unet.py [--steps N] [--device tpu|cpu] [--tiny] [--seed S] [--compile | --graph]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import common

# (widths of the levels, image size, batch)
SIZES = {True: ((8, 16), 16, 4), False: ((32, 64, 128), 32, 16)}


class ConvBlock(nn.Sequential):
    def __init__(self, cin: int, cout: int):
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(4, cout), nn.SiLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(4, cout), nn.SiLU())


class UNet(nn.Module):
    def __init__(self, widths: tuple[int, ...], channels: int = 3):
        super().__init__()
        self.down = nn.ModuleList()
        cin = channels
        for w in widths[:-1]:
            self.down.append(ConvBlock(cin, w))
            cin = w
        self.pool = nn.MaxPool2d(2)
        self.middle = ConvBlock(cin, widths[-1])
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        self.up = nn.ModuleList(ConvBlock(w_below + w, w) for w_below, w in zip(widths[:0:-1], widths[-2::-1]))
        self.out = nn.Conv2d(widths[0], channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = self.pool(x)
        x = self.middle(x)
        for block in self.up:
            x = block(torch.cat([self.upsample(x), skips.pop()], dim=1))
        return self.out(x)


def noisy_batches(seed: int, batch: int, size: int, held_out: bool = False) -> common.Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(noisy image, noise): smooth random images (4x4 noise upsampled bilinearly) plus Gaussian
    noise of a random strength between 0.1 and 0.5 per image."""
    gen = common.data_generator(seed, held_out)
    while True:
        clean = F.interpolate(torch.randn(batch, 3, 4, 4, generator=gen), size=(size, size), mode="bilinear",
                              align_corners=False)
        noise = torch.randn(batch, 3, size, size, generator=gen) * (0.1 + 0.4 * torch.rand(batch, 1, 1, 1, generator=gen))
        yield clean + noise, noise


def build(tiny: bool, seed: int) -> UNet:
    return common.build_on_cpu(lambda: UNet(SIZES[tiny][0]), seed)


def train(device: str, steps: int, tiny: bool = True, seed: int = 0, model: UNet | None = None,
          progress: bool = False, compile: bool = False, graph: bool = False) -> list[float]:
    _, size, batch = SIZES[tiny]
    model = (build(tiny, seed) if model is None else model).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    return common.fit(model, optimizer, noisy_batches(seed, batch, size),
                      lambda m, noisy, noise: F.mse_loss(m(noisy), noise), steps, device, "images",
                      lambda b: b[0].shape[0], progress=progress, compile=compile, graph=graph)


def infer(model: UNet, device: str, tiny: bool, seed: int) -> None:
    _, size, batch = SIZES[tiny]
    noisy, noise = next(noisy_batches(seed, batch, size, held_out=True))
    denoised = noisy - model(noisy.to(device)).cpu()
    clean = noisy - noise
    print(f"mean squared error to the clean images: noisy {F.mse_loss(noisy, clean).item():.4f}, "
          f"denoised {F.mse_loss(denoised, clean).item():.4f}")


if __name__ == "__main__":
    common.main(__doc__, build, train, infer, steps=200)
