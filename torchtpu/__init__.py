"""torchtpu: PyTorch's device "tpu", with kernels generated from YAML specs and run through PJRT.

`import torchtpu` (or plain `import torch`, through the torch.backends entry point) renames
PrivateUse1 to "tpu", loads the C++ extension, starts the PJRT runtime and registers `torch.tpu`.
It never raises: if something is missing, `torch.tpu.is_available()` is False and the first use
of a tpu tensor raises an error that says what was tried and which variable to set.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import os
import sys
import threading
import weakref

import torch

from torchtpu import _plugins

__all__ = ["device", "debug", "is_available", "init_error"]

_ext = None
_init_error: str | None = None


def _C_or_none():
    return _ext


def init_error() -> str | None:
    """Why the runtime could not start, or None."""
    return _init_error


def _require_runtime():
    if _ext is None:
        raise RuntimeError(_init_error or "torchtpu: the runtime is not initialized")
    return _ext


def is_available() -> bool:
    return _ext is not None


def _patch_printing():
    # Formatting runs dozens of small ops; format a host copy instead (as torch does for XLA).
    import torch._tensor_str as tensor_str

    if getattr(tensor_str._tensor_str, "_torchtpu", False):
        return
    original = tensor_str._tensor_str

    def _tensor_str(self, indent):
        if self.device.type == "tpu":
            self = self.to("cpu")
        return original(self, indent)

    _tensor_str._torchtpu = True
    tensor_str._tensor_str = _tensor_str


def _keep_parameters_on_transfer():
    # Moving a module between the CPU and tpu must keep each Parameter object, as it does for cuda:
    # tied weights (one Parameter in two modules) stay tied and optimizers keep their references.
    # PyTorch swaps data under a Parameter only between "compatible" TensorImpls, which excludes
    # PrivateUse1; its swap_tensors path does the same for any device, so transfers use it.
    module = torch.nn.Module
    if getattr(module.to, "_torchtpu", False):
        return

    def involves_tpu(m, device=None):
        if device is not None and torch.device(device).type == "tpu":
            return True
        return any(t.device.type == "tpu" for t in itertools.chain(m.parameters(), m.buffers()))

    def swapping(method, target):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            if torch.__future__.get_swap_module_params_on_conversion() or not involves_tpu(self, target(args, kwargs)):
                return method(self, *args, **kwargs)
            torch.__future__.set_swap_module_params_on_conversion(True)
            try:
                return method(self, *args, **kwargs)
            finally:
                torch.__future__.set_swap_module_params_on_conversion(False)

        wrapper._torchtpu = True
        return wrapper

    module.to = swapping(module.to, lambda args, kwargs: torch._C._nn._parse_to(*args, **kwargs)[0])
    module.cpu = swapping(module.cpu, lambda args, kwargs: None)
    module.tpu = swapping(module.tpu, lambda args, kwargs: "tpu")


def _register_device():
    if torch._C._get_privateuse1_backend_name() != "tpu":
        torch.utils.rename_privateuse1_backend("tpu")
    from torchtpu import device as device_module

    if not hasattr(torch, "tpu"):
        torch._register_device_module("tpu", device_module)
    if not hasattr(torch.Tensor, "tpu"):
        torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
    _patch_printing()
    _keep_parameters_on_transfer()


class _GraphTaskProbe:
    """A Python object a graph task holds, to see when the autograd thread has freed the task."""


def _free_graph_tasks_before_exit():
    """Waits until each tpu autograd thread has freed the last backward's graph task.

    backward() stores the caller's contextvars.Context in its graph task, and the device's autograd
    thread can drop that task after backward() has returned. If that happens while the interpreter
    finalizes, the decref cannot take the GIL, the thread is unwound through a noexcept destructor
    and the process aborts ("terminate called without an active exception": a few % of scripts that
    end right after a backward). A thread frees its previous task before it takes the next one, so a
    backward through each device thread whose task holds a probe, and a wait until the probe is freed,
    leaves the threads holding nothing of Python's. It launches nothing (empty tensors).
    """
    engine = torch.autograd.Variable._execution_engine
    try:
        for index in range(torch.tpu.device_count()):
            probe, freed = _GraphTaskProbe(), threading.Event()
            weakref.finalize(probe, freed.set)
            leaf = torch.empty(0, device=torch.device("tpu", index), requires_grad=True)
            root = leaf.view(0)  # its backward runs on the device's autograd thread
            torch._C._stash_obj_in_tls("torchtpu_graph_task_probe", probe)  # the graph task copies it
            try:
                engine.run_backward((root,), (torch.empty_like(leaf),), False, False, (), False, True)
            finally:
                torch._C._remove_obj_from_tls("torchtpu_graph_task_probe")
            del probe
            freed.wait(timeout=10)
    except Exception:  # at exit, a broken runtime has nothing left to free
        pass


_fused_eager = False  # the runtime's fused mode, mirrored for dynamo to read (and guard on) in a compiled step
_end_block_in_compiled_step = None  # _end_block_after_step, set by torchtpu._compile for dynamo to run between graphs


def _end_block_after_step() -> None:
    _ext._fused_flush_before_next_op("an optimizer step")  # after zero_grad drops the gradients


def _end_fused_block_after_step(optimizer, args, kwargs) -> None:
    if not _fused_eager:
        return
    if torch.compiler.is_compiling():
        # A compiled step's graph joins the block when it runs; the block ends after it through a call
        # dynamo makes between graphs (a graph break: both sides join the same block).
        _end_block_in_compiled_step()
    else:
        _end_block_after_step()


def _at_exit() -> None:
    try:
        _ext._fused_flush("exit")  # what a fused block recorded runs, as in the other modes
    except Exception:
        pass
    _free_graph_tasks_before_exit()


def _fallback_is_error_by_env() -> bool:
    """TORCHTPU_FALLBACK=error (what a tool that forbids fallback for a while restores afterwards)."""
    return os.environ.get("TORCHTPU_FALLBACK", "").lower() == "error"


def _start_runtime():
    global _ext, _init_error
    try:
        from torchtpu import _C as ext
    except ImportError as e:
        _init_error = (f"torchtpu: the C++ extension is not built ({e}); run the README's setup command "
                       f"(pip install --no-build-isolation -e .)")
        return
    try:
        ext._init(_plugins.resolve_plugin(), _plugins.cache_dir())
    except Exception as e:  # a missing or broken plugin must not take the process down
        _init_error = str(e)
        ext._set_init_error(_init_error)
        return
    ext.set_fallback_is_error(_fallback_is_error_by_env())
    ext.set_check_indices(os.environ.get("TORCHTPU_CHECK_INDICES", "") == "1")
    from torchtpu.device import EAGER_MODES, MATH_MODES

    modes = {}
    eager_default = _plugins.default_eager_mode(ext.platform_name())
    for variable, allowed, default in (("TORCHTPU_MATH", MATH_MODES, "accurate"),
                                       ("TORCHTPU_EAGER_MODE", EAGER_MODES, eager_default)):
        modes[variable] = os.environ.get(variable, default).lower()
        if modes[variable] not in allowed:
            _init_error = (f"torchtpu: {variable} must be {', '.join(map(repr, allowed[:-1]))} or {allowed[-1]!r}, "
                           f"not {modes[variable]!r}")
            ext._set_init_error(_init_error)
            return
    ext.set_accurate_math(modes["TORCHTPU_MATH"] == "accurate")
    ext._set_eager_blocking(modes["TORCHTPU_EAGER_MODE"] == "blocking")
    ext._set_eager_fused(modes["TORCHTPU_EAGER_MODE"] == "fused")
    global _fused_eager
    _fused_eager = modes["TORCHTPU_EAGER_MODE"] == "fused"
    _ext = ext
    atexit.register(_at_exit)
    # A fused block ends with each optimizer step (at the next op): a training loop's iterations are
    # then blocks of the same ops, which run one compiled module.
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_end_fused_block_after_step)


_register_device()
_start_runtime()

from torchtpu import _meta  # noqa: E402,F401  (Meta kernels the spec kernels need)

from torchtpu import debug, device  # noqa: E402
from torchtpu import distributed as _distributed  # noqa: E402

_distributed.register_backend()

# Graph mode registers with dynamo when dynamo is loaded; otherwise the torch_dynamo_backends entry
# point imports it on torch.compile(backend="tpu") (importing dynamo here would slow `import torch`).
if "torch._dynamo" in sys.modules:
    from torchtpu import _compile  # noqa: E402

    _compile.register_backend()
