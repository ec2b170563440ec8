"""`torch.tpu`: the device module, shaped like `torch.cuda`."""

from __future__ import annotations

import contextlib

import torch

import torchtpu


def _C():
    return torchtpu._require_runtime()


def is_available() -> bool:
    return torchtpu._C_or_none() is not None and device_count() > 0


def is_initialized() -> bool:
    return torchtpu._C_or_none() is not None


def init() -> None:
    _C()


def __getattr__(name: str):
    # torch.cuda's `_initialized` flag, read by torch.utils.checkpoint (it saves and restores a
    # device's RNG state around recomputation only where the device module says it is initialized).
    if name == "_initialized":
        return is_initialized()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def device_count() -> int:
    ext = torchtpu._C_or_none()
    return ext.device_count() if ext is not None else 0


def current_device() -> int:
    return _C().current_device()


def _index(device) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "tpu":
        raise ValueError(f"Expected a tpu device, but got: {device}")
    return current_device() if device.index is None else device.index


def set_device(device) -> None:
    index = _index(device)
    count = device_count()
    if not 0 <= index < count:
        raise RuntimeError(f"Invalid device index {index}: torchtpu sees {count} device(s)")
    _C().set_device(index)


class device:
    """Context manager that makes `device` the current tpu device."""

    def __init__(self, device):
        self.index = _index(device)
        self.previous = None

    def __enter__(self):
        self.previous = current_device()
        set_device(self.index)

    def __exit__(self, *exc):
        set_device(self.previous)
        return False


def synchronize(device=None) -> None:
    _C().synchronize()


def get_device_name(device=None) -> str:
    ext = _C()
    return f"{ext.device_kind(_index(device))} ({ext.platform_name()} PJRT)"


def get_device_properties(device=None):
    ext = _C()
    index = _index(device)
    return _DeviceProperties(ext.device_kind(index), ext.platform_name(), ext.platform_version(), index)


class _DeviceProperties:
    def __init__(self, kind, platform, platform_version, index):
        self.name = kind
        self.platform = platform
        self.platform_version = platform_version
        self.index = index

    def __repr__(self):
        return (f"_TpuDeviceProperties(name={self.name!r}, platform={self.platform!r}, "
                f"platform_version={self.platform_version!r}, index={self.index})")


MATH_MODES = ("accurate", "fast")


def set_math_mode(mode: str) -> None:
    """How float32 transcendentals are computed on tpu: "accurate" (the default: exp, expm1, log,
    log1p, tanh and sigmoid within a few ulps, as on CPU) or "fast" (the backend's approximations;
    on a TPU up to ~4e-4 relative). Also TORCHTPU_MATH=fast. Matmul precision follows
    torch.set_float32_matmul_precision. Modules compiled under each mode are cached apart."""
    if mode not in MATH_MODES:
        raise ValueError(f"torch.tpu.set_math_mode: mode must be 'accurate' or 'fast', not {mode!r}")
    _C().set_accurate_math(mode == "accurate")


def get_math_mode() -> str:
    return "accurate" if _C().accurate_math() else "fast"


EAGER_MODES = ("strict", "blocking", "fused")


def set_eager_mode(mode: str) -> None:
    """How eager ops run on tpu: "strict" (the default on the CPU plugin and GPUs: each op is enqueued
    and returns at once, its results ready later; a host read waits), "blocking" (each op waits for the device before it
    returns, so a device error, an out-of-memory among them, surfaces at the op that caused it; for
    debugging, slower) or "fused" (ops are checked at the call, as in every mode, and recorded; what
    was recorded runs as one module when a value is needed: a host read such as .item() or print,
    torch.tpu.synchronize(), an op that needs values on the host, a CPU fallback, an optimizer's
    step, a size bound; a block met again reuses its compiled module; torch.compile graphs join the
    block as calls; the default on a TPU). Also TORCHTPU_EAGER_MODE. Results are the same in every mode."""
    if mode not in EAGER_MODES:
        raise ValueError(f"torch.tpu.set_eager_mode: mode must be one of {', '.join(map(repr, EAGER_MODES))}, "
                         f"not {mode!r}")
    _C()._set_eager_fused(mode == "fused")
    _C()._set_eager_blocking(mode == "blocking")
    torchtpu._fused_eager = mode == "fused"


def get_eager_mode() -> str:
    if _C()._eager_fused():
        return "fused"
    return "blocking" if _C()._eager_blocking() else "strict"


@contextlib.contextmanager
def eager_mode(mode: str):
    """set_eager_mode(mode) for the block, then the mode before it."""
    before = get_eager_mode()
    set_eager_mode(mode)
    try:
        yield
    finally:
        set_eager_mode(before)


# Each device has a default generator, a (seed, offset) pair that random ops advance; a seed
# reproduces the stream on tpu (it is not the CPU generator's stream).
def manual_seed(seed: int) -> None:
    """Seeds the current device's generator."""
    _C().set_generator_state(current_device(), int(seed) & 0xFFFFFFFFFFFFFFFF, 0)


def manual_seed_all(seed: int) -> None:
    for index in range(device_count()):
        _C().set_generator_state(index, int(seed) & 0xFFFFFFFFFFFFFFFF, 0)


def seed() -> None:
    _C().reseed_randomly(current_device())


def seed_all() -> None:
    for index in range(device_count()):
        _C().reseed_randomly(index)


def initial_seed() -> int:
    return _C().generator_state(current_device())[0]


def get_rng_state(device=None) -> torch.Tensor:
    """The generator's state as 16 bytes (seed, offset), like torch.cuda.get_rng_state."""
    seed_value, offset = _C().generator_state(_index(device))
    raw = seed_value.to_bytes(8, "little") + offset.to_bytes(8, "little")
    return torch.tensor(list(raw), dtype=torch.uint8)


def set_rng_state(state: torch.Tensor, device=None) -> None:
    raw = bytes(state.to(torch.uint8).tolist())
    if len(raw) != 16:
        raise ValueError("a tpu RNG state is 16 bytes (see get_rng_state)")
    _C().set_generator_state(_index(device), int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little"))


def get_rng_state_all() -> list:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states) -> None:
    for index, state in enumerate(states):
        set_rng_state(state, index)


# Memory, as torch.cuda reports it, from the runtime's per-device counts (the tpu allocator is a
# c10::DeviceAllocator, so torch.accelerator.memory_* report the same). There is no caching
# allocator: a PJRT buffer is made when a storage is first written and freed when its last tensor
# goes, so "reserved" and "active" equal "allocated".
def memory_stats(device=None) -> dict:
    """torch.cuda.memory_stats' keys: allocated/reserved/active bytes and allocation counts, each
    .all.current / .peak / .allocated / .freed."""
    return torch.accelerator.memory_stats(_index(device))


def memory_allocated(device=None) -> int:
    """Bytes held by live device buffers of `device`."""
    return torch.accelerator.memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    """The most bytes held at once since the process started or `reset_peak_memory_stats()`."""
    return torch.accelerator.max_memory_allocated(_index(device))


def device_memory_stats(device=None) -> dict:
    """The plugin allocator's own view of `device` (PJRT's device memory stats): "bytes_in_use" and,
    where the plugin keeps them, "peak_bytes_in_use", "bytes_limit" and "largest_alloc_size". Unlike
    memory_stats() it counts XLA's temporaries and other clients' buffers (jax's, in one process): it
    is the number to set beside jax's `device.memory_stats()`. Empty where the plugin keeps no count."""
    return dict(torchtpu._C.plugin_memory_stats(_index(device)))


def memory_reserved(device=None) -> int:
    return torch.accelerator.memory_reserved(_index(device))


def max_memory_reserved(device=None) -> int:
    return torch.accelerator.max_memory_reserved(_index(device))


def reset_peak_memory_stats(device=None) -> None:
    """Peaks start again from what is held now."""
    torch.accelerator.reset_peak_memory_stats(_index(device))


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(_index(device))


def empty_cache() -> None:
    """Nothing to release: buffers are freed as soon as no tensor holds them."""


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A table of `memory_stats()` for people, like torch.cuda.memory_summary()."""
    index = _index(device)
    stats = memory_stats(index)

    def size(n: int) -> str:
        for unit in ("B", "KiB", "MiB", "GiB"):
            if abs(n) < 1024 or unit == "GiB":
                return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
            n /= 1024

    rows = [("Allocated memory", "allocated_bytes", size), ("Buffers", "allocation", str)]
    if not abbreviated:
        rows.insert(1, ("Reserved memory", "reserved_bytes", size))
    width = 78
    lines = ["=" * width, f" torchtpu memory summary, device tpu:{index} ({get_device_name(index)})".ljust(width),
             "-" * width, f"{'':<20}{'current':>14}{'peak':>14}{'total made':>15}{'total freed':>15}", "-" * width]
    for title, key, fmt in rows:
        lines.append(f"{title:<20}" + "".join(f"{fmt(stats[f'{key}.all.{k}']):>{w}}"
                                               for k, w in (("current", 14), ("peak", 14), ("allocated", 15), ("freed", 15))))
    plugin = device_memory_stats(index)
    if plugin:
        held = ", ".join(f"{key} {size(value)}" for key, value in plugin.items())
        lines += ["-" * width, f" The plugin's allocator (with XLA's temporaries): {held}"[:width]]
    lines += ["-" * width, " No caching allocator: a buffer is freed when its last tensor is; reserved = allocated.",
              "=" * width]
    return "\n".join(lines)


# Autocast: torch.autocast("tpu", dtype=...) asks the device module which dtypes it may cast to;
# the per-op policy (CUDA's) is registered in C++ (runtime/aten/torch_autocast.cc).
def get_amp_supported_dtype() -> list:
    return [torch.bfloat16, torch.float16, torch.float32]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


# A tpu device runs its work in one ordered PJRT queue, so every stream is that queue: work on any
# stream is ordered after everything enqueued before it, and waiting on a stream or event waits
# for the device (runtime/aten/torch_storage.cc's guard).
class Stream(torch.Stream):
    def __new__(cls, device=None, priority: int = 0, **kwargs):
        return super().__new__(cls, device=torch.device("tpu", _index(device)), priority=priority, **kwargs)


class Event(torch.Event):
    def __new__(cls, device=None, **kwargs):
        return super().__new__(cls, device=torch.device("tpu", _index(device)), **kwargs)


def current_stream(device=None) -> torch.Stream:
    return torch.Stream(device=torch.device("tpu", _index(device)))


default_stream = current_stream


def set_stream(stream) -> None:
    pass  # one queue per device: nothing to switch


@contextlib.contextmanager
def stream(stream=None):
    yield


# Whole-step graphs, shaped like torch.cuda.CUDAGraph / torch.cuda.graph: everything a block of eager
# code does on tpu (forward, loss.backward(), clipping, the optimizer step) is captured into ONE module,
# and each replay runs that module as one executable on the tensors the block used, by identity: it
# reads their storages' current contents (copy new data into the static inputs before replaying) and
# writes every storage the block wrote (parameters, gradients, optimizer state, outputs it returned).
class TPUGraph:
    """A block of tpu work captured once and replayed as one executable.

    Capturing does not run the block's work: tensors it wrote keep their contents until the first
    `replay()`. What the block did on the host (Python numbers, CPU tensors) is frozen into the
    graph: an optimizer must be `capturable=True` (its step counts then live on tpu), as for CUDA
    graphs. A host read (`.item()`, `.cpu()`, `print`) or an op that falls back to the CPU inside the
    block raises. Random ops draw new numbers from the tpu generator on every replay."""

    def __init__(self):
        self._id = 0

    def capture_begin(self) -> None:
        if self._id:
            raise RuntimeError("this TPUGraph holds a captured graph already: reset() it before capturing again")
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        _capturing_optimizers.append(register_optimizer_step_pre_hook(_check_capturable))
        try:
            _C()._step_capture_begin()
        except BaseException:
            _capturing_optimizers.pop().remove()
            raise

    def capture_end(self) -> None:
        _capturing_optimizers.pop().remove()
        self._id = _C()._step_capture_end()

    def _capture_abort(self) -> None:
        _capturing_optimizers.pop().remove()
        _C()._step_capture_abort()

    def replay(self) -> None:
        if not self._id:
            raise RuntimeError("this TPUGraph has not captured anything: use it in `with torch.tpu.graph(g):` first")
        _C()._step_graph_replay(self._id)

    def reset(self) -> None:
        if self._id:
            _C()._step_graph_release(self._id)
            self._id = 0

    def __del__(self):
        if self._id and torchtpu._ext is not None:
            self.reset()


_capturing_optimizers: list = []


def _check_capturable(optimizer, args, kwargs) -> None:
    for group in optimizer.param_groups:
        on_tpu = any(p.device.type == "tpu" for p in group["params"])
        if on_tpu and "capturable" in group and not group["capturable"] and not group.get("fused"):
            raise RuntimeError(
                f"Attempting torch.tpu.graph capture of step() for an instance of {type(optimizer).__name__} "
                "but param_groups' capturable is False: its step counts would stay on the host and be frozen "
                "into the graph. Construct it with capturable=True.")


def is_current_stream_capturing() -> bool:
    return torchtpu._ext is not None and torchtpu._ext._step_capturing()


class graph:
    """`with torch.tpu.graph(g): ...` captures the block into the TPUGraph `g` (see TPUGraph)."""

    def __init__(self, tpu_graph: TPUGraph):
        self.tpu_graph = tpu_graph

    def __enter__(self):
        synchronize()
        self.tpu_graph.capture_begin()
        return self.tpu_graph

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.tpu_graph.capture_end()
        else:
            self.tpu_graph._capture_abort()
        return False
