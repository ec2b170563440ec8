"""Trains a ResNet written here (BasicBlocks with BatchNorm2d and ReLU, a MaxPool2d(3, 2, 1) stem,
AdaptiveAvgPool2d(1) head) on synthetic images with SGD (momentum, weight decay), then predicts the
classes of unseen images.

    python examples/resnet.py [--steps N] [--device tpu|cpu] [--tiny] [--seed S] [--compile | --graph]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import common

CLASSES = 10
# (blocks per stage, widths of the stages, image size, batch); full size is ResNet-18 shaped
SIZES = {True: ((1, 1), (8, 16), 16, 8), False: ((2, 2, 2, 2), (32, 64, 128, 256), 32, 32)}


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, blocks: tuple[int, ...], widths: tuple[int, ...], classes: int = CLASSES):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        stages, cin = [], widths[0]
        for i, (n, cout) in enumerate(zip(blocks, widths)):
            for j in range(n):
                stages.append(BasicBlock(cin, cout, 2 if i > 0 and j == 0 else 1))
                cin = cout
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.stages(self.stem(x))).flatten(1))


def image_batches(seed: int, batch: int, size: int, held_out: bool = False) -> common.Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Images of class c are class c's random pattern (fixed by `seed`) plus noise; `held_out`
    draws images unseen in training."""
    patterns = torch.randn(CLASSES, 3, size, size, generator=common.data_generator(seed))
    gen = common.data_generator(seed, held_out)
    while True:
        labels = torch.randint(0, CLASSES, (batch,), generator=gen)
        yield patterns[labels] + torch.randn(batch, 3, size, size, generator=gen), labels


def build(tiny: bool, seed: int) -> ResNet:
    blocks, widths, _, _ = SIZES[tiny]
    return common.build_on_cpu(lambda: ResNet(blocks, widths), seed)


def train(device: str, steps: int, tiny: bool = True, seed: int = 0, model: ResNet | None = None,
          progress: bool = False, compile: bool = False, graph: bool = False) -> list[float]:
    *_, size, batch = SIZES[tiny]
    model = (build(tiny, seed) if model is None else model).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    return common.fit(model, optimizer, image_batches(seed, batch, size),
                      lambda m, x, y: F.cross_entropy(m(x), y), steps, device, "images",
                      lambda b: b[0].shape[0], progress=progress, compile=compile, graph=graph)


def infer(model: ResNet, device: str, tiny: bool, seed: int) -> None:
    *_, size, batch = SIZES[tiny]
    images, labels = next(image_batches(seed, batch, size, held_out=True))
    predicted = model(images.to(device)).argmax(dim=1).cpu()
    print(f"predicted {predicted[:16].tolist()}\nlabels    {labels[:16].tolist()}")
    print(f"accuracy on unseen images: {(predicted == labels).float().mean().item():.0%}")


if __name__ == "__main__":
    common.main(__doc__, build, train, infer, steps=100)
