"""What the example training programs share: the command line, seeding, synthetic batches, the
training loop with its progress bar (loss and throughput), and the report at the end.

An example module defines

    build(tiny, seed) -> nn.Module              the model, initialised on the CPU from `seed`
    train(device, steps, tiny=True, seed=0, model=None, progress=False, compile=False) -> list[float]
    infer(model, device, tiny, seed) -> None     prints generations or predictions

and ends with `common.main(__doc__, build, train, infer)`. `train` calls `fit` below, so every
example trains the same way: the model is built on the CPU and then moved, and every batch is
drawn on the CPU from a generator seeded by `seed`, so a tpu run and a CPU run with one seed see
the same weights and the same data. With `compile`, `fit` runs each training step as compiled
XLA graphs (`torch.compile(backend="tpu")`) instead of op by op.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable, Iterator

import torch
from tqdm import tqdm

import torchtpu


def parse_args(doc: str, steps: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=steps, help=f"training steps (default {steps})")
    parser.add_argument("--device", choices=["tpu", "cpu"], default="tpu")
    parser.add_argument("--tiny", action="store_true", help="the small configuration the tests run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", action="store_true",
                        help="run forward/backward and the optimizer step as compiled XLA graphs: "
                             "torch.compile(backend='tpu')")
    return parser.parse_args()


def build_on_cpu(make: Callable[[], torch.nn.Module], seed: int) -> torch.nn.Module:
    """`make()` with the global CPU generator seeded: the same initial weights for every device."""
    torch.manual_seed(seed)
    with torch.device("cpu"):
        return make()


def data_generator(seed: int, held_out: bool = False) -> torch.Generator:
    """The CPU generator synthetic data is drawn from: the training stream, or with `held_out` a
    second stream for inference on samples the model has not seen."""
    return torch.Generator().manual_seed(2 * seed + 1 + int(held_out))


class Progress:
    """A progress bar over training steps showing the last loss and `unit`s per second.

    The rate is measured from the end of the first step on, so compiling the first step's
    kernels does not count (it shows the first step's own rate until a second one ends)."""

    def __init__(self, steps: int, desc: str, unit: str, enabled: bool = True):
        self.bar = tqdm(total=steps, desc=desc, unit="step", disable=not enabled, dynamic_ncols=True)
        self.unit = unit
        self.count = 0
        self.start = time.perf_counter()
        self.steps = 0

    def update(self, loss: float, count: int) -> None:
        now = time.perf_counter()
        self.steps += 1
        if self.steps == 2:  # restart the clock after the first step
            self.count, self.start = 0, self.last
        self.count += count
        self.last = now
        rate = self.count / max(now - self.start, 1e-9)
        self.bar.set_postfix_str(f"loss {loss:.4f}, {rate:,.0f} {self.unit}/s", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def fit(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: Iterator[tuple],
        loss_fn: Callable[..., torch.Tensor], steps: int, device: str, unit: str,
        per_batch: Callable[[tuple], int], clip: float | None = None, progress: bool = False,
        compile: bool = False) -> list[float]:
    """Trains `model` (already on `device`) for `steps` steps and returns the losses.

    `batches` yields tuples of CPU tensors; each is moved to `device` and given to
    `loss_fn(model, *batch)`. `per_batch(batch)` counts the batch's `unit`s (tokens, images, ...)
    for the throughput; `clip` is the max gradient norm, if any. `.item()` on each step's loss
    waits for the step, so the bar's rate is the real one.

    With `compile`, `loss_fn` runs compiled with `torch.compile(backend="tpu")`: the model's
    forward and the loss are one graph, their backward another. The gradient clipping and the
    optimizer step are one more compiled function. The first step captures and compiles the graphs.
    """
    model.train()

    def update() -> None:
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()

    if compile:
        # The loss rather than just the model: a loss computed outside the model (cross-entropy
        # of its logits) would otherwise run op by op, and a model's own loss method (minGPT's
        # `model.loss`) would call the uncompiled forward.
        loss_fn = torch.compile(loss_fn, backend="tpu")
        update = torch.compile(update, backend="tpu")
    bar = Progress(steps, f"{type(model).__name__} on {device}" + (", compiled" if compile else ""), unit,
                   enabled=progress)
    losses = []
    try:
        for _, batch in zip(range(steps), batches):
            batch = tuple(t.to(device) for t in batch)
            loss = loss_fn(model, *batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            update()
            losses.append(loss.item())
            bar.update(losses[-1], per_batch(batch))
    finally:
        bar.close()
    return losses


def main(doc: str, build: Callable, train: Callable, infer: Callable, steps: int = 100) -> None:
    """The command line of every example: train, infer, then say what ran on the CPU."""
    args = parse_args(doc, steps)
    if args.device == "tpu" and not torchtpu.is_available():
        raise SystemExit(f"torchtpu could not start: {torchtpu.init_error()}")
    if args.compile and args.device != "tpu":
        raise SystemExit("--compile compiles for tpu (torch.compile(backend='tpu')); drop it with --device cpu")
    model = build(args.tiny, args.seed)
    losses = train(args.device, args.steps, tiny=args.tiny, seed=args.seed, model=model, progress=True,
                   compile=args.compile)
    if losses:
        print(f"loss: first {losses[0]:.4f}, last {losses[-1]:.4f}")
    with torch.no_grad():
        model.eval()
        # A compiled model's own methods stay uncompiled: the examples that generate (model.generate)
        # run eagerly, since every generated token is a sequence one longer, which a compiled
        # forward would capture and compile anew, token by token.
        infer(torch.compile(model, backend="tpu") if args.compile else model, args.device, args.tiny, args.seed)
    if args.device == "tpu":
        fallbacks = torchtpu.debug.metrics()["cpu_fallbacks"]
        print(f"ops that ran on the CPU: {len(fallbacks)}"
              + "".join(f"\n  {op}: {n} calls" for op, n in sorted(fallbacks.items(), key=lambda kv: -kv[1])))


# Language models: sequences a model can learn, and a check of what it generates.

def progressions(gen: torch.Generator, batch: int, length: int, vocab: int) -> torch.Tensor:
    """`batch` arithmetic progressions modulo `vocab` (random start, stride 1..4): the next token
    follows from the two before it, so a small model learns them in a few hundred steps."""
    start = torch.randint(0, vocab, (batch, 1), generator=gen)
    stride = torch.randint(1, 5, (batch, 1), generator=gen)
    return (start + stride * torch.arange(length)) % vocab


def token_batches(seed: int, batch: int, length: int, vocab: int) -> Iterator[tuple[torch.Tensor]]:
    gen = data_generator(seed)
    while True:
        yield (progressions(gen, batch, length, vocab),)


def show_generations(generate: Callable[[torch.Tensor, int], torch.Tensor], device: str, vocab: int,
                     seed: int, prompts: int = 4, prompt_len: int = 4, new_tokens: int = 8) -> float:
    """Prompts with the start of unseen progressions, prints what `generate(ids, new_tokens)`
    continues them with, and returns the fraction of generated tokens that are right."""
    expected = progressions(data_generator(seed, held_out=True), prompts, prompt_len + new_tokens, vocab)
    out = generate(expected[:, :prompt_len].to(device), new_tokens).cpu()[:, :prompt_len + new_tokens]
    for row, want in zip(out.tolist(), expected.tolist()):
        print(f"  {row[:prompt_len]} -> {row[prompt_len:]}  (expected {want[prompt_len:]})")
    right = (out[:, prompt_len:] == expected[:, prompt_len:]).float().mean().item()
    print(f"generated tokens that continue the progression: {right:.0%}")
    return right


def train_causal_lm(model: torch.nn.Module, device: str, steps: int, seed: int, batch: int, length: int,
                    vocab: int, progress: bool, compile: bool = False) -> list[float]:
    """Trains a transformers causal LM (`model(input_ids=, labels=).loss`) on token progressions
    with AdamW and gradient clipping; returns the losses."""
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    return fit(model, optimizer, token_batches(seed, batch, length, vocab),
               lambda m, ids: m(input_ids=ids, labels=ids).loss, steps, device, "tokens",
               lambda b: b[0].numel(), clip=1.0, progress=progress, compile=compile)


def generate_greedily(model: torch.nn.Module, device: str, vocab: int, seed: int) -> float:
    """A transformers causal LM continues unseen progressions with greedy `generate`."""
    def generate(ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False)
    return show_generations(generate, device, vocab, seed)
