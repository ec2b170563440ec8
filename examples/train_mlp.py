"""Trains a small MLP classifier (Linear, GELU, LayerNorm, SiLU, cross-entropy, AdamW) on device
"tpu" and on the CPU from the same seed, and prints both loss curves and the throughput.

    python examples/train_mlp.py [--steps N] [--batch N] [--device tpu|cpu|both]
"""

from __future__ import annotations

import argparse
import time

import torch

import torchtpu


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.LayerNorm(128),
        torch.nn.Linear(128, 128), torch.nn.SiLU(), torch.nn.Linear(128, 10),
    )


def train(device: str, steps: int, batch: int, seed: int = 0) -> list[float]:
    torch.manual_seed(seed)
    model = make_model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    data = torch.Generator().manual_seed(seed + 1)  # the same batches on every device
    inputs = torch.randn(steps, batch, 32, generator=data)
    targets = (inputs[..., :10].argmax(-1) + torch.randint(0, 2, (steps, batch), generator=data)) % 10
    losses = []
    start = time.perf_counter()
    for step in range(steps):
        x, y = inputs[step].to(device), targets[step].to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % max(1, steps // 10) == 0 or step + 1 == steps:
            elapsed = time.perf_counter() - start
            print(f"[{device}] step {step + 1:4d}/{steps}  loss {losses[-1]:.4f}  "
                  f"{(step + 1) * batch / elapsed:,.0f} samples/s", flush=True)
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", choices=["tpu", "cpu", "both"], default="both")
    args = parser.parse_args()
    if args.device != "cpu" and not torchtpu.is_available():
        raise SystemExit(f"torchtpu could not start: {torchtpu.init_error()}")
    results = {}
    for device in (["tpu", "cpu"] if args.device == "both" else [args.device]):
        results[device] = train(device, args.steps, args.batch)
    if len(results) == 2:
        gap = max(abs(a - b) for a, b in zip(results["tpu"], results["cpu"]))
        print(f"largest loss difference tpu vs cpu: {gap:.2e}")
    if "tpu" in results:
        print(torchtpu.debug.metrics_report())


if __name__ == "__main__":
    main()
