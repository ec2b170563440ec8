"""Errors and fallbacks: CPU fallback warnings and counters, TORCHTPU_FALLBACK=error, plugin
selection failures, unsupported dtypes and device mixing."""

from __future__ import annotations

import warnings

import pytest
import torch

import torchtpu
from torchtpu._plugins import find_packaged
from conftest import assert_equal_cpu, error_raised_by, last_json, metrics, run_python


def _fallback_count(op: str) -> int:
    """CPU fallback count for `op`, over its overloads ("aten::_add_relu.Tensor", "aten::_add_relu.out", ...)."""
    return sum(n for k, n in metrics()["cpu_fallbacks"].items() if k == op or k.startswith(op + "."))


# through torch._VF, not torch.ops: only the Python bindings turn C++ warnings into Python ones
add_relu, add_relu_ = torch._VF._add_relu, torch._VF._add_relu_


def _fallback_warnings(record, op):
    return [w for w in record if issubclass(w.category, UserWarning) and op in str(w.message)]


# _add_relu (functional, in-place and out=; an internal op of TorchScript's fusion passes) has no spec
# and needs none. Its Tensor overload is also taken by test_fused (which a TPU host may run first), its
# Scalar overload by the graph, trace and report tests.
def test_fallback_warns_once_and_counts():
    cpu, other_cpu = torch.tensor([[1.5, -2.0], [0.25, 7.0]]), torch.tensor([[1.0, 1.0], [-3.0, 0.5]])
    t, other = cpu.to("tpu"), other_cpu.to("tpu")
    before = _fallback_count("aten::_add_relu")
    taken_before = _fallback_count("aten::_add_relu.Tensor")  # the overload the first call takes
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = add_relu(t, other)
        second = add_relu(t, other, alpha=2)
    found = _fallback_warnings(record, "aten::_add_relu")
    # Warned once per process: an earlier test may have been the first to take this fallback.
    assert len(found) == (0 if taken_before else 1), (taken_before, [str(w.message) for w in record])
    assert taken_before or "CPU" in str(found[0].message)
    assert_equal_cpu(first, add_relu(cpu, other_cpu), exact=True)
    assert_equal_cpu(second, add_relu(cpu, other_cpu, alpha=2), exact=True)
    assert _fallback_count("aten::_add_relu") == before + 2, metrics()["cpu_fallbacks"]
    report = torchtpu.debug.metrics_report()
    assert "aten::_add_relu" in report


def test_fallback_ops_give_cpu_results():
    torch.manual_seed(4)
    cpu, other_cpu = torch.randn(3, 4), torch.randn(3, 4)
    t, other = cpu.to("tpu"), other_cpu.to("tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_equal_cpu(add_relu(t, other), add_relu(cpu, other_cpu))
        assert_equal_cpu(torch.amax(t, dim=1), torch.amax(cpu, dim=1))
        assert_equal_cpu(t > 0, cpu > 0)
        assert_equal_cpu(add_relu(t.t(), other.t()), add_relu(cpu.t(), other_cpu.t()))
        o = torch.empty(0, device="tpu")
        add_relu(t, other, out=o)
        assert_equal_cpu(o, add_relu(cpu, other_cpu))
        v = t.clone()
        add_relu_(v[1:], other[1:])  # in-place fallback on a contiguous view writes back to the tpu storage
        ref = cpu.clone()
        add_relu_(ref[1:], other_cpu[1:])
        assert_equal_cpu(v, ref)
    assert _fallback_count("aten::_add_relu") >= 3


def test_inplace_fallback_on_strided_view_writes_back_strided():
    base = torch.arange(-3.0, 3.0).reshape(2, 3)
    t = base.to("tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        add_relu_(base[:, 1], torch.tensor([4.0, -9.0]))
        add_relu_(t[:, 1], torch.tensor([4.0, -9.0]).to("tpu"))
        assert_equal_cpu(t, base)
        b2 = torch.arange(-3.0, 3.0)
        t2 = b2.to("tpu")
        add_relu_(b2[::2], torch.tensor([1.0, 2.0, -5.0]))
        add_relu_(t2[::2], torch.tensor([1.0, 2.0, -5.0]).to("tpu"))
        assert_equal_cpu(t2, b2)


FALLBACK_ERROR = r"""
import json
import torch, torchtpu
x = torch.tensor([-1.0, 2.0]).to("tpu")
ok = (x + x).cpu().tolist()  # spec'd ops still work
try:
    torch.ops.aten._add_relu(x, x)
except NotImplementedError as e:
    print(json.dumps({"ok": ok, "error": str(e), "type": "NotImplementedError"}))
except Exception as e:
    print(json.dumps({"ok": ok, "error": str(e), "type": type(e).__name__}))
else:
    print(json.dumps({"ok": ok, "error": None, "type": None}))
"""


def test_fallback_error_mode_subprocess():
    proc = run_python(FALLBACK_ERROR, {"TORCHTPU_FALLBACK": "error"})
    assert proc.returncode == 0, proc.stderr
    out = last_json(proc.stdout)
    assert out["ok"] == [-2, 4]
    assert out["type"] == "NotImplementedError", out
    assert "_add_relu" in out["error"], out["error"]


def test_fallback_default_mode_subprocess():
    proc = run_python(FALLBACK_ERROR, {"TORCHTPU_FALLBACK": None})
    assert proc.returncode == 0, proc.stderr
    out = last_json(proc.stdout)
    assert out["type"] is None and out["error"] is None
    assert "aten::_add_relu" in proc.stderr  # the one-time UserWarning


PLUGIN_PROBE = r"""
import json
import torch, torchtpu
res = {"available": torch.tpu.is_available(), "init_error": torchtpu.init_error(),
       "count": torch.tpu.device_count()}
try:
    torch.ones(2, device="tpu")
    res["error"] = None
except Exception as e:
    res["error"] = str(e)
    res["type"] = type(e).__name__
try:
    torch.ones(2).to("tpu")
    res["error2"] = None
except Exception as e:
    res["error2"] = str(e)
print(json.dumps(res))
"""


# "none" is the deliberate choice (a parent process that leaves the device to its children).
@pytest.mark.parametrize("value", ["/nonexistent/libpjrt_nothing.so", "/etc/hostname", "bogus_plugin", "none"])
def test_bad_plugin_does_not_crash_import(value):
    proc = run_python(PLUGIN_PROBE, {"TORCHTPU_PJRT_PLUGIN": value})
    assert proc.returncode == 0, f"import crashed with {value!r}:\n{proc.stderr}"
    out = last_json(proc.stdout)
    assert out["available"] is False
    assert out["count"] == 0
    assert out["init_error"], out
    for key in ("error", "error2"):
        msg = out[key]
        assert msg, f"creating a tpu tensor did not raise with TORCHTPU_PJRT_PLUGIN={value!r}"
        assert value in msg, msg
        assert "TORCHTPU_PJRT_PLUGIN" in msg, msg


@pytest.mark.skipif(find_packaged("cpu")[0] is None, reason="XLA's CPU plugin (xla-cpu-pjrt) is not installed here")
def test_cpu_plugin_by_name_subprocess():
    proc = run_python(PLUGIN_PROBE, {"TORCHTPU_PJRT_PLUGIN": "cpu"})
    assert proc.returncode == 0, proc.stderr
    out = last_json(proc.stdout)
    assert out["available"] is True and out["init_error"] is None
    assert out["error"] is None and out["error2"] is None


def test_int_exp_promotes_like_cpu():
    i = torch.tensor([0, 1, 2, 3])
    assert_equal_cpu(torch.exp(i.to("tpu")), torch.exp(i))
    assert_equal_cpu(torch.sqrt(i.to("tpu")), torch.sqrt(i))
    assert_equal_cpu(i.to("tpu") / 2, i / 2)


def test_bool_mm_raises_like_cpu():
    a = torch.tensor([[True, False], [True, True]])
    cpu_err = error_raised_by(lambda: torch.mm(a, a))
    tpu_err = error_raised_by(lambda: torch.mm(a.to("tpu"), a.to("tpu")))
    if cpu_err is None:
        assert tpu_err is None
        assert_equal_cpu(torch.mm(a.to("tpu"), a.to("tpu")), torch.mm(a, a))
    else:
        assert isinstance(tpu_err, (RuntimeError, NotImplementedError)), repr(tpu_err)


def test_bool_sub_raises_like_cpu():
    a = torch.tensor([True, False])
    cpu_err = error_raised_by(lambda: a - a)
    tpu_err = error_raised_by(lambda: a.to("tpu") - a.to("tpu"))
    assert cpu_err is not None
    assert type(tpu_err) is type(cpu_err), repr(tpu_err)
    assert str(tpu_err) == str(cpu_err)


def test_mixed_devices_raise():
    cpu = torch.ones(3)
    t = torch.ones(3, device="tpu")
    for fn in (lambda: t + cpu, lambda: cpu + t, lambda: torch.mm(t.view(3, 1), cpu.view(1, 3)),
               lambda: torch.cat([t, cpu])):
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            fn()
    # A 0-d CPU tensor is allowed, as for CUDA.
    assert_equal_cpu(t + torch.tensor(2.0), cpu + 2.0)


def test_invalid_device_index():
    with pytest.raises(RuntimeError):
        torch.ones(2, device="tpu:99")


@pytest.mark.parametrize("op", [
    lambda a, b: a // b,
    lambda a, b: a % b,
    lambda a, b: torch.fmod(a, b),
    lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    lambda a, b: torch.div(a, b, rounding_mode="floor"),
    lambda a, b: torch.remainder(a, 0),
    lambda a, b: torch.remainder(5, b),
])
def test_integer_division_by_zero_raises_like_cpu(op):
    # CPU raises a RuntimeError reading "ZeroDivisionError" for integer division by zero; so does tpu
    # (the divisor is checked on the device, which synchronizes).
    a, b = torch.tensor([5, 3, -7]), torch.tensor([2, 0, 1])
    cpu_err = error_raised_by(lambda: op(a, b))
    tpu_err = error_raised_by(lambda: op(a.to("tpu"), b.to("tpu")))
    assert cpu_err is not None and tpu_err is not None, (cpu_err, tpu_err)
    assert type(tpu_err) is type(cpu_err) and str(tpu_err) == str(cpu_err) == "ZeroDivisionError", repr(tpu_err)


def test_integer_division_without_zero_and_float_division_by_zero_run():
    a, b = torch.tensor([5, 3, -7]), torch.tensor([2, -2, 1])
    assert_equal_cpu(a.to("tpu") // b.to("tpu"), a // b, exact=True)
    assert_equal_cpu(a.to("tpu") % b.to("tpu"), a % b, exact=True)
    # True division of integers gives floats, and float division by zero gives inf/NaN as on CPU.
    zero = torch.tensor([0, 0, 0])
    assert_equal_cpu(a.to("tpu") / zero.to("tpu"), a / zero)
    assert_equal_cpu(a.double().to("tpu") // zero.double().to("tpu"), a.double() // zero.double())
