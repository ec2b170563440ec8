"""Each example in examples/ trains its tiny configuration on tpu exactly as on the CPU (same seed,
same initial weights, same batches) with TORCHTPU_FALLBACK=error, so nothing runs on the CPU
behind the tpu run's back; then runs its inference on tpu, also without fallback. The same again
compiled (`train(..., compile=True)`, what `--compile` runs), which must also run each training
step as a few graphs instead of op by op; and with the whole step captured by torch.tpu.graph
(`train(..., graph=True)`, what `--graph` runs): its last step is one replayed module.

One interpreter per example runs everything (imports and CPU losses are shared): eager tpu, CPU,
then compiled tpu, each printing its results as a JSON line as soon as it has them, so an eager
test still reports if the compiled run fails or crashes.
"""

import functools
import json
import os

import pytest

from conftest import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = ["llama", "qwen", "mingpt", "resnet", "dlrm", "unet"]
STEPS = 3  # the last step is steady state: no capture, optimizer state already created
# Compiled, a training step must run fewer than this fraction of the executions eager mode runs.
COMPILED_EXECUTIONS_FRACTION = 1 / 3

RUN = r"""
import json, sys, traceback
sys.path.insert(0, {examples!r})
import torch, torchtpu
import common
import {name} as example

def executions():
    return torchtpu.debug.metrics()["executions"]

# The executions of each step, counted where fit() advances its progress bar (once a step,
# after the step's loss.item() waited for it).
step_ends = []
advance = common.Progress.update
def counting_update(bar, loss, count):
    step_ends.append(executions())
    advance(bar, loss, count)
common.Progress.update = counting_update

def train_on_tpu(compile, graph=False):
    model = example.build(True, 0)
    fallbacks = dict(torchtpu.debug.metrics()["cpu_fallbacks"])
    step_ends[:] = [executions()]
    losses = example.train("tpu", {steps}, tiny=True, seed=0, model=model, compile=compile, graph=graph)
    per_step = [b - a for a, b in zip(step_ends, step_ends[1:])]
    with torch.no_grad():  # inference on tpu, with fallback still forbidden; compiled as main() does
        example.infer((torch.compile(model, backend="tpu") if compile else model).eval(), "tpu", True, 0)
    return {{"losses": losses, "executions": per_step, "fallbacks": torchtpu.debug.fallbacks_since(fallbacks)}}

print(json.dumps({{"tpu": train_on_tpu(compile=False)}}), flush=True)
print(json.dumps({{"cpu": example.train("cpu", {steps}, tiny=True, seed=0)}}), flush=True)
try:
    compiled = train_on_tpu(compile=True)
    from torchtpu import _compile
    compiled["graph"] = _compile.stats()
    print(json.dumps({{"compiled": compiled}}), flush=True)
except Exception:
    print(json.dumps({{"compiled_error": traceback.format_exc()[-4000:]}}), flush=True)
try:
    print(json.dumps({{"graphed": train_on_tpu(compile=False, graph=True)}}), flush=True)
except Exception:
    print(json.dumps({{"graphed_error": traceback.format_exc()[-4000:]}}), flush=True)
"""


def run_example(name: str) -> dict:
    """What RUN printed for example `name`, merged, plus the interpreter's stderr (in the eager mode
    the test runs in: a strict_eager test does not reuse what a fused run printed)."""
    return run_example_in_mode(name, os.environ.get("TORCHTPU_EAGER_MODE", "strict"))


@functools.cache
def run_example_in_mode(name: str, eager_mode: str) -> dict:
    code = RUN.format(examples=os.path.join(ROOT, "examples"), name=name, steps=STEPS)
    proc = run_python(code, {"TORCHTPU_FALLBACK": "error", "TORCHTPU_EAGER_MODE": eager_mode}, timeout=600,
                      in_process_on_tpu=True)
    results = {"stderr": proc.stderr[-4000:], "returncode": proc.returncode}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            results.update(json.loads(line))
    return results


def assert_losses_match(tpu: list, cpu: list) -> None:
    assert len(tpu) == STEPS
    for a, b in zip(tpu, cpu):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (tpu, cpu)


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_trains_like_cpu_with_fallback_forbidden(name):
    out = run_example(name)
    assert "tpu" in out and "cpu" in out, out["stderr"]
    assert out["tpu"]["fallbacks"] == {}
    assert_losses_match(out["tpu"]["losses"], out["cpu"])


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_compiled_trains_like_cpu_in_few_executions(name, strict_eager):
    out = run_example(name)
    assert "compiled_error" not in out, out["compiled_error"]
    assert "compiled" in out and "cpu" in out and out["returncode"] == 0, out["stderr"]
    compiled = out["compiled"]
    assert compiled["fallbacks"] == {}
    assert_losses_match(compiled["losses"], out["cpu"])
    eager_step, compiled_step = out["tpu"]["executions"][-1], compiled["executions"][-1]
    assert compiled_step < eager_step * COMPILED_EXECUTIONS_FRACTION, (
        f"a steady-state training step ran {compiled_step} executions compiled, {eager_step} eager",
        compiled["graph"])


@pytest.mark.parametrize("flags", [["--ddp"], ["--fsdp"], ["--tp"], ["--ddp", "--compile"]],
                         ids=["ddp", "fsdp", "tp", "ddp-compiled"])
def test_llama_trains_under_torchrun_like_single_process_cpu(flags):
    # Two ranks, each its own tpu device; the losses printed are the mean over the ranks, which for
    # data parallel (each rank half the batch) and tensor parallel must equal one CPU process
    # training on the whole batch.
    import subprocess
    import sys

    from conftest import skip_if_device_is_exclusive

    skip_if_device_is_exclusive()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               os.path.join(ROOT, "examples", "llama.py"), "--tiny", "--steps", str(STEPS), *flags]
    env = dict(os.environ, TORCHTPU_FALLBACK="error", OMP_NUM_THREADS="1")
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("loss: first"))
    first, last = (float(word.strip(",")) for word in line.split()[2:5:2])
    cpu = run_example("llama")["cpu"]
    assert abs(first - cpu[0]) <= 2e-4 and abs(last - cpu[-1]) <= 2e-4, (line, cpu)
    assert "ops that ran on the CPU (rank 0): 0" in proc.stdout


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_graphed_trains_like_cpu_replaying_one_module(name):
    out = run_example(name)
    assert "graphed_error" not in out, out["graphed_error"]
    assert "graphed" in out and out["returncode"] == 0, out["stderr"]
    graphed = out["graphed"]
    assert graphed["fallbacks"] == {}
    assert_losses_match(graphed["losses"], out["cpu"])
    # The last step captures the graph on its batch and replays it: one execution for the whole step.
    assert graphed["executions"][-1] == 1, graphed["executions"]
