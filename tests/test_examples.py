"""Each example in examples/ trains its tiny configuration on tpu exactly as on the CPU (same seed,
same initial weights, same batches) with TORCHTPU_FALLBACK=error, so nothing runs on the CPU
behind the tpu run's back; then runs its inference on tpu, also without fallback.
"""

import os

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
model = example.build(True, 0)
tpu = example.train("tpu", {steps}, tiny=True, seed=0, model=model)
with torch.no_grad():
    example.infer(model.eval(), "tpu", True, 0)  # inference on tpu, with fallback still forbidden
cpu = example.train("cpu", {steps}, tiny=True, seed=0)
print(json.dumps({{"tpu": tpu, "cpu": cpu, "fallbacks": torchtpu.debug.metrics()["cpu_fallbacks"]}}))
"""

@pytest.mark.parametrize("name", EXAMPLES)
def test_example_trains_like_cpu_with_fallback_forbidden(name):
    code = TRAIN.format(examples=os.path.join(ROOT, "examples"), name=name, steps=STEPS)
    proc = run_python(code, {"TORCHTPU_FALLBACK": "error"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = last_json(proc.stdout)
    assert out["fallbacks"] == {}
    assert len(out["tpu"]) == STEPS
    for a, b in zip(out["tpu"], out["cpu"]):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (out["tpu"], out["cpu"])
