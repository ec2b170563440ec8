"""Shape, sort and creation ops on tpu vs CPU: forward and gradients with no CPU fallback."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_equal_cpu


def _forward_backward(fn, x: torch.Tensor):
    """fn(x) and d(sum(fn(x) * w))/dx for a fixed random w, on the device x lives on."""
    x = x.detach().clone().requires_grad_(True)
    y = fn(x)
    values = y[0] if isinstance(y, tuple) else y
    w = torch.linspace(-1.0, 1.0, values.numel(), dtype=values.dtype).reshape(values.shape).to(x.device)
    (values * w).sum().backward()
    return y, x.grad


def _check_grad(fn, x: torch.Tensor, atol=1e-5, rtol=1.3e-6):
    expected, expected_grad = _forward_backward(fn, x)
    actual, actual_grad = _forward_backward(fn, x.to("tpu"))
    for a, e in zip(actual if isinstance(actual, tuple) else (actual,),
                    expected if isinstance(expected, tuple) else (expected,)):
        assert_equal_cpu(a.detach(), e.detach(), atol=atol, rtol=rtol)
    assert_equal_cpu(actual_grad, expected_grad, atol=atol, rtol=rtol)


X = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0))

GRAD_CASES = {
    "flip": lambda x: x.flip(0, 2),
    "flip_neg": lambda x: torch.flip(x, (-1,)),
    "roll": lambda x: x.roll(2, 1),
    "roll_multi": lambda x: x.roll((1, -3), (0, 2)),
    "roll_flat": lambda x: x.roll(7),
    "repeat": lambda x: x.repeat(2, 1, 3),
    "repeat_more_dims": lambda x: x.repeat(2, 1, 1, 2),
    "tril": lambda x: x.tril(),
    "triu_offset": lambda x: x.triu(-1),
    "tril_offset": lambda x: x.tril(2),
    "pad_constant": lambda x: F.pad(x, (1, 2, 0, 3), value=0.5),
    "pad_constant_crop": lambda x: F.pad(x, (-1, 2, 1, -1)),
    "pad_reflect_1d": lambda x: F.pad(x, (2, 3), mode="reflect"),
    "pad_reflect_2d": lambda x: F.pad(x, (1, 4, 3, 2), mode="reflect"),
    "pad_replicate_1d": lambda x: F.pad(x, (3, 1), mode="replicate"),
    "pad_replicate_2d": lambda x: F.pad(x, (4, 0, 2, 5), mode="replicate"),
    "pad_reflect_batched_2d": lambda x: F.pad(x.unsqueeze(0), (2, 2, 1, 1), mode="reflect"),
    "sort": lambda x: torch.sort(x, dim=1),
    "sort_descending": lambda x: torch.sort(x, dim=-1, descending=True),
    "sort_stable": lambda x: torch.sort(x, dim=0, stable=True),
    "topk": lambda x: torch.topk(x, 3, dim=-1),
    "topk_smallest": lambda x: torch.topk(x, 2, dim=1, largest=False),
}


@pytest.mark.parametrize("case", sorted(GRAD_CASES))
def test_forward_and_grad(case, no_fallback):
    _check_grad(GRAD_CASES[case], X)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32, torch.bool])
def test_shape_ops_dtypes(dtype, no_fallback):
    x = (torch.randn(4, 6, generator=torch.Generator().manual_seed(1)) * 5).to(dtype)
    t = x.to("tpu")
    for fn in (lambda v: v.flip(1), lambda v: v.roll(-2, 0), lambda v: v.repeat(2, 2), lambda v: v.tril(1),
               lambda v: v.triu(), lambda v: F.pad(v, (1, 1, 2, 0), value=1)):
        assert_equal_cpu(fn(t), fn(x), exact=True)
    if dtype != torch.bool:
        assert_equal_cpu(t.sort(dim=1).values, x.sort(dim=1).values, exact=True)
        assert_equal_cpu(t.sort(dim=0, descending=True, stable=True).indices,
                         x.sort(dim=0, descending=True, stable=True).indices, exact=True)


def test_inplace_tril_triu(no_fallback):
    x = torch.randn(5, 5)
    t = x.to("tpu")
    t.tril_(-1)
    x.tril_(-1)
    assert_equal_cpu(t, x, exact=True)
    t.triu_(-2)
    x.triu_(-2)
    assert_equal_cpu(t, x, exact=True)


def test_sort_ties_and_nan(no_fallback):
    x = torch.tensor([[3.0, float("nan"), 1.0, 3.0, -0.0, 0.0, float("-inf"), 1.0, float("nan"), float("inf")]])
    t = x.to("tpu")
    for descending in (False, True):
        expected = torch.sort(x, dim=1, descending=descending, stable=True)
        actual = torch.sort(t, dim=1, descending=descending, stable=True)
        assert_equal_cpu(actual.values, expected.values, exact=True)
        assert_equal_cpu(actual.indices, expected.indices, exact=True)
    assert_equal_cpu(torch.argsort(t, dim=1, stable=True), torch.argsort(x, dim=1, stable=True), exact=True)
    assert_equal_cpu(torch.topk(t, 4).values, torch.topk(x, 4).values, exact=True)
    assert_equal_cpu(torch.topk(t, 3, largest=False).indices, torch.topk(x, 3, largest=False).indices, exact=True)


def test_sort_ints_with_ties_stable(no_fallback):
    x = torch.randint(0, 4, (6, 40), generator=torch.Generator().manual_seed(2))
    t = x.to("tpu")
    for descending in (False, True):
        e = torch.sort(x, dim=1, descending=descending, stable=True)
        a = torch.sort(t, dim=1, descending=descending, stable=True)
        assert_equal_cpu(a.values, e.values, exact=True)
        assert_equal_cpu(a.indices, e.indices, exact=True)


def test_sort_scalar_and_empty(no_fallback):
    s = torch.tensor(2.5)
    v, i = torch.sort(s.to("tpu"))
    assert_equal_cpu(v, s, exact=True)
    assert_equal_cpu(i, torch.tensor(0), exact=True)
    e = torch.empty(0, 3)
    v, i = torch.sort(e.to("tpu"), dim=0)
    assert_equal_cpu(v, e, exact=True)
    assert_equal_cpu(i, torch.empty(0, 3, dtype=torch.int64), exact=True)


# --- creation ops --------------------------------------------------------------------------------

ARANGE_CASES = [((5,), {}), ((2, 9), {}), ((1, 10, 3), {}), ((10, 1, -2), {}), ((0.5, 4.0, 0.25), {}),
                ((-1, 1, 0.1), {}), ((5,), {"dtype": torch.float32}), ((3, 8), {"dtype": torch.int32}),
                ((0, 1, 0.125), {"dtype": torch.bfloat16}), ((0, 2, 0.3), {"dtype": torch.float64}),
                ((0, 6), {"dtype": torch.uint8}), ((0,), {})]


@pytest.mark.parametrize("args,kwargs", ARANGE_CASES)
def test_arange(args, kwargs, no_fallback):
    expected = torch.arange(*args, **kwargs)
    actual = torch.arange(*args, **kwargs, device="tpu")
    assert_equal_cpu(actual, expected)


def test_arange_out_and_device_index(no_fallback):
    out = torch.empty(0, dtype=torch.int64, device="tpu")
    r = torch.arange(4, 13, 2, out=out)
    assert r is out
    assert_equal_cpu(out, torch.arange(4, 13, 2), exact=True)
    assert_equal_cpu(torch.arange(7, device="tpu:0"), torch.arange(7), exact=True)
    # New values compile new modules, and each gives its own result.
    for n in (3, 4, 3):
        assert_equal_cpu(torch.arange(n, device="tpu"), torch.arange(n), exact=True)


@pytest.mark.parametrize("dtype", [None, torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32])
@pytest.mark.parametrize("start,end,steps", [(0, 1, 5), (-3.5, 7.25, 11), (10, -10, 8), (2, 2, 3), (1, 5, 1), (0, 1, 0)])
def test_linspace(dtype, start, end, steps, no_fallback):
    expected = torch.linspace(start, end, steps, dtype=dtype)
    actual = torch.linspace(start, end, steps, dtype=dtype, device="tpu")
    assert_equal_cpu(actual, expected)


def test_linspace_reuses_module_for_new_values(no_fallback):
    for start, end in ((0.0, 1.0), (-2.0, 5.0)):
        assert_equal_cpu(torch.linspace(start, end, 6, device="tpu"), torch.linspace(start, end, 6))


@pytest.mark.parametrize("dtype", [None, torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_eye(dtype, no_fallback):
    assert_equal_cpu(torch.eye(4, dtype=dtype, device="tpu"), torch.eye(4, dtype=dtype), exact=True)
    assert_equal_cpu(torch.eye(3, 5, dtype=dtype, device="tpu"), torch.eye(3, 5, dtype=dtype), exact=True)
    assert_equal_cpu(torch.eye(0, dtype=dtype, device="tpu"), torch.eye(0, dtype=dtype), exact=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32, torch.bool])
def test_fill_factories(dtype, no_fallback):
    cases = [
        lambda **kw: torch.zeros(3, 2, dtype=dtype, **kw),
        lambda **kw: torch.ones(4, dtype=dtype, **kw),
        lambda **kw: torch.full((2, 3), 1, dtype=dtype, **kw),
        lambda **kw: torch.zeros_like(torch.empty(2, 5, dtype=dtype, **kw)),
        lambda **kw: torch.ones_like(torch.empty(3, dtype=dtype, **kw)),
        lambda **kw: torch.full_like(torch.empty(2, 2, dtype=dtype, **kw), 1),
        lambda **kw: torch.empty(3, dtype=dtype, **kw).new_zeros(2, 2),
        lambda **kw: torch.empty(3, dtype=dtype, **kw).new_ones(3),
        lambda **kw: torch.empty(3, dtype=dtype, **kw).new_full((1, 2), 1),
    ]
    for make in cases:
        assert_equal_cpu(make(device="tpu"), make(), exact=True)
    e = torch.empty_like(torch.empty(2, 3, dtype=dtype, device="tpu"))
    assert e.device.type == "tpu" and e.dtype == dtype and e.shape == (2, 3)
