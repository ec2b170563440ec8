"""torch.matmul, F.linear and einsum (composites over mm/bmm/mv/dot/addmm and views) run on tpu
without any CPU fallback and match the CPU, forward and backward; plus the beta == 0 rule of the
addmm family and _addmm_activation, which no OpInfo covers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_equal_cpu, no_cpu_fallback

FLOAT_TOL = {"atol": 1e-4, "rtol": 1e-4}


def tpu(t):
    return t.to("tpu")




def tol(dtype):
    # bfloat16 computes in float32 and rounds once: torch.testing's default bfloat16 tolerances.
    return {} if dtype == torch.bfloat16 else FLOAT_TOL


MATMUL_SHAPES = [
    ((5,), (5,)),  # dot
    ((3, 5), (5,)),  # mv
    ((5,), (5, 4)),  # unsqueeze + mm + squeeze
    ((2, 3, 5), (5, 4)),  # folded into one mm
    ((2, 1, 3, 5), (1, 4, 5, 2)),  # broadcast batch dims: expand + reshape + bmm
    ((3, 5), (2, 5, 4)),  # 2-D x batched
    ((2, 3, 5), (2, 5, 4)),  # bmm
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_matmul_shapes(shapes, dtype):
    torch.manual_seed(0)
    a, b = torch.randn(shapes[0], dtype=dtype), torch.randn(shapes[1], dtype=dtype)
    with no_cpu_fallback():
        actual = torch.matmul(tpu(a), tpu(b))
        assert_equal_cpu(actual, torch.matmul(a, b), **tol(dtype))


def test_matmul_int64_exact():
    torch.manual_seed(0)
    a, b = torch.randint(-9, 9, (2, 3, 5)), torch.randint(-9, 9, (5, 4))
    with no_cpu_fallback():
        assert_equal_cpu(torch.matmul(tpu(a), tpu(b)), torch.matmul(a, b), exact=True)


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_matmul_backward(shapes):
    torch.manual_seed(0)
    a, b = torch.randn(shapes[0]), torch.randn(shapes[1])
    grad = torch.randn(torch.matmul(a, b).shape)

    def run(device):
        x = a.detach().clone().to(device).requires_grad_()
        y = b.detach().clone().to(device).requires_grad_()
        torch.matmul(x, y).backward(grad.to(device))
        return x.grad, y.grad

    expected = run("cpu")
    with no_cpu_fallback():
        actual = run("tpu")
        for got, want in zip(actual, expected):
            assert_equal_cpu(got, want, **FLOAT_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("in_shape", [(6,), (4, 6), (2, 3, 6)], ids=["1d", "2d", "3d"])
def test_linear(in_shape, bias, dtype):
    torch.manual_seed(0)
    x, w = torch.randn(in_shape, dtype=dtype), torch.randn(5, 6, dtype=dtype)
    b = torch.randn(5, dtype=dtype) if bias else None
    with no_cpu_fallback():
        actual = F.linear(tpu(x), tpu(w), None if b is None else tpu(b))
        assert_equal_cpu(actual, F.linear(x, w, b), **tol(dtype))


def test_linear_backward():
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 6), torch.randn(5, 6), torch.randn(5)

    def run(device):
        leaves = [t.detach().clone().to(device).requires_grad_() for t in (x, w, b)]
        F.linear(*leaves).square().sum().backward()
        return [t.grad for t in leaves]

    expected = run("cpu")
    with no_cpu_fallback():
        for got, want in zip(run("tpu"), expected):
            assert_equal_cpu(got, want, **FLOAT_TOL)


def test_einsum_batched():
    torch.manual_seed(0)
    a, b = torch.randn(3, 4, 5), torch.randn(3, 5, 2)
    with no_cpu_fallback():
        actual = torch.einsum("bij,bjk->bik", tpu(a), tpu(b))
        assert_equal_cpu(actual, torch.einsum("bij,bjk->bik", a, b), **FLOAT_TOL)


# ----------------------------------------------------------------------------------------------
# The addmm family: beta == 0 ignores self's NaN/inf, as on the CPU


def _with_nan(shape):
    t = torch.randn(shape)
    t.view(-1)[0] = float("nan")
    t.view(-1)[-1] = float("inf")
    return t


@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize("op", ["addmm", "addmv", "baddbmm", "addbmm"])
def test_beta_zero_ignores_self(op, beta):
    torch.manual_seed(0)
    args = {
        "addmm": ((3, 4), (3, 5), (5, 4)),
        "addmv": ((3,), (3, 5), (5,)),
        "baddbmm": ((2, 3, 4), (2, 3, 5), (2, 5, 4)),
        "addbmm": ((3, 4), (2, 3, 5), (2, 5, 4)),
    }[op]
    inputs = [_with_nan(args[0])] + [torch.randn(s) for s in args[1:]]
    fn = getattr(torch, op)
    expected = fn(*inputs, beta=beta, alpha=1.5)
    with no_cpu_fallback():
        assert_equal_cpu(fn(*map(tpu, inputs), beta=beta, alpha=1.5), expected, **FLOAT_TOL)


@pytest.mark.parametrize("op", ["addmm_", "baddbmm_", "addmv_"])
def test_inplace_beta_zero(op):
    torch.manual_seed(0)
    shapes = {"addmm_": ((3, 4), (3, 5), (5, 4)), "baddbmm_": ((2, 3, 4), (2, 3, 5), (2, 5, 4)),
              "addmv_": ((3,), (3, 5), (5,))}[op]
    inputs = [_with_nan(shapes[0])] + [torch.randn(s) for s in shapes[1:]]
    on_tpu = list(map(tpu, inputs))
    with no_cpu_fallback():
        result = getattr(on_tpu[0], op)(*on_tpu[1:], beta=0, alpha=2)
        assert result is on_tpu[0]
        assert_equal_cpu(on_tpu[0], getattr(inputs[0], op)(*inputs[1:], beta=0, alpha=2), **FLOAT_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("use_gelu", [False, True], ids=["relu", "gelu"])
def test_addmm_activation(use_gelu, dtype):
    torch.manual_seed(0)
    self, m1, m2 = torch.randn(4, dtype=dtype), torch.randn(3, 5, dtype=dtype), torch.randn(5, 4, dtype=dtype)
    expected = torch._addmm_activation(self, m1, m2, beta=0.5, alpha=2.0, use_gelu=use_gelu)
    with no_cpu_fallback():
        actual = torch._addmm_activation(tpu(self), tpu(m1), tpu(m2), beta=0.5, alpha=2.0, use_gelu=use_gelu)
        assert_equal_cpu(actual, expected, **tol(dtype))
