"""Graph mode against eager and against XLA itself: median milliseconds per step, side by side in one run,
for the tiny Llama of examples/llama.py and the tiny ResNet of examples/resnet.py.

Two phases per model:

  train      forward + backward + optimizer step (the Llama: AdamW with gradient clipping at 1.0,
             as examples/common.py trains it; the ResNet: SGD with momentum and weight decay)
  inference  forward under torch.no_grad() (the model in eval mode)

each run as

  tpu eager     the model on device "tpu", op by op through the spec kernels
  tpu fused     the same eager code in fused eager mode (torch.tpu.set_eager_mode("fused")): ops are
                recorded and each step runs as one module (the optimizer step or the sync ends it)
  tpu compiled  torch.compile(model, backend="tpu"), and the optimizer update (clipping + step)
                compiled with torch.compile(..., backend="tpu") too
  tpu graph     the whole eager step (forward, backward, clipping, optimizer step) captured once with
                torch.tpu.graph and replayed: one module per step (the optimizer is capturable=True)
  cpu eager     the same model with PyTorch's own CPU kernels
  jax.jit       (Llama only) the same Llama written below in plain jax.numpy, loaded with the torch
                model's weights, its whole train step (value_and_grad + clipping + AdamW) in one jax.jit,
                on the platform torchtpu runs on (jax's TPU beside ours on a TPU host, its CPU backend
                otherwise): the same XLA, the floor graph mode is measured against

--size picks the Llama: tiny (examples/llama.py's), 110m (vocab 8192, hidden 1024, 8 layers, batch 8x512)
or 500m (vocab 32000, hidden 1536, 16 layers, batch 4x1024); the ResNet is always the tiny one.
--dtype bfloat16 runs every torch mode under torch.autocast(dtype=torch.bfloat16) and the jax Llama
with the same casting policy (matmul and attention operands in bfloat16, log-softmax and the loss in
float32, float32 weights and optimizer). --precision sets torch.set_float32_matmul_precision and the
matching jax precision (highest: full float32; high: bfloat16x3; medium: one bfloat16 pass, jax's
default), so both sides always run the same matmul precision.

Besides the median: tokens/s, MFU (model FLOPs: 6 x matmul parameters x tokens plus attention's
12 x layers x hidden x length x tokens for a train step, a third of that for inference, against
--peak-tflops, by default 197 on a TPU v5e) and peak memory: torch modes, torch.tpu.max_memory_allocated
during the mode (tensors, not XLA's temporaries) and the plugin allocator's process-wide peak where it
keeps one; jax, its device's peak_bytes_in_use. Process-wide peaks are a mode's own only when it is the
only mode and phase the process runs (on a TPU jax's peak also holds torchtpu's buffers: one allocator
serves both): --isolate runs each mode and phase in a process of its own, one after another, and then
compares those peaks. --modes "tpu graph,jax.jit" and --phases train pick what runs.

Graph mode makes the optimizer's state with one eager step before capturing (as CUDA graphs are used),
on a slice of the batch (the Llama: one row of an eighth the length; the ResNet: two images), so the
eager activations stay out of the mode's peak.

Every mode starts from the same weights (built on the CPU from --seed) and steps on one fixed batch
that is already on its device, so host-to-device copies are not timed. A step's clock stops after
torch.tpu.synchronize() (tpu) or jax.block_until_ready (jax). Before timing, the jax Llama's loss on
the batch is checked against the torch CPU loss (to 1e-4 relative), before and after one train step.

Compile time: for tpu modes the first call is timed on its own, with torchtpu.debug.metrics()
(`compiles`, `compile_seconds`) read before and after it; for jax, `.lower(...).compile()` is timed.
Kernels found in torchtpu's disk cache are loaded, not compiled (run with TORCHTPU_CACHE_DIR=0 to see
cold compiles).

cpu eager runs with --cpu-threads torch threads (default 1): with torch's OpenMP pool on every core, in
one process with the PJRT and jax CPU thread pools, a tiny Llama train step took ~550 ms instead of
~13 ms on a loaded 2-core machine. Pass 0 to keep torch's default.

Targets (tiny Llama, train step): graph mode <= 1.1x jax.jit, and >= 5x faster than tpu eager; graph
mode is the faster of tpu compiled and tpu graph, and both are printed.
Fused eager mode, on a TPU: >= 10x faster than tpu eager and <= 1.3x tpu graph's time; on the CPU
plugin at least as fast as tpu eager.
The tpu compiled column is skipped, with a note, while no "tpu" backend is registered with Dynamo.

Usage: python benchmarks/compile_step.py [--steps N] [--warmup N] [--model llama|resnet|all]
                                         [--size tiny|110m|500m] [--dtype float32|bfloat16]
                                         [--precision highest|high|medium] [--modes M,M] [--phases P,P] [--isolate]
                                         [--peak-tflops T] [--seed S] [--cpu-threads N] [--plot out.png]
                                         [--profile N]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

# --isolate: this process only starts the others and prints their table, so it must not open the device
# (one process at a time may hold a TPU); each child gets the plugin choice this process was given.
PLUGIN_CHOICE = os.environ.get("TORCHTPU_PJRT_PLUGIN")
if "--isolate" in sys.argv:
    os.environ["TORCHTPU_PJRT_PLUGIN"] = "none"

import torch
import torch.nn.functional as F

import torchtpu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import common  # noqa: E402
import llama  # noqa: E402
import resnet  # noqa: E402

MODES = ("tpu eager", "tpu fused", "tpu compiled", "tpu graph", "cpu eager", "jax.jit")
LLAMA_LR, LLAMA_WEIGHT_DECAY, LLAMA_CLIP = 3e-3, 0.1, 1.0  # as common.train_causal_lm
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.AdamW's defaults
TARGET_VS_JAX, TARGET_VS_EAGER = 1.1, 5.0
TARGET_FUSED_VS_EAGER, TARGET_FUSED_VS_GRAPH = 10.0, 1.3  # fused eager mode, on a TPU (issue 21)
LOSS_RTOL = 1e-4
# (vocab, hidden, intermediate, layers, heads, kv heads, batch, sequence length), as llama.SIZES
LLAMA_SIZES = {"tiny": llama.SIZES[True], "110m": (8192, 1024, 2816, 8, 16, 8, 8, 512),
               "500m": (32000, 1536, 4096, 16, 12, 4, 4, 1024)}
JAX_PRECISION = {"highest": "highest", "high": "high", "medium": "default"}  # torch's setting -> jax's
PEAK_TFLOPS = {"TPU v5 lite": 197.0, "TPU v5e": 197.0}  # bfloat16 peak per chip, by device name


@dataclass
class Result:
    """One mode of one phase: the step's median, and what its first call cost."""
    ms: float | None = None  # median milliseconds per timed step
    first_s: float | None = None  # wall time of the first call (tracing + compiling + running)
    compiles: int | None = None  # executables compiled during the first call (jax: the one jit)
    peak_bytes: int | None = None  # torch: max_memory_allocated during the mode; jax: its device's peak
    device_peak_bytes: int | None = None  # torch: the plugin allocator's process-wide peak, where kept
    compile_s: float | None = None  # seconds spent compiling them
    disk_hits: int = 0  # tpu kernels loaded from the disk cache instead of compiled
    device_ms: float | None = None  # --profile: the device's busy milliseconds per step
    # milliseconds per step over the timed number of steps with one sync after the last: the host
    # records or dispatches the next step while the device runs this one, as in a loop that reads a
    # value only every few steps (the median above waits for every step)
    unsynced_ms: float | None = None
    note: str = ""  # why there is no number


# Timing.

PROFILE_STEPS = 0  # --profile: steps run under jax's profiler after the timed ones
PROFILE_DUMP: Path | None = None  # --profile-dump: a folder for every device op of each profiled mode


def measure(step: Callable[[], Any], sync: Callable[[Any], None], warmup: int, steps: int,
            on_tpu: bool, label: str = "") -> Result:
    """Times `step` alone once (the call that traces and compiles), then `warmup` untimed calls,
    then `steps` calls, each stopped only after `sync(its output)` says the work is done, then `steps`
    calls with one sync after the last, twice (Result.unsynced_ms, the second); with
    --profile, then prints where the device's time went in PROFILE_STEPS more calls."""
    before = torchtpu.debug.metrics() if on_tpu else None
    start = time.perf_counter()
    sync(step())
    result = Result(first_s=time.perf_counter() - start)
    if on_tpu:
        after = torchtpu.debug.metrics()
        result.compiles = after["compiles"] - before["compiles"]
        result.compile_s = after["compile_seconds"] - before["compile_seconds"]
        result.disk_hits = after["disk_cache_hits"] - before["disk_cache_hits"]
    for _ in range(warmup):
        sync(step())
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        sync(step())
        samples.append((time.perf_counter() - start) * 1e3)
    result.ms = statistics.median(samples)
    # Twice, the second timed: in fused eager mode steps that nothing reads in between can run as one
    # block (an inference loop's), which the first round compiles.
    for _ in range(2):
        start = time.perf_counter()
        output = None
        for _ in range(steps):
            output = step()
        sync(output)
        result.unsynced_ms = (time.perf_counter() - start) * 1e3 / steps
    if PROFILE_STEPS:
        result.device_ms = print_device_profile(step, sync, label)
    return result


def print_device_profile(step: Callable[[], Any], sync: Callable[[Any], None], label: str,
                         top: int = 40) -> float | None:
    """PROFILE_STEPS calls of `step` under jax's profiler (it traces the device, whoever launched the
    work: torchtpu and jax share one libtpu), then per step: the device's busy time beside the wall
    time (their difference is time the device waited for the host), the time per XLA module, and the
    `top` XLA ops by time with their HLO, so two modes' steps can be compared op by op."""
    try:
        import jax
    except ImportError:
        print(f"  --profile {label}: needs jax")
        return None
    jax.devices()  # loads jax's plugin: its profiler traces the device only once a backend is up
    with tempfile.TemporaryDirectory() as trace_dir:
        start = time.perf_counter()
        with jax.profiler.trace(trace_dir):
            for _ in range(PROFILE_STEPS):
                sync(step())
        wall_ms = (time.perf_counter() - start) * 1e3 / PROFILE_STEPS
        traces = list(Path(trace_dir).rglob("*.xplane.pb"))
        data = jax.profiler.ProfileData.from_file(str(traces[0])) if traces else None
    by_line, counts, hlo, categories = device_time_by_line(data.planes if data else [], PROFILE_STEPS)
    ops = by_line.get("XLA Ops", collections.Counter())
    print(f"\n  --profile {label}: {PROFILE_STEPS} steps, wall {wall_ms:.2f} ms/step, device ops "
          f"{sum(ops.values()):.2f} ms/step in {sum(counts.values()) // PROFILE_STEPS} ops"
          + ("" if ops else " (no device plane: the CPU plugin's ops are host threads)"))
    for module, ms in by_line.get("XLA Modules", collections.Counter()).most_common(8):
        print(f"    module {ms:9.3f} ms  {module[:100]}")
    if ops:
        for line in op_time_classes(ops, counts, categories, PROFILE_STEPS):
            print("    " + line)
    if ops and PROFILE_DUMP is not None:
        PROFILE_DUMP.mkdir(parents=True, exist_ok=True)
        dump = PROFILE_DUMP / (label.replace(" ", "_").replace(".", "_") + ".json")
        dump.write_text(json.dumps([{"op": name, "ms_per_step": ms, "runs_per_step": counts[name] / PROFILE_STEPS,
                                     "category": categories[name], "hlo": hlo[name]}
                                    for name, ms in ops.most_common()], indent=0))
        print(f"    every op: {dump}")
    for name, ms in ops.most_common(top):
        detail = hlo[name] if hlo[name] and hlo[name] not in name else ""  # on a TPU the name is the HLO
        print(f"    {ms:9.3f} ms x{counts[name] // PROFILE_STEPS:<4} {name[:160]} {detail[:160]}".rstrip())
    return sum(ops.values()) if ops else None


def device_time_by_line(planes, steps: int) -> tuple[dict[str, collections.Counter], collections.Counter, dict, dict]:
    """From a profile's planes: per line of the device planes ("XLA Modules", "XLA Ops", ...) the
    milliseconds per step of each event name, how often each op ran, and each op's HLO and XLA
    category where the profiler gives them as stats. Host planes are left out (on the CPU plugin the
    ops run there)."""
    by_line: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    counts, hlo, categories = collections.Counter(), {}, {}
    for plane in planes:
        if not plane.name.startswith("/device:"):
            continue
        for line in plane.lines:
            for event in line.events:
                by_line[line.name][event.name] += event.duration_ns / 1e6 / steps
                if line.name == "XLA Ops":
                    counts[event.name] += 1
                    if event.name not in hlo:
                        stats = dict(event.stats)
                        hlo[event.name] = str(stats.get("long_name") or stats.get("hlo_category") or "")
                        categories[event.name] = str(stats.get("hlo_category") or "other")
    return by_line, counts, hlo, categories


def op_time_classes(ops: collections.Counter, counts: collections.Counter, categories: dict, steps: int) -> list[str]:
    """Two lines on where a step's device time goes: ms per step by XLA's op category, and by how long
    each op runs (thousands of microsecond ops cost what a few large ones do)."""
    by_category, by_length, runs_by_length = collections.Counter(), collections.Counter(), collections.Counter()
    limits = ((5, "< 5 us"), (50, "5-50 us"), (500, "50-500 us"), (float("inf"), ">= 500 us"))
    for name, ms in ops.items():
        by_category[categories.get(name, "other")] += ms
        runs = counts[name] / steps
        length = next(label for limit, label in limits if ms * 1e3 / runs < limit)
        by_length[length] += ms
        runs_by_length[length] += runs
    return ["by category: " + ", ".join(f"{c} {ms:.2f} ms" for c, ms in by_category.most_common(8)),
            "by op length: " + ", ".join(f"{label} {runs_by_length[label]:.0f} ops {by_length[label]:.2f} ms"
                                         for _, label in limits if runs_by_length[label])]


def tpu_sync(_: Any) -> None:
    torch.tpu.synchronize()


def no_sync(_: Any) -> None:
    """Torch's CPU kernels are done when they return."""


# The torch steps, shared by both models.

def autocast(device: str, amp: torch.dtype | None):
    """torch.autocast to `amp` on `device`, or nothing for float32."""
    return torch.autocast(device, dtype=amp) if amp is not None else contextlib.nullcontext()


def torch_train_step(model: torch.nn.Module, batch: tuple[torch.Tensor, ...], device: str, compiled: bool,
                     make_optimizer: Callable, loss_fn: Callable, clip: float | None,
                     graphed: bool = False, amp: torch.dtype | None = None,
                     warmup_batch: tuple[torch.Tensor, ...] | None = None) -> Callable[[], Any]:
    """One training step as examples/common.fit takes it (forward, backward, clipping, optimizer step),
    on `device`; with `compiled`, the model and the update are each compiled by the "tpu" backend; with
    `graphed`, the whole eager step is captured by torch.tpu.graph and replayed, after one eager step on
    `warmup_batch` (default `batch`) that makes the optimizer's state; with `amp`, the forward and loss
    run under autocast to that dtype."""
    model = model.to(device).train()
    batch = tuple(t.to(device) for t in batch)
    warmup_batch = batch if warmup_batch is None else tuple(t.to(device) for t in warmup_batch)
    optimizer = make_optimizer(model.parameters(), capturable=graphed)
    params = [p for p in model.parameters() if p.requires_grad]
    forward = torch.compile(model, backend="tpu") if compiled else model

    def update() -> None:
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()

    if compiled:
        update = torch.compile(update, backend="tpu")

    def step_on(inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        with autocast(device, amp):
            loss = loss_fn(forward, *inputs)
        loss.backward()
        update()
        optimizer.zero_grad(set_to_none=True)  # only drops references: nothing to compile
        return loss

    step = functools.partial(step_on, batch)
    return graph_of(step, functools.partial(step_on, warmup_batch)) if graphed else step


def graph_of(step: Callable[[], torch.Tensor], warmup: Callable[[], Any] | None = None) -> Callable[[], torch.Tensor]:
    """The step captured by torch.tpu.graph on the first call, after one eager call of `warmup` where the
    step needs state that its first call makes (an optimizer's), as CUDA graphs are used; every call
    replays it and returns the captured output, which the replay rewrote. The warm-up is the one eager
    step of the mode: run on a smaller batch, it keeps the eager activations out of the mode's peak, and
    in fused eager mode, so that the optimizer's temporaries never get buffers (strict mode's AdamW step
    holds parameters, gradients, both moments and a sqrt(v) list: 5x the parameters; fused, 4x)."""
    graph, output = None, None

    def replay() -> torch.Tensor:
        nonlocal graph, output
        if graph is None:
            if warmup is not None:
                with torch.tpu.eager_mode("fused"):
                    warmup()
            graph = torch.tpu.TPUGraph()
            with torch.tpu.graph(graph):
                output = step()
        graph.replay()
        return output

    return replay


def torch_inference_step(model: torch.nn.Module, batch: tuple[torch.Tensor, ...], device: str, compiled: bool,
                         forward_fn: Callable, graphed: bool = False, amp: torch.dtype | None = None) -> Callable[[], Any]:
    model = model.to(device).eval()
    batch = tuple(t.to(device) for t in batch)
    forward = torch.compile(model, backend="tpu") if compiled else model

    def step() -> torch.Tensor:
        with torch.no_grad(), autocast(device, amp):
            return forward_fn(forward, *batch)

    return graph_of(step) if graphed else step


# The Llama in plain jax.numpy, the same math as transformers' LlamaForCausalLM.

class JaxLlama:
    """LlamaForCausalLM's forward and loss for one HF config, as pure functions of a parameter dict
    whose weights keep torch's layouts (a Linear's weight is (out, in), applied as x @ W.T)."""

    def __init__(self, config, compute_dtype=None):
        rope = config.rope_parameters
        self.compute = compute_dtype  # None: float32 throughout; bfloat16: autocast's policy (see mm)
        if rope.get("rope_type", "default") != "default" or config.hidden_act != "silu":
            raise ValueError("the jax Llama implements only default RoPE and SiLU")
        if config.attention_bias or config.mlp_bias:
            raise ValueError("the jax Llama has no biases")
        self.layers = config.num_hidden_layers
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.theta = rope["rope_theta"]
        self.tied = config.tie_word_embeddings
        self.padding_idx = config.pad_token_id  # HF's nn.Embedding(..., padding_idx): that row gets no gradient

    def params_from(self, model: torch.nn.Module) -> dict:
        """The torch model's weights as jax arrays, every state_dict entry accounted for."""
        import jax.numpy as jnp
        state = {k: jnp.asarray(v.detach().cpu().numpy()) for k, v in model.state_dict().items()}
        take = state.pop
        params = {
            "embed": take("model.embed_tokens.weight"),
            "layers": [{
                name: take(f"model.layers.{i}.{key}.weight") for name, key in [
                    ("input_norm", "input_layernorm"), ("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"),
                    ("v", "self_attn.v_proj"), ("o", "self_attn.o_proj"), ("post_norm", "post_attention_layernorm"),
                    ("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"), ("down", "mlp.down_proj")]
            } for i in range(self.layers)],
            "norm": take("model.norm.weight"),
        }
        head = take("lm_head.weight", None)  # a tied head may or may not appear in the state_dict
        if not self.tied:
            params["lm_head"] = head
        if state:
            raise ValueError(f"weights the jax Llama does not use: {sorted(state)}")
        return params

    def mm(self, subscripts: str, a, b):
        """An einsum with both operands in the compute dtype, as autocast casts matmul operands (the
        result stays in it, as autocast's does); float32 weights are cast where they are used."""
        import jax.numpy as jnp
        if self.compute is not None:
            a, b = a.astype(self.compute), b.astype(self.compute)
        return jnp.einsum(subscripts, a, b)

    def linear(self, x, weight):
        return self.mm("...i,oi->...o", x, weight)  # torch's layout: x @ W.T

    def rms_norm(self, x, weight):
        import jax
        import jax.numpy as jnp
        return weight * (x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps))

    def rotary(self, length: int):
        """cos and sin of each position's angles, (length, head_dim), halves repeated as in HF."""
        import jax.numpy as jnp
        inv_freq = 1.0 / (self.theta ** (jnp.arange(0, self.head_dim, 2, dtype=jnp.float32) / self.head_dim))
        angles = jnp.arange(length, dtype=jnp.float32)[:, None] * inv_freq[None, :]
        angles = jnp.concatenate([angles, angles], axis=-1)
        return jnp.cos(angles), jnp.sin(angles)

    @staticmethod
    def rotate(x, cos, sin):
        """RoPE on x of shape (batch, length, heads, head_dim): x*cos + rotate_half(x)*sin."""
        import jax.numpy as jnp
        half = x.shape[-1] // 2
        rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos[:, None, :] + rotated * sin[:, None, :]

    def attention(self, layer, h, cos, sin):
        import jax
        import jax.numpy as jnp
        batch, length, _ = h.shape
        q = self.linear(h, layer["q"]).reshape(batch, length, self.heads, self.head_dim)
        k = self.linear(h, layer["k"]).reshape(batch, length, self.kv_heads, self.head_dim)
        v = self.linear(h, layer["v"]).reshape(batch, length, self.kv_heads, self.head_dim)
        q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        # Grouped-query attention: kv head j serves query heads j*group .. (j+1)*group-1 (HF's repeat_kv).
        group = self.heads // self.kv_heads
        k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
        scores = self.mm("bqhd,bkhd->bhqk", q, k) * self.head_dim ** -0.5
        causal = jnp.tril(jnp.ones((length, length), dtype=bool))
        # the softmax in float32 (as the attention kernels do under autocast), its result cast back
        probs = jax.nn.softmax(jnp.where(causal, scores.astype(jnp.float32), -jnp.inf), axis=-1).astype(scores.dtype)
        out = self.mm("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, self.heads * self.head_dim)
        return self.linear(out, layer["o"])

    def mlp(self, layer, h):
        import jax
        return self.linear(jax.nn.silu(self.linear(h, layer["gate"])) * self.linear(h, layer["up"]), layer["down"])

    def embed(self, table, ids):
        """The lookup, with no gradient flowing into the padding row (torch's padding_idx)."""
        import jax
        if self.padding_idx is not None:
            table = table.at[self.padding_idx].set(jax.lax.stop_gradient(table[self.padding_idx]))
        return table[ids]

    def logits(self, params, ids):
        x = self.embed(params["embed"], ids)
        cos, sin = self.rotary(ids.shape[1])
        for layer in params["layers"]:
            x = x + self.attention(layer, self.rms_norm(x, layer["input_norm"]), cos, sin)
            x = x + self.mlp(layer, self.rms_norm(x, layer["post_norm"]))
        x = self.rms_norm(x, params["norm"])
        return self.linear(x, params["embed"] if self.tied else params["lm_head"])

    def loss(self, params, ids):
        """Mean next-token cross-entropy, labels = ids shifted by one (HF's ForCausalLMLoss)."""
        import jax
        import jax.numpy as jnp
        log_probs = jax.nn.log_softmax(self.logits(params, ids)[:, :-1].astype(jnp.float32), axis=-1)  # autocast: float32
        return -jnp.mean(jnp.take_along_axis(log_probs, ids[:, 1:, None], axis=-1))


def adamw_init(params) -> dict:
    import jax
    import jax.numpy as jnp
    zeros = lambda p: jnp.zeros_like(p)  # noqa: E731
    return {"step": jnp.zeros((), jnp.float32), "m": jax.tree.map(zeros, params), "v": jax.tree.map(zeros, params)}


def clip_by_global_norm(grads, max_norm: float):
    """torch.nn.utils.clip_grad_norm_: scale every gradient by max_norm / (total 2-norm + 1e-6), at most 1."""
    import jax
    import jax.numpy as jnp
    total = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    scale = jnp.minimum(max_norm / (total + 1e-6), 1.0)
    return jax.tree.map(lambda g: g * scale, grads)


def adamw_update(params, grads, state, lr: float, weight_decay: float):
    """torch.optim.AdamW's update (decoupled weight decay, bias-corrected moments), every parameter decayed."""
    import jax
    import jax.numpy as jnp
    beta1, beta2 = ADAM_BETAS
    step = state["step"] + 1
    m = jax.tree.map(lambda m, g: beta1 * m + (1 - beta1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: beta2 * v + (1 - beta2) * g * g, state["v"], grads)
    step_size = lr / (1 - beta1 ** step)
    root_correction = jnp.sqrt(1 - beta2 ** step)

    def apply(p, m, v):
        return p * (1 - lr * weight_decay) - step_size * m / (jnp.sqrt(v) / root_correction + ADAM_EPS)

    return jax.tree.map(apply, params, m, v), {"step": step, "m": m, "v": v}


def llama_adamw(params, **kwargs) -> torch.optim.Optimizer:
    """The Llama's optimizer, as common.train_causal_lm makes it (kwargs: capturable)."""
    return torch.optim.AdamW(params, lr=LLAMA_LR, weight_decay=LLAMA_WEIGHT_DECAY, **kwargs)


def llama_loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def jax_train_step(jl: JaxLlama):
    """The jax Llama's train step: value_and_grad, clipping and AdamW, as torch's step does them."""
    import jax

    def train(params, state, ids):
        loss, grads = jax.value_and_grad(jl.loss)(params, ids)
        grads = clip_by_global_norm(grads, LLAMA_CLIP)
        params, state = adamw_update(params, grads, state, LLAMA_LR, LLAMA_WEIGHT_DECAY)
        return params, state, loss

    return train


def jax_llama_steps(jl: JaxLlama, params, ids_np):
    """The jitted train step (value_and_grad + clipping + AdamW, params and state donated so they update
    in place as torch's do) and the jitted forward, each with the time `.lower(...).compile()` took."""
    import jax
    import jax.numpy as jnp

    train = jax_train_step(jl)
    ids = jnp.asarray(ids_np)
    state = adamw_init(params)
    start = time.perf_counter()
    train_c = jax.jit(train, donate_argnums=(0, 1)).lower(params, state, ids).compile()
    train_compile_s = time.perf_counter() - start
    start = time.perf_counter()
    logits_c = jax.jit(jl.logits).lower(params, ids).compile()
    logits_compile_s = time.perf_counter() - start
    return (train_c, state, train_compile_s), (logits_c, logits_compile_s)


def check_jax_loss(seed: int) -> bool:
    """The jax Llama against torch on the CPU, the tiny Llama's weights and a batch of it, in float32 at
    full matmul precision on both sides (whatever the run's --dtype and --precision): the loss before
    any step and after one train step must agree to LOSS_RTOL relative. Prints both."""
    import jax
    import jax.numpy as jnp
    vocab, *_, batch, length = llama.SIZES[True]
    (ids,) = next(common.token_batches(seed, batch, length, vocab))
    model = llama.build(True, seed)
    jl = JaxLlama(model.config)
    params = jl.params_from(model)
    ids_j = jnp.asarray(ids.numpy())
    with jax.default_matmul_precision("highest"):
        (train_c, state, _), _ = jax_llama_steps(jl, jl.params_from(model), ids.numpy())
    loss_fn = llama_loss
    torch_step = torch_train_step(model, (ids,), "cpu", False, llama_adamw, loss_fn, LLAMA_CLIP)

    ok = True
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    for when in ("initial weights", "after 1 train step"):
        with torch.no_grad():
            torch_loss = loss_fn(model, ids).item()
        with jax.default_matmul_precision("highest"):
            jax_loss = float(jl.loss(params, ids_j))
        rel = abs(jax_loss - torch_loss) / abs(torch_loss)
        ok &= rel <= LOSS_RTOL
        print(f"  loss check, {when:<19} torch cpu {torch_loss:.7f}  jax {jax_loss:.7f}  "
              f"rel diff {rel:.1e} ({'ok' if rel <= LOSS_RTOL else f'> {LOSS_RTOL:g}'})")
        torch_step()
        params, state, _ = train_c(params, state, ids_j)
    torch.set_float32_matmul_precision(precision)
    return ok


# The models.

def llama_results(args, compile_ok: bool, tpu_ok: bool) -> dict[str, dict[str, Result]]:
    sizes = LLAMA_SIZES[args.size]
    vocab, *_, batch, length = sizes
    (ids,) = next(common.token_batches(args.seed, batch, length, vocab))
    make_opt, loss_fn = llama_adamw, llama_loss
    logits_fn = lambda m, ids: m(input_ids=ids).logits  # noqa: E731
    # graph mode's one eager warm-up step (it makes AdamW's state) on one row of an eighth the length
    warmup_ids = ids[:1, :max(8, length // 8)]
    results = torch_results(args, compile_ok, tpu_ok, lambda: llama.build(sizes, args.seed), (ids,),
                            make_opt, loss_fn, LLAMA_CLIP, logits_fn, (warmup_ids,))
    if "jax.jit" not in args.modes:
        for phase in results:
            results[phase]["jax.jit"] = Result(note="not in --modes")
        return results
    try:
        import jax
    except ImportError:
        note = "jax not installed (pip install -e .[bench])"
        for phase in results:
            results[phase]["jax.jit"] = Result(note=note)
        print(f"  jax.jit: skipped, {note}")
        return results
    print(f"  jax {jax.__version__} on {jax.devices()[0].platform}")
    check_jax_loss(args.seed)
    model = llama.build(sizes, args.seed)
    jl = JaxLlama(model.config, jax.numpy.bfloat16 if args.dtype == "bfloat16" else None)
    with jax.default_matmul_precision(JAX_PRECISION[args.precision]):
        (train_c, state, train_compile_s), (logits_c, logits_compile_s) = jax_llama_steps(
            jl, jl.params_from(model), ids.numpy())
    params, ids_j = jl.params_from(model), jax.numpy.asarray(ids.numpy())
    del model
    jax_sync = jax.block_until_ready

    def jax_train() -> Any:
        nonlocal params, state
        params, state, loss = train_c(params, state, ids_j)
        return params, state, loss

    for phase, step, compile_s in [("train", jax_train, train_compile_s),
                                   ("inference", lambda: logits_c(params, ids_j), logits_compile_s)]:
        if phase not in args.phases:
            results[phase]["jax.jit"] = Result(note="not in --phases")
            continue
        r = measure(step, jax_sync, args.warmup, args.steps, on_tpu=False, label=f"{phase} jax.jit")
        r.compiles, r.compile_s = 1, compile_s
        r.peak_bytes = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
        results[phase]["jax.jit"] = r
        print(f"  {phase:<9} {'jax.jit':<12} {fmt_ms(r)}", flush=True)
    return results


def resnet_results(args, compile_ok: bool, tpu_ok: bool) -> dict[str, dict[str, Result]]:
    *_, size, batch = resnet.SIZES[True]
    images, labels = next(resnet.image_batches(args.seed, batch, size))
    make_opt = lambda p, capturable: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=5e-4)  # noqa: E731
    loss_fn = lambda m, x, y: F.cross_entropy(m(x), y)  # noqa: E731
    forward_fn = lambda m, x, y: m(x)  # noqa: E731
    results = torch_results(args, compile_ok, tpu_ok, lambda: resnet.build(True, args.seed), (images, labels),
                            make_opt, loss_fn, None, forward_fn, (images[:2], labels[:2]))
    for phase in results:
        results[phase]["jax.jit"] = Result(note="Llama only")
    return results


def torch_results(args, compile_ok: bool, tpu_ok: bool, build: Callable, batch: tuple, make_opt: Callable,
                  loss_fn: Callable, clip: float | None, forward_fn: Callable,
                  warmup_batch: tuple) -> dict[str, dict[str, Result]]:
    """The three torch modes of both phases, each on a freshly built model so no mode sees another's
    trained weights. A mode that fails is reported with its error rather than ending the run. Graph
    mode's eager warm-up step trains on `warmup_batch` (a slice of the batch: smaller activations)."""
    modes = {"tpu eager": ("tpu", False, False), "tpu fused": ("tpu", False, False),
             "tpu compiled": ("tpu", True, False), "tpu graph": ("tpu", False, True),
             "cpu eager": ("cpu", False, False)}
    results: dict[str, dict[str, Result]] = {"train": {}, "inference": {}}
    amp = torch.bfloat16 if args.dtype == "bfloat16" else None
    # "tpu eager" is strict mode and "tpu fused" fused mode; compiled and graph mode run in the eager
    # mode a user gets (TORCHTPU_EAGER_MODE, else the platform's default): in fused mode compiled
    # graphs join one block per step.
    default_mode = torch.tpu.get_eager_mode() if tpu_ok else "strict"
    eager_modes = {"tpu eager": "strict", "tpu fused": "fused", "tpu compiled": default_mode, "tpu graph": default_mode}
    for phase in results:
        for mode, (device, compiled, graphed) in modes.items():
            if phase not in args.phases:
                results[phase][mode] = Result(note="not in --phases")
                continue
            if mode not in args.modes:
                results[phase][mode] = Result(note="not in --modes")
                continue
            if device == "tpu" and not tpu_ok:
                results[phase][mode] = Result(note="no tpu runtime")
                continue
            if compiled and not compile_ok:
                results[phase][mode] = Result(note='no "tpu" Dynamo backend')
                continue
            if compiled:
                torch._dynamo.reset()  # each compiled mode counts its own graphs
            if device == "tpu":
                torch.tpu.reset_peak_memory_stats()
                torch.tpu.set_eager_mode(eager_modes[mode])
            try:
                if phase == "train":
                    step = torch_train_step(build(), batch, device, compiled, make_opt, loss_fn, clip, graphed, amp,
                                            warmup_batch)
                else:
                    step = torch_inference_step(build(), batch, device, compiled, forward_fn, graphed, amp)
                results[phase][mode] = r = measure(step, tpu_sync if device == "tpu" else no_sync,
                                                   args.warmup, args.steps, on_tpu=device == "tpu",
                                                   label=f"{phase} {mode}")
                del step  # the mode's model, optimizer and graph go before the next mode starts
                if device == "tpu":
                    r.peak_bytes = torch.tpu.max_memory_allocated()
                    r.device_peak_bytes = torch.tpu.device_memory_stats().get("peak_bytes_in_use")
            except Exception as error:  # noqa: BLE001 - one failing mode should not hide the others
                # The first line only: some errors print whole tensors.
                message = (str(error).strip().splitlines() or [""])[0][:300]
                print(f"  {phase} {mode} raised {type(error).__name__}: {message}")
                results[phase][mode] = Result(note=f"failed: {type(error).__name__}")
            finally:
                if device == "tpu":
                    torch.tpu.set_eager_mode(default_mode)
            in_mode = f" ({eager_modes[mode]} eager mode)" if mode in ("tpu compiled", "tpu graph") else ""
            print(f"  {phase:<9} {mode:<12} {fmt_ms(results[phase][mode])}{in_mode}", flush=True)
    return results


def isolated_results(args, chosen: list[str]) -> tuple[dict[str, dict[str, dict[str, Result]]], str]:
    """Every mode and phase asked for, run by this script in a child process of its own, one at a time
    (one process at a time may hold a TPU), the children's results merged into one table; and the
    device's name, as the children saw it."""
    merged: dict[str, dict[str, dict[str, Result]]] = {}
    device_name = "none"
    for mode, phase in [(m, p) for m in args.modes for p in args.phases]:
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "results.json"
            command = [sys.executable, __file__, "--modes", mode, "--phases", phase, "--results-json", str(out),
                       "--steps", str(args.steps), "--warmup", str(args.warmup), "--model", args.model,
                       "--size", args.size, "--dtype", args.dtype, "--precision", args.precision,
                       "--seed", str(args.seed), "--cpu-threads", str(args.cpu_threads),
                       "--profile", str(args.profile)] + (["--profile-dump", args.profile_dump] if args.profile_dump else [])
            if args.peak_tflops:
                command += ["--peak-tflops", str(args.peak_tflops)]
            print(f"\n--isolate: {phase} {mode} in a process of its own", flush=True)
            env = dict(os.environ)
            env.pop("TORCHTPU_PJRT_PLUGIN")
            if PLUGIN_CHOICE is not None:
                env["TORCHTPU_PJRT_PLUGIN"] = PLUGIN_CHOICE
            done = subprocess.run(command, env=env)
            report = json.loads(out.read_text()) if out.exists() else {}
        results = report.get("results", {})
        device_name = report.get("device_name", device_name)
        for name in chosen:
            got = results.get(name, {}).get(phase, {}).get(mode)
            merged.setdefault(name, {"train": {}, "inference": {}})[phase][mode] = (
                Result(**got) if got else Result(note=f"failed: its process exited {done.returncode}"))
    for phases in merged.values():  # what was not asked for, as the other runs say
        for phase in ("train", "inference"):
            for mode in MODES:
                phases[phase].setdefault(mode, Result(
                    note="not in --phases" if phase not in args.phases else "not in --modes"))
    return merged, device_name


# Reporting.

def fmt_ms(r: Result) -> str:
    if r.ms is None:
        return r.note
    return f"{r.ms:.2f} ms" + (f" ({r.unsynced_ms:.2f} unsynced)" if r.unsynced_ms is not None else "")


def ratio(a: Result, b: Result) -> float | None:
    return a.ms / b.ms if a.ms is not None and b.ms is not None else None


def llama_work(sizes: tuple) -> tuple[int, dict[str, float]]:
    """Tokens per step and model FLOPs per step of each phase: 2 per multiply-add of every matmul
    parameter per token (3x that to train) plus attention's two (length x length) products per layer."""
    vocab, hidden, inter, layers, heads, kv_heads, batch, length = sizes
    head_dim = hidden // heads
    per_layer = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * inter
    matmul_params = layers * per_layer + vocab * hidden  # the lm head is a matmul; the embedding a lookup
    tokens = batch * length
    forward = 2 * matmul_params * tokens + 4 * layers * heads * head_dim * length * tokens
    return tokens, {"train": 3.0 * forward, "inference": float(forward)}


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def print_table(model: str, results: dict[str, dict[str, Result]], tokens: int | None = None,
                flops: dict[str, float] | None = None, peak_tflops: float | None = None,
                process_peaks: bool = False) -> None:
    """The table of every mode's numbers, then the ratios. With `process_peaks` (each mode ran alone in
    its process) the memory ratio compares the plugin's process-wide peak with jax's device peak, both
    counting XLA's temporaries; else tensors against jax's peak, which on a TPU also holds torchtpu's
    buffers (one allocator serves both)."""
    header = (f"{'phase':<10}{'mode':<14}{'median ms':>11}{'tokens/s':>11}{'MFU':>7}{'first call s':>14}"
              f"{'compiles':>10}{'compile s':>11}{'s/graph':>9}{'disk hits':>11}{'peak MiB':>10}{'dev peak':>10}"
              f"{'unsynced':>10}")
    print(f"\n{model}: median of the timed steps; first call = tracing + compiling + one step; peak MiB: "
          f"tensors (torch) or the device's peak (jax); dev peak: the plugin's process-wide peak; unsynced: "
          f"ms/step over the timed steps run with one sync after the last")
    print(header)
    print("-" * len(header))
    for phase, by_mode in results.items():
        for mode in MODES:
            r = by_mode.get(mode)
            if r is None:
                continue
            if r.ms is None:
                print(f"{phase:<10}{mode:<14}{'-':>11}  {r.note}")
                continue
            per_graph = r.compile_s / r.compiles if r.compiles else None
            mfu = flops[phase] / (r.ms / 1e3) / (peak_tflops * 1e12) if flops and peak_tflops else None
            cells = [f"{r.first_s:.3f}" if mode != "jax.jit" else "-",
                     "-" if r.compiles is None else str(r.compiles),
                     "-" if r.compile_s is None else f"{r.compile_s:.3f}",
                     "-" if per_graph is None else f"{per_graph:.3f}",
                     str(r.disk_hits) if mode.startswith("tpu") else "-"]
            rate = f"{tokens / (r.ms / 1e3):.0f}" if tokens else "-"
            print(f"{phase:<10}{mode:<14}{r.ms:>11.2f}{rate:>11}{'-' if mfu is None else f'{mfu:.1%}':>7}"
                  f"{cells[0]:>14}{cells[1]:>10}{cells[2]:>11}{cells[3]:>9}{cells[4]:>11}"
                  f"{mib(r.peak_bytes):>10}{mib(r.device_peak_bytes):>10}"
                  f"{'-' if r.unsynced_ms is None else f'{r.unsynced_ms:.2f}':>10}")
    print("-" * len(header))
    for phase, by_mode in results.items():
        peaks = {m: (by_mode[m].device_peak_bytes if process_peaks and m != "jax.jit" else by_mode[m].peak_bytes)
                 for m in ("tpu eager", "tpu fused", "tpu graph", "tpu compiled", "jax.jit") if m in by_mode}
        peaks = {m: p for m, p in peaks.items() if p}
        if "jax.jit" in peaks and len(peaks) > 1:
            kind = "process-wide" if process_peaks else "tensors; --isolate for process-wide"
            print(f"{phase:<10}peak memory / jax.jit's ({kind}): " + "  ".join(
                f"{m} {peaks[m] / peaks['jax.jit']:.2f}x" for m in peaks if m != "jax.jit"))
        graph_modes = [m for m in ("tpu compiled", "tpu graph") if by_mode[m].ms is not None]
        best = min(graph_modes, key=lambda m: by_mode[m].ms, default="tpu compiled")
        vs_jax = ratio(by_mode[best], by_mode["jax.jit"])
        speedup = ratio(by_mode["tpu eager"], by_mode[best])
        targets = model == "llama" and phase == "train"
        line = [f"{phase:<10}"]
        for mode in graph_modes:
            if by_mode["jax.jit"].ms is not None:
                line.append(f"{mode} / jax.jit: {show(ratio(by_mode[mode], by_mode['jax.jit']))}")
            line.append(f"tpu eager / {mode}: {show(ratio(by_mode['tpu eager'], by_mode[mode]))}")
        line.append(f"tpu eager / cpu eager: {show(ratio(by_mode['tpu eager'], by_mode['cpu eager']))}")
        print("  ".join(line))
        jax_device = by_mode["jax.jit"].device_ms
        on_device = [m for m in ("tpu graph", "tpu compiled", "tpu fused") if by_mode.get(m) and by_mode[m].device_ms]
        if jax_device and on_device:  # the device's own time: steadier than the wall clock on a shared host
            print(f"{'':<10}device time per step (--profile): jax.jit {jax_device:.2f} ms, " + ", ".join(
                f"{m} {by_mode[m].device_ms:.2f} ms ({by_mode[m].device_ms / jax_device:.2f}x)" for m in on_device))
        fused = by_mode.get("tpu fused")
        if fused is not None and fused.ms is not None:
            print(f"{'':<10}tpu fused: {show(ratio(by_mode['tpu eager'], fused))} faster than tpu eager (target >= "
                  f"{TARGET_FUSED_VS_EAGER:g}x on a TPU), {show(ratio(fused, by_mode['tpu graph']))} tpu graph's time "
                  f"(target <= {TARGET_FUSED_VS_GRAPH}x)")
        if targets:
            print(f"{'':<10}targets, with {best}: vs jax.jit {show(vs_jax)} (<= {TARGET_VS_JAX}x: "
                  f"{verdict(vs_jax, vs_jax is not None and vs_jax <= TARGET_VS_JAX)}), vs tpu eager {show(speedup)} "
                  f"(>= {TARGET_VS_EAGER:g}x: {verdict(speedup, speedup is not None and speedup >= TARGET_VS_EAGER)})")


def show(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def verdict(x: float | None, met: bool) -> str:
    return "n/a" if x is None else ("met" if met else "NOT met")


def plot(path: str, all_results: dict[str, dict[str, dict[str, Result]]]) -> None:
    """Two charts: median ms per mode for each model and phase (log scale), and the ratios the table prints."""
    from torchtpu.tools import plots

    groups = [(m, p) for m, phases in all_results.items() for p in phases]
    labels = [f"{m} {p}" for m, p in groups]

    def result(m: str, p: str, mode: str) -> Result:
        return all_results[m][p].get(mode) or Result()

    medians = {mode: [result(m, p, mode).ms for m, p in groups] for mode in MODES}
    ratios = {f"{a} / {b}": [ratio(result(m, p, a), result(m, p, b)) for m, p in groups]
              for a, b in [("tpu compiled", "jax.jit"), ("tpu graph", "jax.jit"), ("tpu fused", "tpu graph"),
                           ("tpu eager", "tpu fused"), ("tpu eager", "tpu compiled"),
                           ("tpu eager", "tpu graph"), ("tpu eager", "cpu eager")]}
    try:
        plots.draw(path,
                   plots.Bars("median ms per step (lower is faster)", labels, medians, "ms", log=True),
                   plots.Bars("ratios (above the line: the first is slower)", labels, ratios, "x", log=True,
                              reference=1.0, reference_label="1x"),
                   title="torchtpu compile_step: eager vs compiled vs CPU vs jax.jit")
    except plots.PlotsUnavailable as missing:
        print(f"--plot {path}: {missing}; no plot written")
        return
    print(f"plot written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per mode (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after the first call (default 3)")
    parser.add_argument("--model", choices=["llama", "resnet", "all"], default="all")
    parser.add_argument("--size", choices=list(LLAMA_SIZES), default="tiny", help="the Llama's size (default tiny)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="bfloat16: torch modes under autocast, jax with the same casting policy")
    parser.add_argument("--precision", choices=list(JAX_PRECISION), default=torch.get_float32_matmul_precision(),
                        help="float32 matmul precision, torch's setting and jax's equivalent (default torch's)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated modes to run (default all: {','.join(MODES)})")
    parser.add_argument("--phases", default="train,inference",
                        help="comma-separated phases to run (default train,inference)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the chip's peak TFLOP/s for MFU (default: known TPUs by name, else no MFU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu-threads", type=int, default=1,
                        help="torch CPU threads for the cpu eager column (default 1; 0 keeps torch's default)")
    parser.add_argument("--plot", metavar="OUT.png", help="also draw the medians as a bar chart")
    parser.add_argument("--isolate", action="store_true",
                        help="run each mode in a process of its own, one after another, so every peak is "
                             "the mode's own process-wide peak (jax and torchtpu share one TPU allocator)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="after timing, run N more steps of each mode under jax's profiler and print the "
                             "device's time per XLA module and op (a TPU; needs jax)")
    parser.add_argument("--profile-dump", metavar="DIR",
                        help="with --profile, write every device op of each mode (ms and runs per step, XLA "
                             "category, HLO) to DIR/<phase>_<mode>.json, to compare two modes' ops offline")
    parser.add_argument("--results-json", metavar="OUT.json", help=argparse.SUPPRESS)  # --isolate's children
    args = parser.parse_args()
    global PROFILE_STEPS, PROFILE_DUMP
    PROFILE_STEPS = args.profile
    PROFILE_DUMP = Path(args.profile_dump) if args.profile_dump else None
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")
    args.phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if not args.phases or set(args.phases) - {"train", "inference"}:
        parser.error(f"--phases: choose from train, inference (got {args.phases})")

    runs = {"llama": llama_results, "resnet": resnet_results}
    chosen = list(runs) if args.model == "all" else [args.model]
    if args.isolate:
        all_results, device_name = isolated_results(args, chosen)
        report(args, chosen, all_results, device_name, process_peaks=True)
        return

    if args.cpu_threads > 0:
        torch.set_num_threads(args.cpu_threads)
    torch.set_float32_matmul_precision(args.precision)
    tpu_ok = torchtpu.is_available()
    if not tpu_ok:
        print(f"note: no tpu runtime ({torchtpu.init_error()}); the tpu columns are skipped")
    compile_ok = tpu_ok and "tpu" in torch._dynamo.list_backends()
    if tpu_ok and not compile_ok:
        print('note: torch.compile backend "tpu" is not registered (graph mode not there yet); '
              "the tpu compiled column is skipped")
    platform = torchtpu._C.platform_name() if tpu_ok else "none"
    # jax runs where torchtpu does: on a TPU host beside it on the chip, else on XLA's CPU backend.
    os.environ.setdefault("JAX_PLATFORMS", "tpu" if platform == "tpu" else "cpu")
    device_name = torch.tpu.get_device_name() if tpu_ok else "none"
    peak_tflops = peak_tflops_of(args, device_name)
    print(f"compile_step: Llama {args.size}, {args.dtype}, matmul precision {args.precision}, {args.steps} timed "
          f"steps after {args.warmup} warm-up, torch {torch.__version__} ({torch.get_num_threads()} CPU threads), "
          f"PJRT plugin {platform} ({device_name}), MFU against "
          f"{f'{peak_tflops:g} TFLOP/s' if peak_tflops else 'nothing (no --peak-tflops)'}")

    all_results = {}
    for name in chosen:
        print(f"\n{name}:")
        all_results[name] = runs[name](args, compile_ok, tpu_ok)
    if args.results_json:
        Path(args.results_json).write_text(json.dumps({"device_name": device_name, "results": {
            name: {phase: {mode: dataclasses.asdict(r) for mode, r in by_mode.items()}
                   for phase, by_mode in phases.items()} for name, phases in all_results.items()}}))
    report(args, chosen, all_results, device_name, process_peaks=len(args.modes) == 1 and len(args.phases) == 1)


def peak_tflops_of(args, device_name: str) -> float | None:
    return args.peak_tflops or next((t for name, t in PEAK_TFLOPS.items() if device_name.startswith(name)), None)


def report(args, chosen: list[str], all_results: dict, device_name: str, process_peaks: bool) -> None:
    peak_tflops = peak_tflops_of(args, device_name)
    for name in chosen:
        if name == "llama":
            tokens, flops = llama_work(LLAMA_SIZES[args.size])
            print_table(name, all_results[name], tokens, flops, peak_tflops, process_peaks)
        else:
            print_table(name, all_results[name], process_peaks=process_peaks)
    if args.plot:
        plot(args.plot, all_results)


if __name__ == "__main__":
    main()
