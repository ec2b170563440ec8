"""What the example training programs share: the command line, seeding, synthetic batches, the
training loop with its progress bar (loss and throughput), and the report at the end.

An example module defines

    build(tiny, seed) -> nn.Module              the model, initialised on the CPU from `seed`
    train(device, steps, tiny=True, seed=0, model=None, progress=False, compile=False, graph=False) -> list[float]
    infer(model, device, tiny, seed) -> None     prints generations or predictions

and ends with `common.main(__doc__, build, train, infer)`. An example whose `train` also takes
`parallel=None` (a `Parallel`, handed on to `fit`) trains across the processes torchrun starts with
`--ddp`, `--fsdp` or `--tp`; see `Parallel`. `train` calls `fit` below, so every
example trains the same way: the model is built on the CPU and then moved, and every batch is
drawn on the CPU from a generator seeded by `seed`, so a tpu run and a CPU run with one seed see
the same weights and the same data. With `compile`, `fit` runs each training step as compiled
XLA graphs (`torch.compile(backend="tpu")`) instead of op by op; with `graph`, the whole step is
captured once by `torch.tpu.graph` and replayed (one module per step).
"""

from __future__ import annotations

import argparse
import inspect
import os
import time
from dataclasses import dataclass
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
    parser.add_argument("--graph", action="store_true",
                        help="capture the whole train step once (torch.tpu.graph) and replay it: one XLA module per step")
    parallel = parser.add_mutually_exclusive_group()
    for mode, what in PARALLEL_MODES.items():
        parallel.add_argument(f"--{mode}", dest="parallel", action="store_const", const=mode,
                              help=f"{what}; launch with torchrun, one process per device")
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


# Distributed training: one process per device, started by torchrun.

PARALLEL_MODES = {
    "ddp": "data parallel: DistributedDataParallel, each rank trains on its slice of the batch",
    "fsdp": "fully sharded data parallel (FSDP2 fully_shard per block, then the root): "
            "each rank holds a shard of the weights and trains on its slice of the batch",
    "tp": "tensor parallel (DTensor parallelize_module): the blocks' linear layers split across "
          "the ranks, every rank trains on the whole batch",
}


@dataclass
class Parallel:
    """A training run spread over the processes torchrun started (`Parallel.start`).

    `mode` is "ddp", "fsdp" or "tp". For ddp and fsdp the batch every rank draws (the same one: the
    data stream is seeded alike everywhere) is the global batch and each rank trains on its slice
    of it (`shard`); gradients are averaged over the ranks, so a step is the step one process
    would take on the whole batch. For tp every rank takes the whole batch. The reported loss is
    the mean over the ranks (`mean`), and throughput counts the global batch's units."""

    mode: str
    rank: int
    local_rank: int
    world: int
    device: str  # this process's device: "tpu:<local rank>", or "cpu"

    @property
    def main(self) -> bool:
        """Whether this is rank 0, the process that prints."""
        return self.rank == 0

    @classmethod
    def start(cls, mode: str, device: str) -> "Parallel":
        """Joins the process group torchrun set up (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT):
        on tpu each process drives device `tpu:<local rank>` over the "tpu" c10d backend; on the
        CPU the processes use gloo."""
        import torch.distributed as dist

        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise SystemExit(f"--{mode} runs one process per device: launch it with torchrun, e.g. "
                             f"torchrun --standalone --nproc-per-node 2 examples/<name>.py --{mode}")
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        if device == "tpu":
            if local_rank >= torch.tpu.device_count():
                raise SystemExit(f"local rank {local_rank}, but this host has {torch.tpu.device_count()} tpu devices")
            torch.tpu.set_device(local_rank)
            dist.init_process_group(device_id=torch.device("tpu", local_rank))  # the "tpu" backend
            device = f"tpu:{local_rank}"
        else:
            dist.init_process_group("gloo")
        return cls(mode, rank, local_rank, world, device)

    def stop(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()

    def wrap(self, model: torch.nn.Module, blocks: list[torch.nn.Module],
             tp_plan: dict[str, object] | None = None) -> torch.nn.Module:
        """`model` (on this rank's device) made to train in `mode`: wrapped in DDP, sharded with
        FSDP2 (each of `blocks`, its transformer blocks, then the root: the rest), or with each
        block split by `tp_plan` ({submodule name within a block: ParallelStyle}). Build the
        optimizer on the returned model's parameters (DTensors for fsdp and tp)."""
        from torch.distributed.device_mesh import init_device_mesh

        if self.mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel(model)
        mesh = init_device_mesh(torch.device(self.device).type, (self.world,))
        if self.mode == "fsdp":
            from torch.distributed.fsdp import fully_shard

            for block in blocks:
                fully_shard(block, mesh=mesh)
            return fully_shard(model, mesh=mesh)
        if self.mode == "tp":
            from torch.distributed.tensor.parallel import parallelize_module

            if not tp_plan:
                raise SystemExit("this example has no tensor-parallel plan")
            for block in blocks:
                parallelize_module(block, mesh, tp_plan)
            return model
        raise ValueError(f"unknown parallel mode {self.mode!r}")

    @property
    def foreach(self) -> bool | None:
        """The optimizer's `foreach`: tensor parallel leaves the layers outside its plan (embeddings,
        norms, the head) plain tensors beside its DTensors, and one foreach kernel cannot take
        both, so with tp the optimizer updates parameter by parameter (None: its default)."""
        return False if self.mode == "tp" else None

    def shard(self, batch: tuple) -> tuple:
        """This rank's part of the global `batch`: its slice along dim 0 (ddp, fsdp), or all of it (tp)."""
        if self.mode == "tp":
            return batch
        rows = batch[0].shape[0]
        if rows % self.world:
            raise SystemExit(f"--{self.mode}: the batch of {rows} does not split evenly over {self.world} ranks")
        size = rows // self.world
        return tuple(t[self.rank * size:(self.rank + 1) * size] for t in batch)

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of `value` over the ranks (a new tensor; a sum, divided: gloo, which --device cpu
        uses, has no AVG)."""
        import torch.distributed as dist

        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value / self.world


def clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float) -> None:
    """torch.nn.utils.clip_grad_norm_, also for a mix of DTensor and plain gradients (tensor
    parallel leaves the layers outside its plan unsplit), which clip_grad_norm_ cannot stack:
    each gradient's norm is taken whole (a DTensor's over all ranks, `full_tensor`), and each
    rank scales its local part of the gradients."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in parameters if p.grad is not None]
    kinds = {isinstance(g, DTensor) for g in grads}
    if len(kinds) < 2:
        torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        return
    norms = [torch.linalg.vector_norm(g) for g in grads]
    norms = [n.full_tensor() if isinstance(n, DTensor) else n for n in norms]
    total = torch.linalg.vector_norm(torch.stack(norms))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    torch._foreach_mul_([g.to_local() if isinstance(g, DTensor) else g for g in grads], coef)


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
        compile: bool = False, graph: bool = False, parallel: Parallel | None = None) -> list[float]:
    """Trains `model` (already on `device`) for `steps` steps and returns the losses.

    `batches` yields tuples of CPU tensors; each is moved to `device` and given to
    `loss_fn(model, *batch)`. `per_batch(batch)` counts the batch's `unit`s (tokens, images, ...)
    for the throughput; `clip` is the max gradient norm, if any. `.item()` on each step's loss
    waits for the step, so the bar's rate is the real one.

    With `compile`, `loss_fn` runs compiled with `torch.compile(backend="tpu")`: the model's
    forward and the loss are one graph, their backward another. The gradient clipping and the
    optimizer step are one more compiled function. The first step captures and compiles the graphs.

    With `graph`, the whole step (forward, backward, clipping, optimizer step) is captured once by
    `torch.tpu.graph` after two eager steps and replayed on every batch: one module per step.

    With `parallel`, `model` is already wrapped (`Parallel.wrap`) and this process is one rank:
    it trains on its part of each batch (`Parallel.shard`), the losses are the mean over the
    ranks, and only rank 0 shows the bar, counting the units of the whole (global) batch.
    """
    model.train()

    def update() -> None:
        if clip is not None:
            if parallel is None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            else:
                clip_grad_norm(list(model.parameters()), clip)
        optimizer.step()

    if compile:
        # The loss rather than just the model: a loss computed outside the model (cross-entropy
        # of its logits) would otherwise run op by op, and a model's own loss method (minGPT's
        # `model.loss`) would call the uncompiled forward.
        loss_fn = torch.compile(loss_fn, backend="tpu")
        update = torch.compile(update, backend="tpu")
    desc = f"{type(model).__name__} on {device}" + (", compiled" if compile else "")
    if parallel is not None:
        desc += f", {parallel.mode} over {parallel.world} ranks"
    bar = Progress(steps, desc, unit, enabled=progress and (parallel is None or parallel.main))
    def step(*batch) -> torch.Tensor:
        loss = loss_fn(model, *batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        update()
        return loss

    if graph:
        step = GraphedStep(step, optimizer)
    losses = []
    try:
        for _, batch in zip(range(steps), batches):
            count = per_batch(batch)  # the global batch's units, when there are ranks
            if parallel is not None:
                batch = parallel.shard(batch)
            batch = tuple(t.to(device) for t in batch)
            loss = step(*batch)
            losses.append((loss if parallel is None else parallel.mean(loss)).item())
            bar.update(losses[-1], count)
    finally:
        bar.close()
    return losses


class GraphedStep:
    """A train step run eagerly on its first two batches (the optimizer makes its state), then
    captured by torch.tpu.graph and replayed on each batch of the captured shapes: the batch is
    copied into the graph's static inputs and the returned loss is the captured one, rewritten by
    the replay. A batch of other shapes runs eagerly."""

    def __init__(self, step: Callable[..., torch.Tensor], optimizer: torch.optim.Optimizer):
        # A graph replays what ran on tpu only: the optimizer's step counts must live there.
        for group in optimizer.param_groups:
            if "capturable" in group:
                group["capturable"] = True
        self.step, self.eager_steps = step, 2
        self.graph, self.static_batch, self.static_loss = None, (), None

    def __call__(self, *batch: torch.Tensor) -> torch.Tensor:
        if self.eager_steps:
            self.eager_steps -= 1
            return self.step(*batch)
        if self.graph is None:
            self.static_batch = batch  # this step's tensors: later batches are copied into them
            self.graph = torch.tpu.TPUGraph()
            with torch.tpu.graph(self.graph):
                self.static_loss = self.step(*self.static_batch)
        if any(s.shape != t.shape or s.dtype != t.dtype for s, t in zip(self.static_batch, batch)):
            return self.step(*batch)
        for static, t in zip(self.static_batch, batch):
            if static is not t:
                static.copy_(t)
        self.graph.replay()
        return self.static_loss


def main(doc: str, build: Callable, train: Callable, infer: Callable, steps: int = 100) -> None:
    """The command line of every example: train, infer, then say what ran on the CPU. With
    --ddp/--fsdp/--tp (under torchrun) every rank trains and rank 0 prints."""
    args = parse_args(doc, steps)
    if args.device == "tpu" and not torchtpu.is_available():
        raise SystemExit(f"torchtpu could not start: {torchtpu.init_error()}")
    if args.compile and args.device != "tpu":
        raise SystemExit("--compile compiles for tpu (torch.compile(backend='tpu')); drop it with --device cpu")
    if args.graph and (args.device != "tpu" or args.compile or args.parallel):
        raise SystemExit("--graph captures tpu work of one process: not with --device cpu, --compile or "
                         "--ddp/--fsdp/--tp (their collectives run on the host)")
    if args.parallel is None:
        parallel, device, extra = None, args.device, {}
    else:
        if "parallel" not in inspect.signature(train).parameters:
            raise SystemExit(f"this example does not train distributed (--{args.parallel})")
        if args.compile and args.parallel == "tp":
            # Not tried: DTensor's compiled forward and backward under the host transport.
            raise SystemExit("--compile with --tp is not supported by the examples")
        parallel = Parallel.start(args.parallel, args.device)
        device, extra = parallel.device, {"parallel": parallel}
    try:
        model = build(args.tiny, args.seed)
        losses = train(device, args.steps, tiny=args.tiny, seed=args.seed, model=model, progress=True,
                       compile=args.compile, graph=args.graph, **extra)
        if parallel is None or parallel.main:
            if losses:
                print(f"loss: first {losses[0]:.4f}, last {losses[-1]:.4f}"
                      + (" (mean over the ranks)" if parallel is not None else ""))
            if parallel is not None and parallel.mode != "ddp":
                # FSDP's weights are sharded over the ranks and TP's layers split: a forward takes
                # collectives of every rank, which generation (rank 0 alone, token by token) has not.
                print(f"inference skipped with --{parallel.mode}: the model's weights are spread over the ranks")
            else:
                with torch.no_grad():
                    # With DDP `model` is the trained module itself (DDP wraps it, sharing its weights).
                    model.eval()
                    # A compiled model's own methods stay uncompiled: the examples that generate
                    # (model.generate) run eagerly, since every generated token is a sequence one
                    # longer, which a compiled forward would capture and compile anew, token by token.
                    infer(torch.compile(model, backend="tpu") if args.compile else model, device, args.tiny, args.seed)
            if args.device == "tpu":
                fallbacks = torchtpu.debug.metrics()["cpu_fallbacks"]
                print(f"ops that ran on the CPU{' (rank 0)' if parallel is not None else ''}: {len(fallbacks)}"
                      + "".join(f"\n  {op}: {n} calls" for op, n in sorted(fallbacks.items(), key=lambda kv: -kv[1])))
        if parallel is not None:
            import torch.distributed as dist

            dist.barrier()  # the other ranks wait for rank 0's inference
    finally:
        if parallel is not None:
            parallel.stop()


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


def decoder_tp_plan() -> dict[str, object]:
    """Tensor parallelism for a transformers decoder layer (Llama, Qwen, Mistral: `self_attn`
    with q/k/v/o_proj, `mlp` with gate/up/down_proj), Megatron style: q, k, v, gate and up split
    by output features (ColwiseParallel), o and down by input features (RowwiseParallel, whose
    output is summed over the ranks). A rank's q/k/v then hold a contiguous run of whole heads:
    the attention views them as (-1, head_dim), so it runs on heads/world query and
    kv_heads/world key-value heads, and its query-to-kv grouping (heads // kv_heads, from the
    config) stays right. Both head counts must divide by the number of ranks."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel()}


def train_causal_lm(model: torch.nn.Module, device: str, steps: int, seed: int, batch: int, length: int,
                    vocab: int, progress: bool, compile: bool = False, graph: bool = False,
                    parallel: Parallel | None = None) -> list[float]:
    """Trains a transformers causal LM (`model(input_ids=, labels=).loss`) on token progressions
    with AdamW and gradient clipping; returns the losses. With `parallel`, `batch` is the global
    batch and the decoder layers (`model.model.layers`) are the blocks FSDP shards and TP splits."""
    model = model.to(device)
    if parallel is not None:
        if parallel.mode == "tp":
            heads, kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
            if heads % parallel.world or kv_heads % parallel.world:
                raise SystemExit(f"--tp over {parallel.world} ranks splits attention by heads: "
                                 f"{heads} heads and {kv_heads} kv heads must divide by {parallel.world}")
        model = parallel.wrap(model, list(model.model.layers), decoder_tp_plan())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1,
                                  foreach=None if parallel is None else parallel.foreach)
    return fit(model, optimizer, token_batches(seed, batch, length, vocab),
               lambda m, ids: m(input_ids=ids, labels=ids).loss, steps, device, "tokens",
               lambda b: b[0].numel(), clip=1.0, progress=progress, compile=compile, graph=graph, parallel=parallel)


def generate_greedily(model: torch.nn.Module, device: str, vocab: int, seed: int) -> float:
    """A transformers causal LM continues unseen progressions with greedy `generate`."""
    def generate(ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False)
    return show_generations(generate, device, vocab, seed)
