"""Each example in examples/ trains its tiny configuration on tpu exactly as on the CPU (same seed,
same initial weights, same batches) with TORCHTPU_FALLBACK=error, so nothing runs on the CPU
behind the tpu run's back.

An example that reaches an op with no tpu kernel yet xfails, naming the op; any other failure fails.
"""

import os
import re

import pytest

from conftest import last_json, run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = ["llama", "qwen", "mingpt", "resnet", "dlrm", "unet"]
STEPS = 3

TRAIN = r"""
import json, sys
sys.path.insert(0, {examples!r})
import torch, torchtpu
import {name} as example
tpu = example.train("tpu", {steps}, tiny=True, seed=0)
cpu = example.train("cpu", {steps}, tiny=True, seed=0)
print(json.dumps({{"tpu": tpu, "cpu": cpu, "fallbacks": torchtpu.debug.metrics()["cpu_fallbacks"]}}))
"""

# What PyTorch says when a tpu op has neither a spec nor a way to the CPU.
MISSING_OP = [r"torchtpu: (aten::\S+) has no spec, and TORCHTPU_FALLBACK=error forbids",
              r"(\w+) not implemented\. You are likely triggering this with tensor backend other than CPU"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_trains_like_cpu_with_fallback_forbidden(name):
    code = TRAIN.format(examples=os.path.join(ROOT, "examples"), name=name, steps=STEPS)
    proc = run_python(code, {"TORCHTPU_FALLBACK": "error"}, timeout=600)
    if proc.returncode != 0:
        missing = [m.group(1) for pattern in MISSING_OP for m in [re.search(pattern, proc.stderr)] if m]
        if missing:
            pytest.xfail(f"examples/{name}.py needs {missing[0]} on tpu")
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = last_json(proc.stdout)
    assert out["fallbacks"] == {}
    assert len(out["tpu"]) == STEPS
    for a, b in zip(out["tpu"], out["cpu"]):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (out["tpu"], out["cpu"])
