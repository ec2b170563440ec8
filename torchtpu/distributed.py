"""torch.distributed on "tpu": the c10d backend named "tpu", one process per device.

    torch.tpu.set_device(local_rank)
    dist.init_process_group(device_id=torch.device("tpu", local_rank))   # picks the "tpu" backend

The backend (a C++ c10d::Backend, runtime/aten/distributed.cc) hands every collective to a
transport. The one this build has is the host transport: tpu tensors are copied to host memory,
the processes run the collective over gloo (on the store `init_process_group` made), and the
results are copied back into the tpu tensors. A collective has finished when its call returns: the
Work it gives back is complete and its future holds the written tensors.

Why host memory: running collectives inside executables (StableHLO all_reduce & co. across
processes) needs a PJRT plugin that joins processes through a distributed key-value store. The XLA
CPU plugin installed here (xla-cpu-pjrt 0.0.1) takes no such store (the one client option it reads
is cpu_device_count), so on it every cross-process collective must leave the device; see
the README's "Distributed training" section. CPU tensors on a "tpu" group go straight to gloo.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (AllgatherOptions, AllreduceOptions, AllToAllOptions, BarrierOptions,
                                        BroadcastOptions, GatherOptions, ProcessGroupGloo, ReduceOp, ReduceOptions,
                                        ScatterOptions)

# c10d::ReduceOp::RedOpType, as runtime/aten/distributed.cc passes it.
_REDUCE_OPS = {0: ReduceOp.SUM, 1: ReduceOp.AVG, 2: ReduceOp.PRODUCT, 3: ReduceOp.MIN, 4: ReduceOp.MAX,
               5: ReduceOp.BAND, 6: ReduceOp.BOR, 7: ReduceOp.BXOR}
_AVG = 1


def _on_host(t: torch.Tensor) -> torch.Tensor:
    """A contiguous host tensor with t's values (t itself when it already is one)."""
    return t.detach().to("cpu").contiguous()


def _write_back(t: torch.Tensor, host: torch.Tensor) -> None:
    if host is not t:
        with torch.no_grad():
            t.copy_(host)


class HostTransport:
    """Collectives through host memory over gloo: copy in, run, copy back, all before returning."""

    name = "host (gloo)"

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        self.rank, self.size = rank, size
        self.gloo = ProcessGroupGloo(dist.PrefixStore("torchtpu-host/", store), rank, size, timeout)
        self._sends: list = []  # sends still in flight

    # The gloo side: one call, waited for (a timeout or a dead peer raises here).
    def _reduce_all(self, host: torch.Tensor, op: int) -> None:
        opts = AllreduceOptions()
        opts.reduceOp = ReduceOp.SUM if op == _AVG else _REDUCE_OPS[op]  # gloo has no AVG
        self.gloo.allreduce([host], opts).wait()
        if op == _AVG:
            host.div_(self.size)

    def _gather_all(self, host_outputs: list[torch.Tensor], host_input: torch.Tensor) -> None:
        self.gloo.allgather([host_outputs], [host_input], AllgatherOptions()).wait()

    # What runtime/aten/distributed.cc calls, by c10d collective.
    def allreduce(self, tensors: list[torch.Tensor], op: int) -> None:
        for t in tensors:
            host = _on_host(t)
            self._reduce_all(host, op)
            _write_back(t, host)

    def broadcast(self, tensors: list[torch.Tensor], root: int) -> None:
        opts = BroadcastOptions()
        opts.rootRank = root
        for t in tensors:
            host = _on_host(t)
            self.gloo.broadcast([host], opts).wait()
            _write_back(t, host)

    def reduce(self, tensors: list[torch.Tensor], root: int, op: int) -> None:
        opts = ReduceOptions()
        opts.rootRank = root
        opts.reduceOp = ReduceOp.SUM if op == _AVG else _REDUCE_OPS[op]
        for t in tensors:
            host = _on_host(t)
            self.gloo.reduce([host], opts).wait()
            if self.rank == root:
                if op == _AVG:
                    host.div_(self.size)
                _write_back(t, host)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor]) -> None:
        for outs, t in zip(outputs, inputs):
            hosts = [torch.empty(o.shape, dtype=o.dtype) for o in outs]
            self._gather_all(hosts, _on_host(t))
            for o, h in zip(outs, hosts):
                _write_back(o, h)

    def allgather_into_tensor(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> None:
        for out, t in zip(outputs, inputs):
            host = torch.empty(out.shape, dtype=out.dtype)
            chunks = list(host.view(self.size, -1).unbind(0))
            self._gather_all(chunks, _on_host(t).view(-1))
            _write_back(out, host)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], root: int) -> None:
        opts = GatherOptions()
        opts.rootRank = root
        hosts = [[torch.empty(o.shape, dtype=o.dtype) for o in outs] for outs in outputs]
        self.gloo.gather(hosts, [_on_host(t) for t in inputs], opts).wait()
        for outs, hs in zip(outputs, hosts):
            for o, h in zip(outs, hs):
                _write_back(o, h)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], root: int) -> None:
        opts = ScatterOptions()
        opts.rootRank = root
        hosts = [torch.empty(o.shape, dtype=o.dtype) for o in outputs]
        self.gloo.scatter(hosts, [[_on_host(t) for t in ins] for ins in inputs], opts).wait()
        for o, h in zip(outputs, hosts):
            _write_back(o, h)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], op: int) -> None:
        for out, ins in zip(outputs, inputs):
            host = torch.stack([_on_host(t) for t in ins])
            self._reduce_all(host, op)
            _write_back(out, host[self.rank])

    def reduce_scatter_tensor(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], op: int) -> None:
        for out, t in zip(outputs, inputs):
            host = _on_host(t)
            self._reduce_all(host, op)
            _write_back(out, host.view(self.size, -1)[self.rank].view(out.shape))

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_splits: list[int],
                      input_splits: list[int]) -> None:
        host = torch.empty(output.shape, dtype=output.dtype)
        self.gloo.alltoall_base(host, _on_host(input), list(output_splits), list(input_splits),
                                AllToAllOptions()).wait()
        _write_back(output, host)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> None:
        flat_in = torch.cat([_on_host(t).view(-1) for t in inputs])
        host = torch.empty(sum(o.numel() for o in outputs), dtype=outputs[0].dtype)
        self.gloo.alltoall_base(host, flat_in, [o.numel() for o in outputs], [t.numel() for t in inputs],
                                AllToAllOptions()).wait()
        for o, h in zip(outputs, host.split([o.numel() for o in outputs])):
            _write_back(o, h.view(o.shape))

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> None:
        # The values are on the host already, so the tpu tensors are free to change: the send may
        # finish later (two ranks sending to each other must not wait for each other's recv).
        self._sends = [w for w in self._sends if not w.is_completed()]
        self._sends.append(self.gloo.send([_on_host(t) for t in tensors], dst, tag))

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> None:
        hosts = [torch.empty(t.shape, dtype=t.dtype) for t in tensors]
        work = self.gloo.recv_anysource(hosts, tag) if src < 0 else self.gloo.recv(hosts, src, tag)
        work.wait()
        for t, h in zip(tensors, hosts):
            _write_back(t, h)

    def barrier(self) -> None:
        for work in self._sends:  # a send that failed raises here
            work.wait()
        self._sends = []
        self.gloo.barrier(BarrierOptions()).wait()


def _create_backend(store, rank: int, size: int, timeout: timedelta):
    import torchtpu

    torchtpu._require_runtime()
    return torchtpu._C._tpu_backend(rank, size, HostTransport(store, rank, size, timeout))


def register_backend() -> None:
    """The c10d backend "tpu", the default for device "tpu" (as nccl is for cuda)."""
    if dist.is_available() and "tpu" not in dist.Backend.backend_list:
        dist.Backend.register_backend("tpu", _create_backend, devices=["tpu"])
