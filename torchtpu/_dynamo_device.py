"""The device interface dynamo looks up for "tpu" (streams, events, device queries while tracing).

A tpu device runs its work in one ordered PJRT queue, so every stream is that queue: a stream or
event is complete once the device has finished what was enqueued before it was waited on."""

from __future__ import annotations

import torch
from torch._dynamo.device_interface import DeviceInterface

import torchtpu


def _device(index=None) -> torch.device:
    return torch.device("tpu", torch.tpu.current_device() if index is None else index)


class TpuInterface(DeviceInterface):
    device = torch.tpu.device

    Stream = torch.tpu.Stream
    Event = torch.tpu.Event

    class Worker:
        @staticmethod
        def set_device(device: int) -> None:
            torch.tpu.set_device(device)

        @staticmethod
        def current_device() -> int:
            return torch.tpu.current_device()

        @staticmethod
        def get_device_properties(device=None):
            return torch.tpu.get_device_properties(device)

    current_device = staticmethod(torch.tpu.current_device)
    set_device = staticmethod(torch.tpu.set_device)
    device_count = staticmethod(torch.tpu.device_count)
    is_available = staticmethod(torch.tpu.is_available)
    synchronize = staticmethod(torch.tpu.synchronize)
    memory_allocated = staticmethod(torch.tpu.memory_allocated)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        return TpuInterface.exchange_device(device)

    @staticmethod
    def exchange_device(device: int) -> int:
        previous = torch.tpu.current_device()
        torch.tpu.set_device(device)
        return previous

    current_stream = staticmethod(torch.tpu.current_stream)
    stream = staticmethod(torch.tpu.stream)
    set_stream = staticmethod(torch.tpu.set_stream)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        pass

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return 0

    @staticmethod
    def get_compute_capability(device=None) -> str:
        return torchtpu._C.device_kind(_device(device if isinstance(device, int) else None).index)

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True
