"""One rank of a multi-process test in tests/test_distributed.py: `python distributed_worker.py SCENARIO`
with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set. Each rank drives its own tpu device (the CPU
plugin's device `rank`), checks its results against values computed on the CPU and exits 0; a failed
check raises (exit 1, traceback on stderr)."""

from __future__ import annotations

import copy
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import torchtpu  # noqa: F401  (registers the "tpu" c10d backend)

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
TPU = torch.device("tpu", RANK)


def close(actual: torch.Tensor, expected: torch.Tensor, **tolerances) -> None:
    torch.testing.assert_close(actual.detach().cpu(), expected.detach().cpu(), **tolerances)


def collectives() -> None:
    n = WORLD
    ranks = torch.arange(n, dtype=torch.float32)

    def mine(values: torch.Tensor) -> torch.Tensor:  # this rank's input: its rank + 1, times `values`
        return (values * (RANK + 1)).to(TPU)

    base = torch.tensor([1.0, -2.0, 3.0, 0.5])
    for op, expected in [(dist.ReduceOp.SUM, base * (ranks + 1).sum()), (dist.ReduceOp.AVG, base * (ranks + 1).mean()),
                         (dist.ReduceOp.MAX, torch.maximum(base * n, base)),
                         (dist.ReduceOp.MIN, torch.minimum(base * n, base)),
                         (dist.ReduceOp.PRODUCT, base ** n * torch.arange(1, n + 1).prod())]:
        t = mine(base)
        dist.all_reduce(t, op=op)
        close(t, expected)
    ints = torch.full((3,), RANK + 1, dtype=torch.int64, device=TPU)
    dist.all_reduce(ints)
    close(ints, torch.full((3,), n * (n + 1) // 2, dtype=torch.int64))

    # async: a Work to wait on, and its future
    t = mine(base)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    close(work.get_future().wait()[0], base * (ranks + 1).sum())

    gathered = [torch.empty(4, device=TPU) for _ in range(n)]
    dist.all_gather(gathered, mine(base))
    for r, g in enumerate(gathered):
        close(g, base * (r + 1))
    out = torch.empty(n, 4, device=TPU)
    dist.all_gather_into_tensor(out, mine(base).view(1, 4))
    close(out, torch.stack([base * (r + 1) for r in range(n)]))

    # reduce_scatter: rank r receives the sum over ranks of their chunk r
    chunks = [mine(base + c) for c in range(n)]
    received = torch.empty(4, device=TPU)
    dist.reduce_scatter(received, chunks)
    close(received, (base + RANK) * (ranks + 1).sum())
    received = torch.empty(2, device=TPU)
    dist.reduce_scatter_tensor(received, mine(torch.arange(2.0 * n)), op=dist.ReduceOp.AVG)
    close(received, torch.arange(2.0 * n)[2 * RANK:2 * RANK + 2] * (ranks + 1).mean())

    t = mine(base)
    dist.broadcast(t, src=n - 1)
    close(t, base * n)
    t = mine(base)
    dist.reduce(t, dst=0)
    if RANK == 0:
        close(t, base * (ranks + 1).sum())

    # all_to_all_single with uneven splits: rank r sends r + 1 + j elements to rank j
    send_splits = [RANK + 1 + j for j in range(n)]
    recv_splits = [r + 1 + RANK for r in range(n)]
    source = torch.arange(float(sum(send_splits)), device=TPU) + 100 * RANK
    received = torch.empty(sum(recv_splits), device=TPU)
    dist.all_to_all_single(received, source, recv_splits, send_splits)
    expected = []
    for r in range(n):
        start = sum(r + 1 + j for j in range(RANK))
        expected.append(torch.arange(float(start), start + r + 1 + RANK) + 100 * r)
    close(received, torch.cat(expected))
    outs = [torch.empty(2, device=TPU) for _ in range(n)]
    dist.all_to_all(outs, [torch.full((2,), 10.0 * RANK + j, device=TPU) for j in range(n)])
    for r, o in enumerate(outs):
        close(o, torch.full((2,), 10.0 * r + RANK))

    # gather / scatter through rank 0
    gathered = [torch.empty(4, device=TPU) for _ in range(n)] if RANK == 0 else None
    dist.gather(mine(base), gathered, dst=0)
    if RANK == 0:
        for r, g in enumerate(gathered):
            close(g, base * (r + 1))
    piece = torch.empty(4, device=TPU)
    dist.scatter(piece, [(base + r).to(TPU) for r in range(n)] if RANK == 0 else None, src=0)
    close(piece, base + RANK)

    # point to point around a ring
    right, left = (RANK + 1) % n, (RANK - 1) % n
    incoming = torch.empty(4, device=TPU)
    ops = [dist.P2POp(dist.isend, mine(base), right), dist.P2POp(dist.irecv, incoming, left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    close(incoming, base * (left + 1))
    if RANK == 0:
        dist.send(mine(base), dst=1)
    elif RANK == 1:
        incoming = torch.empty(4, device=TPU)
        dist.recv(incoming, src=0)
        close(incoming, base)

    # functional collectives (what DTensor and compiled graphs call)
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD
    close(funcol.all_reduce(mine(base), "sum", group), base * (ranks + 1).sum())
    close(funcol.all_gather_tensor(mine(base), 0, group), torch.cat([base * (r + 1) for r in range(n)]))
    close(funcol.reduce_scatter_tensor(mine(torch.arange(2.0 * n)), "sum", 0, group),
          torch.arange(2.0 * n)[2 * RANK:2 * RANK + 2] * (ranks + 1).sum())

    # a strided (non-contiguous) tpu tensor is reduced in place
    t = mine(torch.arange(12.0)).view(3, 4).t()
    dist.all_reduce(t)
    close(t, torch.arange(12.0).view(3, 4).t() * (ranks + 1).sum())
    dist.barrier()


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 4))


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4 * WORLD, 8, generator=g), torch.randn(4 * WORLD, 4, generator=g)) for _ in range(steps)]


def train_on_cpu(model: torch.nn.Module, data) -> torch.nn.Module:
    """Single-process CPU training on every rank's data at once: what data parallel must reproduce."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in data:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return model


def train_data_parallel(model: torch.nn.Module, data) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in data:
        optimizer.zero_grad()
        shard = slice(4 * RANK, 4 * (RANK + 1))
        torch.nn.functional.mse_loss(model(x[shard].to(TPU)), y[shard].to(TPU)).backward()
        optimizer.step()


def ddp() -> None:
    from torch.nn.parallel import DistributedDataParallel

    data = batches(3)
    model = DistributedDataParallel(mlp().to(TPU))
    train_data_parallel(model, data)
    for p, expected in zip(model.module.parameters(), train_on_cpu(mlp(), data).parameters()):
        close(p, expected, rtol=1e-5, atol=1e-6)


def fsdp() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    mesh = init_device_mesh("tpu", (WORLD,))
    model = mlp().to(TPU)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    data = batches(3)
    train_data_parallel(model, data)
    for p, expected in zip(model.parameters(), train_on_cpu(mlp(), data).parameters()):
        assert p.to_local().numel() < expected.numel() or expected.numel() < WORLD  # sharded
        close(p.full_tensor(), expected, rtol=1e-5, atol=1e-6)


def tensor_parallel() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.norm = torch.nn.LayerNorm(8)
            self.up = torch.nn.Linear(8, 16)
            self.down = torch.nn.Linear(16, 8)

        def forward(self, x):
            return self.down(torch.relu(self.up(self.norm(x))))

    mesh = init_device_mesh("tpu", (WORLD,))
    reference = Block()
    model = parallelize_module(copy.deepcopy(reference).to(TPU), mesh, {
        "norm": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(),
    })
    x = torch.randn(2, 2 * WORLD, 8, generator=torch.Generator().manual_seed(2))
    local = x.chunk(WORLD, dim=1)[RANK].to(TPU)  # sequence parallel: each rank holds a slice of the sequence
    out = model(local)
    expected = reference(x)
    close(out, expected, rtol=1e-5, atol=1e-6)
    out.sum().backward()
    expected.sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        close(grad, q.grad, rtol=1e-4, atol=1e-5)


def compiled() -> None:
    # A collective inside a compiled function: the graph runs around it (host transport).
    def step(x):
        y = x * 2
        dist.all_reduce(y)
        return y + 1

    x = torch.full((4,), float(RANK + 1), device=TPU)
    out = torch.compile(step, backend="tpu")(x)
    close(out, torch.full((4,), 2.0 * WORLD * (WORLD + 1) / 2 + 1))


def dead_peer() -> None:
    # Rank 1 leaves; rank 0's next collective must fail within the group's timeout, not hang.
    if RANK == 1:
        os._exit(0)
    t = torch.ones(4, device=TPU)
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        print(f"rank 0: all_reduce raised: {str(e).splitlines()[0]}")
        os._exit(0)
    raise AssertionError("all_reduce returned although a peer had died")


def mismatched() -> None:
    # Ranks calling different collectives (sizes) must error, not hang.
    t = torch.ones(4 if RANK == 0 else 1000, device=TPU)
    try:
        if RANK == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, src=1)
    except RuntimeError as e:
        print(f"rank {RANK}: raised: {str(e).splitlines()[0]}")
        os._exit(0)
    raise AssertionError("mismatched collectives returned")


SCENARIOS = {f.__name__: f for f in (collectives, ddp, fsdp, tensor_parallel, compiled, dead_peer, mismatched)}

if __name__ == "__main__":
    scenario = sys.argv[1]
    torch.set_num_threads(1)
    torch.tpu.set_device(RANK)
    timeout = timedelta(seconds=float(os.environ.get("TEST_COLLECTIVE_TIMEOUT", "60")))
    dist.init_process_group(device_id=TPU, timeout=timeout)
    assert dist.get_backend() == "tpu", dist.get_backend()
    SCENARIOS[scenario]()
    if scenario not in ("dead_peer", "mismatched"):
        dist.destroy_process_group()
    print(f"rank {RANK}: {scenario} ok")
