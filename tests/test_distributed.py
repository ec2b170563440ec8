"""torch.distributed on "tpu" (the c10d backend of torchtpu/distributed.py), several processes on this
machine, each rank its own CPU-plugin device: collectives against expected values, DDP and FSDP2
training against single-process CPU training, tensor parallel against the unsharded module, a
collective inside a compiled function, and failures (a dead peer, mismatched collectives) that
raise instead of hanging. Each test runs tests/distributed_worker.py once per rank."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch.distributed as dist

from conftest import skip_if_device_is_exclusive
from torchtpu.testing import free_port

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "distributed_worker.py")

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch without torch.distributed")


def launch(scenario: str, world: int, timeout: float = 240.0, collective_timeout: float = 60.0) -> list[str]:
    """Runs the scenario on `world` ranks; returns each rank's stdout. Fails with the ranks' output
    when one exits non-zero or the whole run outlives `timeout`."""
    skip_if_device_is_exclusive()
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), TEST_COLLECTIVE_TIMEOUT=str(collective_timeout), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, WORKER, scenario], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outputs, failed = [], []
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail(f"{scenario}: rank {rank} still running after {timeout} s (a hang)")
        outputs.append(out)
        if proc.returncode != 0:
            failed.append(f"--- rank {rank} exited {proc.returncode}\n{out}\n{err[-4000:]}")
    assert not failed, "\n".join(failed)
    return outputs


def test_every_collective_matches_expected_values_on_three_ranks():
    outputs = launch("collectives", 3)
    assert all("collectives ok" in out for out in outputs)


@pytest.mark.parametrize("scenario", ["ddp", "fsdp", "tensor_parallel", "compiled"])
def test_parallel_training_matches_single_process(scenario):
    outputs = launch(scenario, 2)
    assert all(f"{scenario} ok" in out for out in outputs)


def test_a_dead_peer_makes_the_collective_raise_within_the_timeout():
    outputs = launch("dead_peer", 2, timeout=120, collective_timeout=10)
    assert "all_reduce raised" in outputs[0]


def test_mismatched_collectives_raise_instead_of_hanging():
    outputs = launch("mismatched", 2, timeout=120, collective_timeout=10)
    assert any("raised" in out for out in outputs)


def test_tpu_is_the_default_backend_for_tpu_devices():
    assert "tpu" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map["tpu"] == "tpu"
