"""Complex and float8 tensors on tpu equal PyTorch on the CPU: storage, copies, casts, complex views
sharing a storage with real ones, and PyTorch's conj bit."""

from __future__ import annotations

import warnings

import pytest
import torch

from conftest import TPU, assert_equal_cpu, last_json, run_python

COMPLEX = [torch.complex64, torch.complex128]
FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


def complex_sample(dtype, *shape):
    g = torch.Generator().manual_seed(0)
    return torch.complex(torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)).to(dtype)


# ----------------------------------------------------------------------------------------------
# complex64 / complex128


@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_round_trip(dtype):
    x = complex_sample(dtype, 3, 4)
    xt = x.to(TPU)
    assert xt.dtype == dtype
    assert_equal_cpu(xt, x, exact=True)
    assert_equal_cpu(xt.t().contiguous(), x.t().contiguous(), exact=True)
    assert_equal_cpu(xt[1:, ::2] * 2, x[1:, ::2] * 2, exact=True)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_creation(dtype):
    assert_equal_cpu(torch.zeros(2, 3, dtype=dtype, device=TPU), torch.zeros(2, 3, dtype=dtype), exact=True)
    assert_equal_cpu(torch.full((2,), 1.5 - 2j, dtype=dtype, device=TPU), torch.full((2,), 1.5 - 2j, dtype=dtype),
                     exact=True)


@pytest.mark.parametrize("source", [torch.float32, torch.float64, torch.int64, torch.complex64, torch.complex128])
@pytest.mark.parametrize("target", COMPLEX + [torch.float32, torch.float64])
def test_to_copy_between_real_and_complex(source, target):
    x = complex_sample(torch.complex128, 5) * 3
    x = x.to(source) if source.is_complex else x.real.to(source)
    with warnings.catch_warnings():  # complex to real: CPU warns (once) that the imaginary part is dropped
        warnings.simplefilter("ignore")
        expected, actual = x.to(target), x.to(TPU).to(target)
    assert_equal_cpu(actual, expected, exact=True)


def test_complex32_is_refused_with_a_reason():
    with pytest.raises(NotImplementedError, match="complex32"):
        torch.zeros(2, dtype=torch.chalf).to(TPU)


def test_complex_arithmetic():
    a, b = complex_sample(torch.complex64, 6), complex_sample(torch.complex64, 6).flip(0)
    at, bt = a.to(TPU), b.to(TPU)
    assert_equal_cpu(at + bt, a + b)
    assert_equal_cpu(at - 2 * bt, a - 2 * b)
    assert_equal_cpu(at * bt, a * b)
    assert_equal_cpu(at / bt, a / b)
    assert_equal_cpu(-at, -a)
    assert_equal_cpu(at.exp(), a.exp())
    assert_equal_cpu(at.sum(), a.sum())
    assert_equal_cpu(at.mean(), a.mean())
    assert_equal_cpu(at.abs(), a.abs())
    assert_equal_cpu(at.angle(), a.angle())
    assert_equal_cpu(at * (1 + 2j), a * (1 + 2j))


# ----------------------------------------------------------------------------------------------
# Complex views of real storages and real views of complex ones share the storage


def test_view_as_real_shares_the_complex_storage():
    x = complex_sample(torch.complex64, 2, 3)
    xt = x.to(TPU)
    r, rt = torch.view_as_real(x), torch.view_as_real(xt)
    assert_equal_cpu(rt, r, exact=True)
    rt[0, 1, 1] = 7.0  # a write through the real view changes the complex tensor
    r[0, 1, 1] = 7.0
    assert_equal_cpu(xt, x, exact=True)
    xt[1, 2] = 5 - 1j  # and a write to the complex tensor shows in the real view
    x[1, 2] = 5 - 1j
    assert_equal_cpu(rt, r, exact=True)
    assert_equal_cpu(xt.real, x.real, exact=True)
    assert_equal_cpu(xt.imag, x.imag, exact=True)


def test_view_as_complex_shares_the_real_storage():
    r = torch.randn(3, 4, 2, generator=torch.Generator().manual_seed(1))
    rt = r.to(TPU)
    c, ct = torch.view_as_complex(r), torch.view_as_complex(rt)
    assert_equal_cpu(ct, c, exact=True)
    ct.mul_(2j)
    c.mul_(2j)
    assert_equal_cpu(rt, r, exact=True)
    rt[..., 0] = 1.0  # writing the real parts through the real tensor
    r[..., 0] = 1.0
    assert_equal_cpu(ct, c, exact=True)
    assert_equal_cpu(torch.view_as_real(ct), torch.view_as_real(c), exact=True)


def test_real_and_imag_views_write_through():
    x = complex_sample(torch.complex128, 4)
    xt = x.to(TPU)
    xt.imag.zero_()
    x.imag.zero_()
    assert_equal_cpu(xt, x, exact=True)
    xt.real.add_(1)
    x.real.add_(1)
    assert_equal_cpu(xt, x, exact=True)


# A TPU's complex128 runs on the host (libtpu's emulation fails to compile its layout changes): the
# same path on any plugin with TORCHTPU_COMPLEX128_ON_HOST, in a process of its own.
COMPLEX128_ON_HOST = """
import json, torch, torchtpu
g = torch.Generator().manual_seed(0)
x = torch.complex(torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)).double()
t = x.to("tpu")
checks = {
    "transposed read": torch.equal(t.t().contiguous().cpu(), x.t().contiguous()),
    "strided read": torch.equal(t[1:, ::2].cpu(), x[1:, ::2]),
    "conj view": torch.equal(t.conj().t().cpu(), x.conj().t()),
}
w, wx = t.clone(), x.clone()
w.t()[1:3, ::2] = t.t()[0:2, 1:3]
wx.t()[1:3, ::2] = x.t()[0:2, 1:3]
checks["write through a view"] = torch.equal(w.cpu(), wx)
real, imag = torch.randn(10, 5, generator=g).double(), torch.randn(10, 5, generator=g).double()
out = torch.empty(10, 5, dtype=torch.complex128, device="tpu")
torch.complex(real.to("tpu"), imag.to("tpu"), out=out)
checks["complex(out=) into a new storage"] = torch.equal(out.cpu(), torch.complex(real, imag))
f = torch.fft.fft(t.t(), dim=0).cpu()
checks["fft of a transposed view"] = torch.allclose(f, torch.fft.fft(x.t(), dim=0), rtol=1e-12, atol=1e-12)
checks["division"] = torch.allclose((t / (t + 1)).cpu(), x / (x + 1), rtol=1e-12, atol=1e-12)
checks["fallbacks counted"] = bool(torchtpu.debug.metrics()["cpu_fallbacks"])
print(json.dumps(checks))
"""


def test_complex128_through_the_host_matches_cpu():
    result = run_python(COMPLEX128_ON_HOST, env={"TORCHTPU_COMPLEX128_ON_HOST": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    checks = last_json(result.stdout)
    assert checks and all(checks.values()), checks


def test_complex_from_parts_and_polar():
    re, im = torch.randn(5), torch.randn(5)
    assert_equal_cpu(torch.complex(re.to(TPU), im.to(TPU)), torch.complex(re, im), exact=True)
    assert_equal_cpu(torch.polar(re.abs().to(TPU), im.to(TPU)), torch.polar(re.abs(), im))


# ----------------------------------------------------------------------------------------------
# The conj bit


def test_conj_bit():
    x = complex_sample(torch.complex64, 3, 2)
    xt = x.to(TPU)
    yt = xt.conj()
    assert yt.is_conj()
    assert_equal_cpu(yt, x.conj(), exact=True)  # .cpu() of a conjugated view
    assert_equal_cpu(yt.resolve_conj(), x.conj().resolve_conj(), exact=True)
    assert not yt.resolve_conj().is_conj()
    assert_equal_cpu(torch.conj_physical(xt), torch.conj_physical(x), exact=True)
    assert_equal_cpu(yt * xt, x.conj() * x)  # an op reading a conjugated view
    assert_equal_cpu(yt.clone(), x.conj().clone(), exact=True)
    z = torch.zeros(3, 2, dtype=torch.complex64, device=TPU).conj()
    z.copy_(xt)  # a copy into a conjugated view stores the conjugate
    assert_equal_cpu(z.resolve_conj(), x, exact=True)
    assert_equal_cpu(torch.view_as_real(z.conj()), torch.view_as_real(x.conj().resolve_conj()), exact=True)
    assert_equal_cpu(x.conj().to(TPU), x.conj(), exact=True)  # from a conjugated CPU tensor


# ----------------------------------------------------------------------------------------------
# float8


@pytest.mark.parametrize("dtype", FLOAT8)
def test_float8_round_trip_and_casts(dtype):
    x = torch.tensor([0.0, -0.0, 1.0, -1.5, 0.3, 2.0**-7, 100.0, 240.0, 448.0, 5e-3])
    x8 = x.to(dtype)  # CPU's rounding is the reference
    x8t = x8.to(TPU)
    assert x8t.dtype == dtype
    assert_equal_cpu(x8t, x8, exact=True)
    assert_equal_cpu(x.to(TPU).to(dtype), x8, exact=True)  # rounding on the device
    assert_equal_cpu(x8t.to(torch.float32), x8.to(torch.float32), exact=True)
    assert_equal_cpu(x.double().to(TPU).to(dtype), x.double().to(dtype), exact=True)
    assert_equal_cpu(x8t.to(torch.bfloat16), x8.to(torch.bfloat16), exact=True)
    assert_equal_cpu(x8t[::2].to(torch.float32), x8[::2].to(torch.float32), exact=True)  # a strided read
