"""Shared helpers for the torchtpu test suite."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest
import torch

import torchtpu  # noqa: F401  (torch autoloads it too; be explicit)
import torchtpu.testing

TPU = torch.device("tpu")


# One process at a time may hold a TPU (a second fails on libtpu's lock file): there, a test that
# starts a process which opens the device is skipped, or runs its program in this process.
EXCLUSIVE_DEVICE = torchtpu.testing.device_is_exclusive()
EXCLUSIVE_REASON = "starts a process that opens the device, and one process at a time may hold a TPU"


def skip_if_device_is_exclusive():
    if EXCLUSIVE_DEVICE:
        pytest.skip(EXCLUSIVE_REASON)


def run_python(code: str, env: dict | None = None, timeout: float = 120.0,
               in_process_on_tpu: bool = False) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter with os.environ plus `env` overrides (None value = unset).
    On a TPU host: skipped, unless `in_process_on_tpu` (the program then runs here, its stdout
    captured; of `env` only TORCHTPU_FALLBACK and TORCHTPU_EAGER_MODE can take effect in a running
    process)."""
    if EXCLUSIVE_DEVICE and (env or {}).get("TORCHTPU_PJRT_PLUGIN") != "cpu":
        if not in_process_on_tpu or set(env or {}) - {"TORCHTPU_FALLBACK", "TORCHTPU_EAGER_MODE"}:
            pytest.skip(EXCLUSIVE_REASON)
        return _run_here(code, env or {})
    full_env = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = str(value)
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True,
                          timeout=timeout, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_here(code: str, env: dict) -> subprocess.CompletedProcess:
    import io
    import tempfile

    from torchtpu.tools import run_as_main

    fallback = env.get("TORCHTPU_FALLBACK", os.environ.get("TORCHTPU_FALLBACK", ""))
    torchtpu._C.set_fallback_is_error((fallback or "").lower() == "error")
    out, err = io.StringIO(), io.StringIO()
    with tempfile.TemporaryDirectory() as directory:
        program = os.path.join(directory, "program.py")
        with open(program, "w") as f:
            f.write(code)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                    eager_mode(env.get("TORCHTPU_EAGER_MODE", torch.tpu.get_eager_mode())):
                returncode, _ = run_as_main(program, [])
        finally:
            torchtpu._C.set_fallback_is_error(torchtpu._fallback_is_error_by_env())
    return subprocess.CompletedProcess(["<in process>"], returncode, out.getvalue(), err.getvalue())


def last_json(stdout: str):
    """The last line of stdout that parses as JSON."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{") or line.startswith("["):
            return json.loads(line)
    raise AssertionError(f"no JSON line in stdout:\n{stdout}")


def metrics() -> dict:
    return torchtpu.debug.metrics()


@contextlib.contextmanager
def no_cpu_fallback():
    """Fails if any op inside the block ran on the CPU instead of tpu."""
    before = dict(metrics()["cpu_fallbacks"])
    yield
    fell_back = torchtpu.debug.fallbacks_since(before)
    assert not fell_back, f"ops fell back to the CPU: {fell_back}"


@pytest.fixture
def no_fallback():
    """The test body runs with no CPU fallback at all."""
    with no_cpu_fallback():
        yield


def error_raised_by(fn) -> Exception | None:
    """The exception fn() raises, or None: to compare an error on tpu with CPU's, type and text."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return e
    return None


def to_tpu(t: torch.Tensor) -> torch.Tensor:
    return t.to("tpu")


def assert_equal_cpu(actual: torch.Tensor, expected: torch.Tensor, exact: bool = False, **tol):
    """`actual` (tpu) matches `expected` (cpu): device, dtype, shape and values."""
    assert actual.device.type == "tpu", actual.device
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    host = actual.cpu()
    if exact:
        torch.testing.assert_close(host, expected, rtol=0, atol=0, equal_nan=True)
    else:
        torch.testing.assert_close(host, expected, equal_nan=True, **tol)


eager_mode = torch.tpu.eager_mode  # the tests' name for it


@pytest.fixture
def strict_eager(monkeypatch):
    """The test observes strict mode's one execution per op (counts, traces, where errors raise): it
    and the processes it starts run in strict mode whatever TORCHTPU_EAGER_MODE says."""
    monkeypatch.setenv("TORCHTPU_EAGER_MODE", "strict")
    with eager_mode("strict"):
        yield


@pytest.fixture
def python_runner():
    return run_python


@pytest.fixture
def fresh_cache_dir(tmp_path):
    d = tmp_path / "ttcache"
    d.mkdir()
    return str(d)


def near_exact_bfloat16(actual, cpu, exact, what=""):
    """A bfloat16 tpu result against the float64 result of the same inputs: every element within one
    bfloat16 ulp of it, or no farther from it than CPU's element. CPU's own bfloat16 kernels are no
    reference: some round partial sums, and which do depends on the host's CPU (oneDNN's paths)."""
    assert actual.device.type == "tpu" and actual.dtype == torch.bfloat16, (actual.device, actual.dtype)
    assert actual.shape == cpu.shape == exact.shape, (actual.shape, cpu.shape, exact.shape)
    exponent = torch.frexp(exact.abs().clamp(min=2.0 ** -126)).exponent
    ulp = torch.pow(2.0, (exponent - 8).double())  # |x| in [2^(e-1), 2^e): 8 significant bits
    tpu_error = (actual.cpu().double() - exact).abs()
    allowed = torch.maximum((cpu.double() - exact).abs() * 1.01, ulp)
    bad = tpu_error > allowed
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.numel()} elements farther from float64 than "
                           f"one bfloat16 ulp and than CPU; worst {float((tpu_error - allowed).max()):.3g} past")


def close(actual, expected, **tol):
    """A tpu result equals the CPU one: device, dtype, shape, then values (NaNs equal)."""
    assert actual.device.type == "tpu", actual.device
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True, **tol)


def module_forward_backward(module, x, device):
    """Forward, a weighted loss (so the output gradient is not all ones) and backward on `device`:
    the output, then the gradients of x, the module's weight and (if it has one) its bias."""
    module = module.to(device)
    x = x.detach().to(device).requires_grad_(True)
    out = module(x)
    weights = torch.linspace(-1.0, 2.0, out.numel()).reshape(out.shape).to(device)
    (out * weights).sum().backward()
    return [out.detach(), x.grad, module.weight.grad] + ([module.bias.grad] if module.bias is not None else [])
