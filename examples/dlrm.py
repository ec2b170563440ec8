"""Trains DLRM, the deep learning recommendation model, written here: a bottom MLP over dense
features, one EmbeddingBag table (sum of a bag of ids, given as indices and offsets) per sparse
feature, pairwise dot-product interaction of all feature vectors (bmm, then the strict upper
triangle), and a top MLP giving a click logit; BCEWithLogits loss, AdamW. Then it
predicts clicks for unseen samples.

    python examples/dlrm.py [--steps N] [--device tpu|cpu] [--tiny] [--seed S] [--compile | --graph]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import common

DENSE = 13
# (rows of each table, embedding width, bottom MLP hidden, top MLP hidden, batch)
SIZES = {True: ((20, 30, 40), 8, (16,), (16,), 8), False: ((1000, 500, 2000, 100, 800, 50, 300, 1500), 16, (64, 32), (64, 32), 128)}


def mlp(widths: list[int], last_relu: bool) -> nn.Sequential:
    layers = []
    for i, (cin, cout) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(cin, cout))
        if last_relu or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, rows: tuple[int, ...], width: int, bottom: tuple[int, ...], top: tuple[int, ...]):
        super().__init__()
        self.bottom = mlp([DENSE, *bottom, width], last_relu=True)
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, width, mode="sum") for n in rows)
        features = len(rows) + 1
        i, j = torch.triu_indices(features, features, offset=1)
        self.register_buffer("pair_i", i, persistent=False)
        self.register_buffer("pair_j", j, persistent=False)
        self.top = mlp([width + features * (features - 1) // 2, *top, 1], last_relu=False)
        for table in self.tables:
            nn.init.uniform_(table.weight, -(table.num_embeddings ** -0.5), table.num_embeddings ** -0.5)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """dense: (batch, DENSE); ids: (tables, n) ids of every bag of a table back to back;
        offsets: (tables, batch) where each sample's bag starts in its table's ids."""
        x = self.bottom(dense)
        vectors = torch.stack([x] + [table(ids[t], offsets[t]) for t, table in enumerate(self.tables)], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))          # (batch, features, features)
        pairs = dots[:, self.pair_i, self.pair_j]                  # each pair once
        return self.top(torch.cat([x, pairs], dim=1)).squeeze(1)


def click_batches(seed: int, rows: tuple[int, ...], batch: int, held_out: bool = False) -> common.Iterator[tuple[torch.Tensor, ...]]:
    """Samples whose click probability is a hidden logistic function (fixed by `seed`) of the
    dense features and a hidden score of each id in their bags; bags hold 2 ids on average, some
    none. `held_out` draws samples unseen in training."""
    gen = common.data_generator(seed)
    w_dense = torch.randn(DENSE, generator=gen) / DENSE ** 0.5
    scores = [torch.randn(n, generator=gen) for n in rows]
    gen = common.data_generator(seed, held_out)
    n = 2 * batch
    while True:
        dense = torch.randn(batch, DENSE, generator=gen)
        ids = torch.stack([torch.randint(0, r, (n,), generator=gen) for r in rows])
        cuts = torch.randint(0, n + 1, (len(rows), batch - 1), generator=gen).sort(dim=1).values
        offsets = torch.cat([torch.zeros(len(rows), 1, dtype=torch.long), cuts], dim=1)
        logit = dense @ w_dense
        for t, s in enumerate(scores):
            logit = logit + F.embedding_bag(ids[t], s[:, None], offsets[t], mode="sum").squeeze(1) / 2
        yield dense, ids, offsets, torch.bernoulli(torch.sigmoid(logit), generator=gen)


def build(tiny: bool, seed: int) -> DLRM:
    rows, width, bottom, top, _ = SIZES[tiny]
    return common.build_on_cpu(lambda: DLRM(rows, width, bottom, top), seed)


def train(device: str, steps: int, tiny: bool = True, seed: int = 0, model: DLRM | None = None,
          progress: bool = False, compile: bool = False, graph: bool = False) -> list[float]:
    rows, *_, batch = SIZES[tiny]
    model = (build(tiny, seed) if model is None else model).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    return common.fit(model, optimizer, click_batches(seed, rows, batch),
                      lambda m, dense, ids, offsets, y: F.binary_cross_entropy_with_logits(m(dense, ids, offsets), y),
                      steps, device, "samples", lambda b: b[0].shape[0], progress=progress, compile=compile, graph=graph)


def infer(model: DLRM, device: str, tiny: bool, seed: int) -> None:
    rows, *_, batch = SIZES[tiny]
    *inputs, clicked = next(click_batches(seed, rows, batch, held_out=True))
    p = torch.sigmoid(model(*(t.to(device) for t in inputs))).cpu()
    print(f"click probability {[round(v, 2) for v in p[:8].tolist()]}\nclicked           {clicked[:8].int().tolist()}")
    print(f"accuracy on unseen samples: {((p > 0.5).float() == clicked).float().mean().item():.0%} "
          f"(always guessing the majority: {max(clicked.mean().item(), 1 - clicked.mean().item()):.0%})")


if __name__ == "__main__":
    common.main(__doc__, build, train, infer, steps=300)
