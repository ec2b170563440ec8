"""A whole training loop on tpu matches the CPU, with nothing running on the CPU behind its back."""

import json
import os

from conftest import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TRAIN = r"""
import json, sys
sys.path.insert(0, {examples!r})
import torch, torchtpu
import train_mlp
tpu = train_mlp.train("tpu", steps=8, batch=16)
cpu = train_mlp.train("cpu", steps=8, batch=16)
print(json.dumps({{"tpu": tpu, "cpu": cpu, "fallbacks": torchtpu.debug.metrics()["cpu_fallbacks"]}}))
"""


def test_mlp_trains_like_cpu_with_fallback_forbidden():
    code = TRAIN.format(examples=os.path.join(ROOT, "examples"))
    proc = run_python(code, {"TORCHTPU_FALLBACK": "error"}, in_process_on_tpu=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["fallbacks"] == {}
    assert len(out["tpu"]) == 8
    for a, b in zip(out["tpu"], out["cpu"]):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (out["tpu"], out["cpu"])
    assert out["tpu"][-1] < out["tpu"][0]  # it learns
