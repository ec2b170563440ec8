"""Errors and fallbacks: CPU fallback warnings and counters, TORCHTPU_FALLBACK=error, plugin
selection failures, unsupported dtypes and device mixing."""

from __future__ import annotations

import warnings

import pytest
import torch

import torchtpu
from conftest import assert_equal_cpu, error_raised_by, last_json, metrics, run_python


def _fallback_count(op: str) -> int:
    """CPU fallback count for `op`, over its overloads ("aten::gcd", "aten::gcd.out", ...)."""
    return sum(n for k, n in metrics()["cpu_fallbacks"].items() if k == op or k.startswith(op + "."))


def _fallback_warnings(record, op):
    return [w for w in record if issubclass(w.category, UserWarning) and op in str(w.message)]


# gcd (functional, in-place and out=) has no spec: these tests are the suite's only users of it, so
# its one-time warning is theirs. (When it gets a spec, pick another op without one: coverage --parity
# lists them.)
def test_fallback_warns_once_and_counts():
    cpu, other_cpu = torch.tensor([[12, 18], [7, -30]]), torch.tensor([[8, 4], [21, 45]])
    t, other = cpu.to("tpu"), other_cpu.to("tpu")
    before = _fallback_count("aten::gcd")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = torch.gcd(t, other)
        second = torch.gcd(t, other)
    found = _fallback_warnings(record, "aten::gcd")
    assert len(found) == 1, [str(w.message) for w in record]
    assert "CPU" in str(found[0].message)
    assert_equal_cpu(first, torch.gcd(cpu, other_cpu), exact=True)
    assert_equal_cpu(second, torch.gcd(cpu, other_cpu), exact=True)
    assert _fallback_count("aten::gcd") == before + 2, metrics()["cpu_fallbacks"]
    report = torchtpu.debug.metrics_report()
    assert "aten::gcd" in report


def test_fallback_ops_give_cpu_results():
    torch.manual_seed(4)
    cpu, other_cpu = torch.randint(-40, 40, (3, 4)), torch.randint(1, 40, (3, 4))
    t, other = cpu.to("tpu"), other_cpu.to("tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_equal_cpu(torch.gcd(t, other), torch.gcd(cpu, other_cpu))
        assert_equal_cpu(torch.amax(t, dim=1), torch.amax(cpu, dim=1))
        assert_equal_cpu(t > 0, cpu > 0)
        assert_equal_cpu(torch.gcd(t.t(), other.t()), torch.gcd(cpu.t(), other_cpu.t()))
        o = torch.empty(0, dtype=torch.int64, device="tpu")
        torch.lcm(t, other, out=o)
        assert_equal_cpu(o, torch.lcm(cpu, other_cpu))
        v = t.clone()
        v[1:].gcd_(other[1:])  # in-place fallback on a contiguous view writes back to the tpu storage
        ref = cpu.clone()
        ref[1:].gcd_(other_cpu[1:])
        assert_equal_cpu(v, ref)
    assert _fallback_count("aten::gcd") >= 1
    assert _fallback_count("aten::lcm") >= 1


def test_inplace_fallback_on_strided_view_writes_back_strided():
    base = torch.arange(6).reshape(2, 3) * 6
    t = base.to("tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base[:, 1].gcd_(torch.tensor([4, 9]))
        t[:, 1].gcd_(torch.tensor([4, 9]).to("tpu"))
        assert_equal_cpu(t, base)
        b2 = torch.arange(6) * 10
        t2 = b2.to("tpu")
        b2[::2].gcd_(torch.tensor([4, 4, 4]))
        t2[::2].gcd_(torch.tensor([4, 4, 4]).to("tpu"))
        assert_equal_cpu(t2, b2)


FALLBACK_ERROR = r"""
import json
import torch, torchtpu
x = torch.tensor([-1, 2]).to("tpu")
ok = (x + x).cpu().tolist()  # spec'd ops still work
try:
    torch.gcd(x, x)
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
    assert "gcd" in out["error"], out["error"]


def test_fallback_default_mode_subprocess():
    proc = run_python(FALLBACK_ERROR, {"TORCHTPU_FALLBACK": None})
    assert proc.returncode == 0, proc.stderr
    out = last_json(proc.stdout)
    assert out["type"] is None and out["error"] is None
    assert "aten::gcd" in proc.stderr  # the one-time UserWarning


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


@pytest.mark.parametrize("value", ["/nonexistent/libpjrt_nothing.so", "/etc/hostname", "bogus_plugin"])
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
