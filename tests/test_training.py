"""A whole training loop on tpu matches the CPU, with nothing running on the CPU behind its back."""

import copy
import json
import os

import pytest

from conftest import no_cpu_fallback, run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TRAIN = r"""
import json, sys
sys.path.insert(0, {examples!r})
import torch, torchtpu
import train_mlp
# On a TPU host this runs in the test's process: count only this program's fallbacks
before = dict(torchtpu.debug.metrics()["cpu_fallbacks"])
tpu = train_mlp.train("tpu", steps=8, batch=16)
cpu = train_mlp.train("cpu", steps=8, batch=16)
print(json.dumps({{"tpu": tpu, "cpu": cpu, "fallbacks": torchtpu.debug.fallbacks_since(before)}}))
"""


def test_mlp_trains_like_cpu_with_fallback_forbidden():
    code = TRAIN.format(examples=os.path.join(ROOT, "examples"))
    proc = run_python(code, {"TORCHTPU_FALLBACK": "error"}, in_process_on_tpu=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["fallbacks"] == {}, out["fallbacks"]
    assert len(out["tpu"]) == 8
    for a, b in zip(out["tpu"], out["cpu"]):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (out["tpu"], out["cpu"])
    assert out["tpu"][-1] < out["tpu"][0]  # it learns


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing_gives_the_gradients_of_cpu(use_reentrant):
    """torch.utils.checkpoint on tpu: the blocks' activations are dropped and recomputed in backward
    (with the same dropout mask, from the tpu generator's saved state), and the gradients are CPU's."""
    import torch
    import torch.utils.checkpoint as checkpoint

    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Dropout(0.0))
                                 for _ in range(3))
    x = torch.randn(4, 16)

    def loss_of(modules, inputs, checkpointed):
        h = inputs.requires_grad_()
        for block in modules:
            h = checkpoint.checkpoint(block, h, use_reentrant=use_reentrant) if checkpointed else block(h)
        return h.square().mean()

    loss_of(blocks, x.clone(), False).backward()
    expected = [p.grad.clone() for p in blocks.parameters()]
    on_tpu = copy.deepcopy(blocks).to("tpu")
    for p in on_tpu.parameters():
        p.grad = None
    with no_cpu_fallback():
        loss_of(on_tpu, x.to("tpu"), True).backward()
    for got, want in zip(on_tpu.parameters(), expected):
        torch.testing.assert_close(got.grad.cpu(), want, rtol=1e-5, atol=1e-6)

    # with dropout, the recomputation replays the forward's mask (from the tpu generator's saved
    # state): the gradients are those of the same step without checkpointing
    dropped = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.5)).to("tpu")
    grads = []
    for checkpointed in (False, True):
        torch.manual_seed(1)
        dropped.zero_grad()
        h = x.to("tpu").requires_grad_()
        h = checkpoint.checkpoint(dropped, h, use_reentrant=use_reentrant) if checkpointed else dropped(h)
        h.square().sum().backward()
        grads.append(dropped[0].weight.grad.cpu())
    assert torch.equal(grads[0], grads[1])
