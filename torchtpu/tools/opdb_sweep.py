"""The op_db sweep: every OpInfo of PyTorch's op_db run on tpu and compared with CPU.

In float32, forward over the first few samples CPU accepts (compared as the generated parity tests
compare: values, dtype and shape, torch.testing's default tolerances) and, for OpInfos that support
autograd, backward (the gradients of the sum of the floating outputs with respect to the floating
inputs). An OpInfo that CPU does not run in float32 (bitwise ops, one_hot, view_as_real, ...) is swept
in the first dtype of OTHER_DTYPES that CPU supports, and its result names that dtype.

Where float32 values differ beyond torch.testing's tolerances, the sample also runs on the CPU in
float64 (as PyTorch's reference tests do): tpu passes if it is no farther from that result than the
CPU's float32 run is (float32 accumulation in another order, which both sides round differently).

Samples are built as PyTorch's device tests build them: `sample_inputs("tpu", ...)`, so a tensor
the sample keeps on the CPU on purpose (tensor_split's indices) stays there; the CPU reference runs
on a copy of the sample with its tpu tensors moved to the CPU. Runs under TORCHTPU_FALLBACK=error: an op without a spec is "unsupported", named by the
overload that would have fallen back to the CPU. Ops with random or uninitialized results are
compared by dtype and shape only.

OpInfos run in worker processes (`python -m torchtpu.tools.opdb_sweep --worker I J ...`) that print
one JSON line per OpInfo; a worker that crashes or hangs is replaced and the OpInfo it was running
counts as failing, so nothing stops the sweep. Used by `python -m torchtpu.tools.coverage --parity`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

SAMPLES = 3  # samples CPU accepts, per OpInfo and direction
SCANNED = 10  # samples looked at to find them
SAMPLE_SECONDS = 60  # one sample's limit inside a worker
SILENCE_SECONDS = 240  # a worker silent this long on one OpInfo is killed
# Tried in this order when CPU has no float32 for an OpInfo: integers (widest first), bool, then the
# other floating and complex types.
OTHER_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "bool", "float64", "bfloat16", "float16",
                "complex64", "complex128")

_NO_SPEC = re.compile(r"torchtpu: (\S+) has no spec, and TORCHTPU_FALLBACK=error")
_NO_DTYPE = re.compile(r"torchtpu: aten::(\S+) does not support dtype (\w+)")
_NO_DEVICE_DTYPE = re.compile(r"torchtpu: dtype (\w+) is not supported on tpu")
_NO_KERNEL = re.compile(r"Could not run '(\S+)' with arguments from the '(\w+)' backend")
_NAMED_OVERLOAD = re.compile(r"torchtpu: (aten::\S+?)[:,]? ")


def opinfo_name(info) -> str:
    return f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name


@dataclasses.dataclass
class Outcome:
    status: str  # passing | failing | unsupported | skipped (nothing to compare) | absent (no autograd)
    detail: str = ""  # failing: what differed; unsupported: the overload with no spec


@dataclasses.dataclass
class Result:
    name: str
    forward: Outcome
    backward: Outcome
    dtype: str = "float32"  # the dtype the samples were made in

    def to_json(self) -> dict:
        return {"name": self.name, "forward": dataclasses.asdict(self.forward),
                "backward": dataclasses.asdict(self.backward), "dtype": self.dtype}

    @staticmethod
    def from_json(d: dict) -> "Result":
        return Result(d["name"], Outcome(**d["forward"]), Outcome(**d["backward"]), d.get("dtype", "float32"))


# --- inside a worker ---------------------------------------------------------------------------


class _SampleTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _SampleTimeout(f"took over {SAMPLE_SECONDS} s")


def _classify(error: BaseException) -> Outcome:
    message = str(error)
    no_spec = _NO_SPEC.search(message)
    if no_spec:
        name = no_spec.group(1)
        return Outcome("unsupported", name if name.startswith("aten::") or "::" in name else "aten::" + name)
    no_dtype = _NO_DTYPE.search(message)
    if no_dtype:
        return Outcome("unsupported", f"aten::{no_dtype.group(1)} ({no_dtype.group(2)})")
    no_device_dtype = _NO_DEVICE_DTYPE.search(message)
    if no_device_dtype:  # no tpu tensor holds this dtype (complex)
        return Outcome("unsupported", f"dtype {no_device_dtype.group(1)}")
    no_kernel = _NO_KERNEL.search(message)
    if no_kernel:  # a layout (sparse, ...) with no tpu kernel at all
        return Outcome("unsupported", f"{no_kernel.group(1)} ({no_kernel.group(2)})")
    if isinstance(error, NotImplementedError) and "torchtpu:" in message:  # a spec that says it cannot
        named = _NAMED_OVERLOAD.search(message)
        return Outcome("unsupported", named.group(1) if named else message.splitlines()[0][:120])
    first = message.strip().splitlines()[0] if message.strip() else ""
    return Outcome("failing", f"{type(error).__name__}: {first[:200]}")


def _copy_view(t, device: str):
    """`t` copied to `device` as the same view (sizes, strides, offset) of a copy of its whole
    storage: as_strided and the other ops that look past a view see on both devices what they see
    on the sample's (as_strided.partial_views' samples are views into a larger tensor)."""
    import torch

    t = t.detach()
    storage_numel = t.untyped_storage().nbytes() // t.element_size()
    compact = t.is_contiguous() and t.storage_offset() == 0 and t.numel() == storage_numel
    if compact or t.layout != torch.strided or t.is_conj() or t.is_neg() or t.is_quantized:
        return t.to(device, copy=True)
    whole = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, (storage_numel,), (1,))
    return whole.to(device, copy=True).as_strided(t.size(), t.stride(), t.storage_offset())


def _inputs(sample, device: str, grad: bool):
    """The sample's (input, args, kwargs) for a run on `device`: its tpu tensors copied to `device`,
    the tensors it keeps on the CPU copied there (PyTorch's device tests keep them so), and a tpu
    device it names (`to`'s argument) replaced by `device`; leaves requiring grad where the sample's
    do (grad=True); creation ops (no tensor inputs, or a device= keyword) get device=`device`."""
    import torch

    from torchtpu.testing import _tensors

    def move(value):
        if isinstance(value, torch.Tensor):
            moved = _copy_view(value, "cpu" if value.device.type == "cpu" else device)
            return moved.requires_grad_(value.requires_grad) if grad and value.requires_grad else moved
        if isinstance(value, torch.device) and value.type == "tpu":
            return torch.device(device)
        if isinstance(value, str) and re.fullmatch(r"tpu(:\d+)?", value):
            return device
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            return type(value)(move(v) for v in value)
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        return value

    tensor_input, args, kwargs = move((sample.input, sample.args, sample.kwargs))
    if "device" in kwargs or (device != "cpu" and not _tensors((sample.input, sample.args, sample.kwargs))):
        kwargs = {**kwargs, "device": torch.device(device)}
    return tensor_input, args, kwargs


def _apply_on(info, sample, device: str, grad: bool):
    """The op over the sample on `device`. A sample with no tensors and no device= gets device=`device`
    (a creation op) unless the op takes no device (broadcast_shapes)."""
    inputs = _inputs(sample, device, grad)
    try:
        return inputs, _apply(info, _call(inputs))
    except TypeError as e:
        if "device" not in str(e) or "device" in sample.kwargs:
            raise
        inputs = (inputs[0], inputs[1], {k: v for k, v in inputs[2].items() if k != "device"})
        return inputs, _apply(info, _call(inputs))


def _same(actual, expected, metadata_only: bool, context: str) -> None:
    import torch

    from torchtpu.testing import assert_same

    if not metadata_only:
        assert_same(actual, expected, context=context)
        return
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{context}: expected a tensor, got {type(actual)}"
        assert actual.device.type == "tpu", f"{context}: result is on {actual.device}, not tpu"
        assert actual.dtype == expected.dtype, f"{context}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{context}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{context}: {len(actual)} results, expected {len(expected)}"
        for a, e in zip(actual, expected):
            _same(a, e, True, context)


def _in_float64(value):
    """The sample's (input, args, kwargs) with its float32 tensors in float64."""
    import torch

    from torchtpu.testing import map_tensors

    def widen(t):
        wide = t.detach().double() if t.dtype == torch.float32 else t.detach().clone()
        return wide.requires_grad_(t.requires_grad) if t.requires_grad else wide

    return map_tensors(widen, value)


def _precise(fn):
    """The float64 CPU results, or None where the CPU does not run the sample in float64."""
    try:
        return _run_cpu(fn, 0)
    except _SampleTimeout:
        raise
    except Exception:  # noqa: BLE001
        return None


def _no_less_accurate(actual, expected, precise) -> bool:
    """tpu's results are no farther from the float64 results than the CPU's float32 ones (largest
    absolute error per tensor, NaN where NaN, other dtypes exactly equal)."""
    import torch

    from torchtpu.testing import _tensors

    if precise is None:
        return False
    actual, expected, precise = _tensors(actual), _tensors(expected), _tensors(precise)
    if not (len(actual) == len(expected) == len(precise)):
        return False
    for a, e, p in zip(actual, expected, precise):
        a = a.detach().cpu()
        if a.shape != e.shape or a.dtype != e.dtype:
            return False
        if not e.is_floating_point() or p.dtype != torch.float64:
            if not _identical(a, e):
                return False
            continue
        if not torch.equal(a.isnan(), e.isnan()):
            return False
        finite = ~e.isnan()
        tpu_error = (a.double() - p)[finite].abs().max().item() if finite.any() else 0.0
        cpu_error = (e.double() - p)[finite].abs().max().item() if finite.any() else 0.0
        if not tpu_error <= cpu_error:  # NaN errors (an infinity on one side only) fail
            return False
    return True


def _identical(a, b) -> bool:
    """Two CPU runs gave the same results (NaN equal to NaN)."""
    import torch

    try:
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        return True
    except Exception:
        return False


def _run_cpu(fn, seed: int):
    import torch

    torch.manual_seed(seed)
    return fn()


def _random(info) -> bool:
    """Whether the OpInfo's results are random or uninitialized: such results compare by dtype and
    shape only (an op that seeds CPU's generator itself, through wrapper_set_seed, draws a stream
    tpu's generator does not reproduce)."""
    code = getattr(info.op, "__code__", None)
    return info.has_nondeterministic_output or bool(code and "wrapper_set_seed" in code.co_names)


def _forward(info, samples, dtype: str) -> Outcome:
    import torch

    checked = 0
    for index, sample in samples:
        context = f"sample {index}"
        try:
            expected = _run_cpu(lambda: _apply(info, _call(_inputs(sample, "cpu", grad=False))), 0)
        except _SampleTimeout:
            raise
        except Exception:
            continue  # CPU rejects this sample
        # Random and uninitialized results compare by dtype and shape: CPU itself differs between seeds.
        metadata_only = _random(info) or not _identical(
            expected, _run_cpu(lambda: _apply(info, _call(_inputs(sample, "cpu", grad=False))), 1))
        try:
            _, actual = _apply_on(info, sample, "tpu", grad=False)
            try:
                _same(actual, expected, metadata_only, context)
            except AssertionError:
                if dtype != "float32" or metadata_only or not _no_less_accurate(actual, expected, _precise(
                        lambda: _apply(info, _call(_in_float64(_inputs(sample, "cpu", grad=False)))))):
                    raise
            torch.tpu.synchronize()
        except _SampleTimeout:
            raise
        except Exception as e:  # noqa: BLE001 - every failure is a result
            return _classify(e)
        checked += 1
        if checked == SAMPLES:
            break
    return Outcome("passing") if checked else Outcome("skipped", f"no {dtype} sample CPU accepts")


def _call(value):
    tensor_input, args, kwargs = value
    return (tensor_input, *args), kwargs


def _apply(info, value):
    positional, kwargs = value
    return info.op(*positional, **kwargs)


def _gradients(info, sample, device: str, float64: bool = False):
    """Gradients of the sum of the floating (and complex: both parts) outputs w.r.t. the floating
    inputs that require grad, or None where the sample has none (float64: on the CPU, the sample's
    float32 tensors in float64)."""
    import torch

    from torchtpu.testing import _tensors

    if float64:
        inputs = _in_float64(_inputs(sample, "cpu", grad=True))
        results = _apply(info, _call(inputs))
    else:
        inputs, results = _apply_on(info, sample, device, grad=True)
    inexact = lambda t: t.requires_grad and (t.is_floating_point() or t.is_complex())  # noqa: E731
    leaves = [t for t in _tensors(inputs) if inexact(t)]
    outputs = [t for t in _tensors(results) if inexact(t)]
    if not leaves or not outputs:
        return None
    total = sum((torch.view_as_real(o) if o.is_complex() else o).sum() for o in outputs)  # complex: both parts
    return torch.autograd.grad(total, leaves, allow_unused=True)


def _backward(info, samples, dtype: str) -> Outcome:
    import torch

    if not info.supports_autograd:
        return Outcome("absent")
    checked = 0
    for index, sample in samples:
        context = f"sample {index} (gradients)"
        try:
            expected = _run_cpu(lambda: _gradients(info, sample, "cpu"), 0)
        except _SampleTimeout:
            raise
        except Exception:
            continue
        if expected is None:
            continue
        metadata_only = _random(info) or not _identical(
            expected, _run_cpu(lambda: _gradients(info, sample, "cpu"), 1))
        try:
            actual = _gradients(info, sample, "tpu")
            assert actual is not None, f"{context}: no gradients on tpu"
            precise = None
            for i, (a, e) in enumerate(zip(actual, expected)):
                assert (a is None) == (e is None), f"{context}: gradient {i} defined on one side only"
                if e is None:
                    continue
                try:
                    _same(a, e, metadata_only, f"{context} gradient {i}")
                except AssertionError:
                    if dtype != "float32" or metadata_only:
                        raise
                    if precise is None:
                        precise = _precise(lambda: _gradients(info, sample, "cpu", float64=True)) or ()
                    if i >= len(precise) or not _no_less_accurate(a, e, precise[i]):
                        raise
            torch.tpu.synchronize()
        except _SampleTimeout:
            raise
        except Exception as e:  # noqa: BLE001
            return _classify(e)
        checked += 1
        if checked == SAMPLES:
            break
    return Outcome("passing") if checked else Outcome("skipped", f"no {dtype} sample with gradients CPU accepts")


def _samples(info, dtype: str, requires_grad: bool):
    """The first SCANNED samples, made on tpu as PyTorch's device tests make them. Making them is
    not what is tested: ops without a spec may run on the CPU meanwhile, and where tpu cannot make
    them at all (a spec'd op lacking the dtype, random_ of bools), they are made on the CPU and their
    tensors moved to tpu."""
    import itertools

    import torch

    import torchtpu
    from torchtpu.testing import map_tensors

    def make(device):
        torch.manual_seed(0)
        return list(enumerate(itertools.islice(
            info.sample_inputs(device, getattr(torch, dtype), requires_grad=requires_grad), SCANNED)))

    torchtpu._C.set_fallback_is_error(False)
    try:
        return make("tpu")
    except _SampleTimeout:
        raise
    except Exception:  # noqa: BLE001
        samples = make("cpu")
    finally:
        torchtpu._C.set_fallback_is_error(True)

    def to_tpu(t):
        moved = t.detach().to("tpu")
        return moved.requires_grad_(t.requires_grad) if t.requires_grad else moved

    for _, sample in samples:
        sample.input, sample.args, sample.kwargs = map_tensors(to_tpu, (sample.input, sample.args, sample.kwargs))
    return samples


def sweep_dtype(info) -> str | None:
    """float32 where CPU runs the OpInfo in it, else the first of OTHER_DTYPES it runs in."""
    import torch

    supported = info.supported_dtypes("cpu")
    for name in ("float32", *OTHER_DTYPES):
        if getattr(torch, name) in supported:
            return name
    return None


def _guarded(fn, what: str) -> Outcome:
    signal.alarm(SAMPLE_SECONDS * SAMPLES)
    try:
        return fn()
    except _SampleTimeout as e:
        return Outcome("failing", f"timeout: {what} {e}")
    except Exception as e:  # noqa: BLE001 - sample generation itself may fail (on tpu: a dtype it lacks)
        outcome = _classify(e)
        return outcome if outcome.status == "unsupported" else Outcome("failing", f"{what}: {outcome.detail}")
    finally:
        signal.alarm(0)


def run_opinfo(info) -> Result:
    name = opinfo_name(info)
    dtype = sweep_dtype(info)
    if dtype is None:
        skipped = Outcome("skipped", "no dtype CPU supports")
        return Result(name, skipped, skipped if info.supports_autograd else Outcome("absent"), "none")
    forward = _guarded(lambda: _forward(info, _samples(info, dtype, False), dtype), "forward")
    if dtype in ("float32", "float64", "bfloat16", "float16", "complex64", "complex128"):
        backward = _guarded(lambda: _backward(info, _samples(info, dtype, True), dtype), "backward")
    else:  # integer and bool tensors have no gradients
        backward = Outcome("absent", f"no gradients in {dtype}")
    return Result(name, forward, backward, dtype)


def _prepare():
    """op_db, with fallback forbidden, warnings off and the sample alarm armed."""
    import warnings

    import torch  # noqa: F401

    import torchtpu

    torchtpu._C.set_fallback_is_error(True)
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    signal.signal(signal.SIGALRM, _on_alarm)
    return op_db


def worker(indices: list[int]) -> None:
    """Runs op_db[i] for each index, printing {"start": i} then {"result": ...} per OpInfo."""
    op_db = _prepare()
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever an op prints stays out of the protocol
    for i in indices:
        print(json.dumps({"start": i}), file=out, flush=True)
        result = run_opinfo(op_db[i])
        print(json.dumps({"result": i, **result.to_json()}), file=out, flush=True)
    print(json.dumps({"done": True}), file=out, flush=True)


# --- the parent ----------------------------------------------------------------------------------


def select(names: list[str] | None = None) -> list[tuple[int, str]]:
    """(index in op_db, name) of the OpInfos whose full name or base name is in `names` (all: None)."""
    from torch.testing._internal.common_methods_invocations import op_db

    chosen = []
    for i, info in enumerate(op_db):
        full = opinfo_name(info)
        if names is None or full in names or info.name in names:
            chosen.append((i, full))
    return chosen


def _reader(stream, lines: "queue.Queue") -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


class _Worker:
    def __init__(self, indices: list[int]):
        self.pending = list(indices)
        self.current: int | None = None
        self.proc = None
        self.lines: "queue.Queue" = queue.Queue()
        self.log = tempfile.TemporaryFile(mode="w+")
        self.since = time.monotonic()
        self.hung = False

    def start(self) -> None:
        env = dict(os.environ, TORCHTPU_FALLBACK="error", PYTHONWARNINGS="ignore")
        self.lines = queue.Queue()
        self.log.seek(0)
        self.log.truncate()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchtpu.tools.opdb_sweep", "--worker", *map(str, self.pending)],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        threading.Thread(target=_reader, args=(self.proc.stdout, self.lines), daemon=True).start()
        self.since = time.monotonic()
        self.ran_any = False

    def last_error_line(self) -> str:
        self.log.seek(0)
        tail = [line.strip() for line in self.log.read().splitlines() if line.strip()]
        return tail[-1][:200] if tail else ""


def _sweep_here(selection: list[tuple[int, str]], progress=None, started=None, deadline=None) -> list[Result]:
    """The sweep in this process (a device one process at a time may hold): a crash ends it, after
    `started` was told which OpInfo it was running."""
    import warnings

    import torchtpu

    op_db = _prepare()
    results = []
    try:
        for i, name in selection:
            if deadline is not None and time.monotonic() > deadline:
                break
            if started:
                started(name)
            results.append(run_opinfo(op_db[i]))
            if progress:
                progress(results[-1], len(results), len(selection))
    finally:
        torchtpu._C.set_fallback_is_error(torchtpu._fallback_is_error_by_env())
        warnings.resetwarnings()
    return results


def sweep(selection: list[tuple[int, str]], jobs: int = 1, progress=None, started=None,
          seconds: float | None = None) -> list[Result]:
    """Runs the selected OpInfos in `jobs` worker processes (in this process where the device is
    exclusive: a TPU; `started(name)` is called before each there); never raises for what an op does.
    With `seconds`, no OpInfo starts after that long (those not run have no result)."""
    from torchtpu.testing import device_is_exclusive

    deadline = None if seconds is None else time.monotonic() + seconds
    if device_is_exclusive():
        return _sweep_here(selection, progress, started, deadline)
    names = dict(selection)
    results: dict[int, Result] = {}
    workers = [_Worker([i for i, _ in selection[j::jobs]]) for j in range(max(1, jobs))]
    workers = [w for w in workers if w.pending]
    for w in workers:
        w.start()
    active = list(workers)
    while active:
        if deadline is not None and time.monotonic() > deadline:
            for w in active:
                w.proc.kill()
            break
        for w in list(active):
            try:
                line = w.lines.get(timeout=0.2)
            except queue.Empty:
                if w.current is not None and time.monotonic() - w.since > SILENCE_SECONDS:
                    w.proc.kill()  # hung: the reader sees EOF next
                    w.hung = True
                continue
            if line is None:  # the worker exited
                w.proc.wait()
                if w.current is not None:  # it died inside an OpInfo
                    why = ("hung" if w.hung else
                           f"worker crashed (exit {w.proc.returncode}): {w.last_error_line()}")
                    failed = Outcome("failing", why)
                    results[w.current] = Result(names[w.current], failed, failed)
                    if progress:
                        progress(results[w.current], len(results), len(names))
                    w.pending.remove(w.current)
                    w.current = None
                    w.hung = False
                elif w.pending and not w.ran_any:  # it could not even start: nothing will run there
                    why = f"worker failed (exit {w.proc.returncode}): {w.last_error_line()}"
                    for i in w.pending:
                        results[i] = Result(names[i], Outcome("failing", why), Outcome("failing", why))
                    w.pending = []
                if w.pending:
                    w.start()
                else:
                    active.remove(w)
                continue
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "start" in message:
                w.current, w.since, w.ran_any = message["start"], time.monotonic(), True
            elif "result" in message:
                index = message.pop("result")
                results[index] = Result.from_json(message)
                w.pending.remove(index)
                w.current = None
                if progress:
                    progress(results[index], len(results), len(names))
            elif "done" in message:
                w.pending = []
    return [results[i] for i, _ in selection if i in results]


def read_jsonl(paths: list[str]) -> dict[str, Result]:
    """The results that coverage --jsonl wrote, by OpInfo name (a later line wins). An OpInfo whose
    "started" line has no result after it took its process down: it counts as failing."""
    by_name: dict[str, Result] = {}
    running = None  # the OpInfo of the last "started" line, until its result

    def crashed() -> None:
        died = Outcome("failing", "the sweep's process died while it ran")
        by_name[running] = Result(running, died, died)

    for path in paths:
        with open(path) as f:
            for line in f:
                entry = json.loads(line)
                if running is not None and entry.get("started", entry.get("name")) != running:
                    crashed()
                running = entry.get("started")
                if running is None:
                    result = Result.from_json(entry)
                    by_name[result.name] = result
    if running is not None:  # the last OpInfo never finished
        crashed()
    return by_name


def summary(results: list[Result]) -> str:
    """The counts per direction, the unsupported OpInfos by missing overload, then the failing ones."""
    lines = [f"op_db sweep on tpu: {len(results)} OpInfos, float32, up to {SAMPLES} samples each, "
             f"TORCHTPU_FALLBACK=error"]
    other = [f"{r.name} ({r.dtype})" for r in results if r.dtype != "float32"]
    if other:
        lines.append(f"swept in another dtype (no float32 on CPU): {len(other)}  {', '.join(other)}")
    for direction in ("forward", "backward"):
        outcomes = [getattr(r, direction) for r in results]
        counts = collections.Counter(o.status for o in outcomes)
        scope = "" if direction == "forward" else f" (of {len(outcomes) - counts['absent']} with autograd)"
        lines.append(f"{direction}: {counts['passing']} passing, {counts['failing']} failing, "
                     f"{counts['unsupported']} unsupported, {counts['skipped']} skipped{scope}")
    missing: dict[str, dict[str, set]] = collections.defaultdict(lambda: collections.defaultdict(set))
    for r in results:
        for direction in ("forward", "backward"):
            o = getattr(r, direction)
            if o.status == "unsupported":
                missing[o.detail][r.name].add(direction)
    if missing:
        lines.append(f"unsupported, by the overload with no spec ({len(missing)} overloads):")
        for overload, by_op in sorted(missing.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            ops = ", ".join(name + ("" if "forward" in dirs else " (backward)") for name, dirs in sorted(by_op.items()))
            lines.append(f"  {overload}: {len(by_op)}  {ops}")
    failing = [(r.name, d, getattr(r, d).detail) for r in results for d in ("forward", "backward")
               if getattr(r, d).status == "failing"]
    if failing:
        lines.append(f"failing ({len(failing)}):")
        lines += [f"  {name} ({direction}): {detail}" for name, direction, detail in failing]
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", nargs="+", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ops", help="comma-separated OpInfo names (default: all of op_db)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--json", help="also write every result to this file")
    parser.add_argument("--summarize", nargs="+", metavar="JSONL",
                        help="print the summary of results written with coverage --jsonl (one or more slices)")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    if args.summarize:
        print(summary(list(read_jsonl(args.summarize).values())))
        return 0
    results = sweep(select(args.ops.split(",") if args.ops else None), args.jobs)
    print(summary(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.to_json() for r in results], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
