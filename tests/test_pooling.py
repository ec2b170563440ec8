"""Pooling and upsampling on tpu (specs/pooling.yaml): forward AND gradients against CPU for the
shapes UNet/ResNet-style models use, every mode the specs take (ceil_mode, padding, dilation,
count_include_pad, divisor_override, non-divisible adaptive windows, align_corners, scale factors),
max-pool indices (ties, NaN), and the backward ops called directly. None may fall back to the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import close




def forward_backward(fn, x, device):
    """fn(x) and the gradient of a weighted sum of its (first) output with respect to x."""
    x = x.detach().to(device).requires_grad_(True)
    out = fn(x)
    first = out[0] if isinstance(out, tuple) else out
    weights = torch.linspace(-1.0, 2.0, first.numel(), dtype=first.dtype).reshape(first.shape).to(device)
    (first * weights).sum().backward()
    return out, x.grad


def check(fn, x, **tol):
    expected, expected_grad = forward_backward(fn, x, "cpu")
    actual, actual_grad = forward_backward(fn, x, "tpu")
    if isinstance(expected, tuple):
        for a, e in zip(actual, expected):
            close(a.detach(), e.detach(), **tol)
    else:
        close(actual.detach(), expected.detach(), **tol)
    close(actual_grad, expected_grad, **tol)


MODULES = {
    "MaxPool2d(2)": lambda: torch.nn.MaxPool2d(2),
    "MaxPool2d(3,2,1)": lambda: torch.nn.MaxPool2d(3, 2, 1),
    "AdaptiveAvgPool2d(1)": lambda: torch.nn.AdaptiveAvgPool2d(1),
    "AdaptiveAvgPool2d((7,7))": lambda: torch.nn.AdaptiveAvgPool2d((7, 7)),
    "AvgPool2d(2)": lambda: torch.nn.AvgPool2d(2),
    "Upsample(2,nearest)": lambda: torch.nn.Upsample(scale_factor=2, mode="nearest"),
    "Upsample(2,bilinear)": lambda: torch.nn.Upsample(scale_factor=2, mode="bilinear"),
    "Upsample(2,bilinear,align_corners)": lambda: torch.nn.Upsample(scale_factor=2, mode="bilinear",
                                                                    align_corners=True),
}


@pytest.mark.parametrize("name", list(MODULES))
@pytest.mark.parametrize("shape", [(2, 8, 32, 32), (1, 16, 14, 14), (2, 3, 7, 9)])
def test_model_modules(name, shape, no_fallback):
    torch.manual_seed(0)
    check(MODULES[name](), torch.randn(shape))


CASES = {
    "max_pool1d": (lambda t: F.max_pool1d(t, 3, 2, 1), (2, 3, 11)),
    "max_pool1d_unbatched": (lambda t: F.max_pool1d(t, 2), (3, 10)),
    "max_pool2d_indices_ceil_dilation": (lambda t: F.max_pool2d(t, 3, 2, 1, dilation=2, ceil_mode=True,
                                                                return_indices=True), (2, 3, 10, 9)),
    "max_pool2d_rect": (lambda t: F.max_pool2d(t, (2, 3), (1, 2), (1, 0), return_indices=True), (1, 2, 6, 7)),
    "max_pool2d_unbatched": (lambda t: F.max_pool2d(t, 2, return_indices=True), (3, 6, 6)),
    "max_pool3d": (lambda t: F.max_pool3d(t, 2, return_indices=True), (2, 3, 4, 5, 6)),
    "max_pool3d_pad_ceil": (lambda t: F.max_pool3d(t, 3, 2, 1, ceil_mode=True, return_indices=True), (1, 2, 5, 6, 7)),
    "avg_pool1d": (lambda t: F.avg_pool1d(t, 3, 2, 1), (2, 3, 11)),
    "avg_pool2d_pad": (lambda t: F.avg_pool2d(t, 3, 2, 1), (2, 3, 9, 8)),
    "avg_pool2d_ceil_exclude_pad": (lambda t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                                    (2, 3, 10, 9)),
    "avg_pool2d_ceil_include_pad": (lambda t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=True), (2, 3, 10, 9)),
    "avg_pool2d_divisor_override": (lambda t: F.avg_pool2d(t, 3, 2, 1, divisor_override=5), (2, 3, 9, 8)),
    "avg_pool3d": (lambda t: F.avg_pool3d(t, 2, 2, 1, ceil_mode=True, count_include_pad=False), (1, 2, 5, 6, 7)),
    "adaptive_avg_pool1d": (lambda t: F.adaptive_avg_pool1d(t, 4), (2, 3, 10)),
    "adaptive_avg_pool2d_uneven": (lambda t: F.adaptive_avg_pool2d(t, (3, 5)), (2, 3, 8, 9)),
    "adaptive_avg_pool2d_upsampling": (lambda t: F.adaptive_avg_pool2d(t, (5, 7)), (1, 2, 3, 4)),
    "adaptive_avg_pool3d": (lambda t: F.adaptive_avg_pool3d(t, (2, 3, 4)), (1, 2, 5, 6, 7)),
    "adaptive_max_pool1d": (lambda t: F.adaptive_max_pool1d(t, 4, return_indices=True), (2, 3, 10)),
    "adaptive_max_pool2d": (lambda t: F.adaptive_max_pool2d(t, (3, 5), return_indices=True), (2, 3, 8, 9)),
    "adaptive_max_pool2d_global": (lambda t: F.adaptive_max_pool2d(t, 1), (2, 4, 7, 7)),
    "adaptive_max_pool3d": (lambda t: F.adaptive_max_pool3d(t, (2, 3, 4), return_indices=True), (1, 2, 5, 6, 7)),
    "nearest1d": (lambda t: F.interpolate(t, scale_factor=3, mode="nearest"), (2, 3, 5)),
    "nearest2d_size": (lambda t: F.interpolate(t, size=(5, 13), mode="nearest"), (2, 3, 7, 6)),
    "nearest2d_scale": (lambda t: F.interpolate(t, scale_factor=1.7, mode="nearest"), (2, 3, 7, 6)),
    "nearest2d_down": (lambda t: F.interpolate(t, scale_factor=0.5, mode="nearest"), (2, 3, 8, 7)),
    "nearest3d": (lambda t: F.interpolate(t, scale_factor=(2, 1.5, 3), mode="nearest"), (1, 2, 3, 4, 5)),
    "nearest_exact1d": (lambda t: F.interpolate(t, size=8, mode="nearest-exact"), (2, 3, 5)),
    "nearest_exact2d": (lambda t: F.interpolate(t, size=(5, 13), mode="nearest-exact"), (2, 3, 7, 6)),
    "nearest_exact3d": (lambda t: F.interpolate(t, scale_factor=1.5, mode="nearest-exact"), (1, 2, 3, 4, 5)),
    "linear": (lambda t: F.interpolate(t, scale_factor=2.5, mode="linear"), (2, 3, 7)),
    "linear_align": (lambda t: F.interpolate(t, size=11, mode="linear", align_corners=True), (2, 3, 7)),
    "bilinear_size": (lambda t: F.interpolate(t, size=(5, 13), mode="bilinear"), (2, 3, 7, 6)),
    "bilinear_down": (lambda t: F.interpolate(t, scale_factor=0.6, mode="bilinear"), (2, 3, 9, 8)),
    "bilinear_scale_recompute": (lambda t: F.interpolate(t, scale_factor=1.3, mode="bilinear",
                                                         recompute_scale_factor=True), (2, 3, 7, 6)),
    "bilinear_align_size1": (lambda t: F.interpolate(t, size=(1, 5), mode="bilinear", align_corners=True),
                             (1, 2, 4, 3)),
    "bilinear_antialias_down": (lambda t: F.interpolate(t, size=(3, 5), mode="bilinear", antialias=True),
                                (2, 3, 9, 11)),
    "bicubic_antialias_down": (lambda t: F.interpolate(t, scale_factor=0.4, mode="bicubic", antialias=True),
                               (2, 3, 10, 12)),
    "bicubic_antialias_up_align": (lambda t: F.interpolate(t, size=(7, 4), mode="bicubic", antialias=True,
                                                           align_corners=True), (1, 2, 4, 3)),
    "trilinear": (lambda t: F.interpolate(t, scale_factor=2, mode="trilinear"), (1, 2, 3, 4, 5)),
    "trilinear_align": (lambda t: F.interpolate(t, size=(4, 5, 3), mode="trilinear", align_corners=True),
                        (1, 2, 3, 4, 5)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_functional_forward_backward(name, no_fallback):
    torch.manual_seed(0)
    fn, shape = CASES[name]
    check(fn, torch.randn(shape))


@pytest.mark.parametrize("name", ["max_pool2d_indices_ceil_dilation", "avg_pool2d_pad", "adaptive_avg_pool2d_uneven",
                                  "adaptive_max_pool2d", "nearest2d_size", "bilinear_size"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_other_float_dtypes(name, dtype, no_fallback):
    torch.manual_seed(0)
    fn, shape = CASES[name]
    check(fn, torch.randn(shape, dtype=dtype))


def test_channels_last_input(no_fallback):
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8, 8).to(memory_format=torch.channels_last)
    check(lambda t: F.max_pool2d(t, 3, 2, 1), x)
    check(lambda t: F.interpolate(t, scale_factor=2, mode="bilinear"), x)


def test_max_pool_ties_nan_and_inf(no_fallback):
    # Ties: the first max; NaN: the last NaN of the window; all -inf: the first valid position.
    x = torch.tensor([[[[1.0, 1.0, 2.0, 2.0], [1.0, 0.0, 2.0, float("nan")],
                        [float("-inf"), float("-inf"), float("nan"), 5.0], [float("-inf"), float("-inf"), 3.0, float("nan")]]]])
    for fn in (lambda t: F.max_pool2d(t, 2, return_indices=True),
               lambda t: F.max_pool2d(t, 3, 1, 1, return_indices=True),
               lambda t: F.adaptive_max_pool2d(t, 3, return_indices=True)):
        expected = fn(x)
        actual = fn(x.to("tpu"))
        close(actual[0], expected[0])
        close(actual[1], expected[1], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8])
def test_integer_max_pool_and_nearest(dtype, no_fallback):
    x = torch.randint(0, 100, (2, 3, 7, 8)).to(dtype)
    for fn in (lambda t: F.max_pool2d(t, 3, 2, 1, return_indices=True), lambda t: F.max_pool3d(t[None], 2)):
        expected, actual = fn(x), fn(x.to("tpu"))
        for a, e in zip(actual if isinstance(actual, tuple) else (actual,),
                        expected if isinstance(expected, tuple) else (expected,)):
            close(a, e, rtol=0, atol=0)
    if dtype == torch.uint8:
        close(F.interpolate(x.to("tpu"), scale_factor=2), F.interpolate(x, scale_factor=2), rtol=0, atol=0)


def test_backward_ops_called_directly(no_fallback):
    torch.manual_seed(0)
    aten = torch.ops.aten
    x = torch.randn(2, 3, 9, 8)
    out, idx = aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1], [1, 1], True)
    g = torch.randn(out.shape)
    g2 = torch.randn(2, 3, 5, 4)
    calls = [
        lambda d: aten.max_pool2d_with_indices_backward(g.to(d), x.to(d), [3, 3], [2, 2], [1, 1], [1, 1], True,
                                                        idx.to(d)),
        lambda d: aten.avg_pool2d_backward(g.to(d), x.to(d), [3, 3], [2, 2], [1, 1], True, False, None),
        lambda d: aten.avg_pool2d_backward(g.to(d), x.to(d), [3, 3], [2, 2], [1, 1], True, True, 7),
        lambda d: aten._adaptive_avg_pool2d_backward(g.to(d), x.to(d)),
        lambda d: aten.upsample_nearest2d_backward(g2.to(d), [5, 4], [2, 3, 3, 2], None, None),
        lambda d: aten.upsample_bilinear2d_backward(g2.to(d), [5, 4], [2, 3, 3, 2], False, None, None),
        lambda d: aten.upsample_bilinear2d_backward(g2.to(d), [5, 4], [2, 3, 3, 2], True, None, None),
    ]
    for call in calls:
        close(call("tpu"), call("cpu"))


def test_out_variants(no_fallback):
    x = torch.randn(2, 3, 8, 8)
    for op, args in ((torch.ops.aten.avg_pool2d.out, ([2, 2],)),
                     (torch.ops.aten.upsample_nearest2d.out, ([16, 16], None, None)),
                     (torch.ops.aten.upsample_bilinear2d.out, ([16, 16], False, None, None))):
        expected = op.overloadpacket(x, *args)
        out = torch.empty(0, device="tpu")
        result = op(x.to("tpu"), *args, out=out)
        assert result is out
        close(out, expected)


# fractional max pool: F.fractional_max_pool2d/3d draw their samples on the input's device, so both
# devices get the same explicit samples (also the module, nn.FractionalMaxPool2d, through them).
FRACTIONAL = {
    "2d_output_size": (lambda t, u: F.fractional_max_pool2d(t, 3, output_size=(5, 4), return_indices=True,
                                                            _random_samples=u), (2, 3, 11, 9)),
    "2d_ratio_unbatched": (lambda t, u: F.fractional_max_pool2d(t, (2, 3), output_ratio=(0.6, 0.6), return_indices=True,
                                                                _random_samples=u), (3, 10, 12)),
    "2d_one_output": (lambda t, u: F.fractional_max_pool2d(t, 2, output_size=1, _random_samples=u), (1, 2, 5, 5)),
    "3d_output_size": (lambda t, u: F.fractional_max_pool3d(t, 2, output_size=(3, 4, 3), return_indices=True,
                                                            _random_samples=u), (2, 2, 7, 8, 6)),
    "3d_unbatched": (lambda t, u: F.fractional_max_pool3d(t, (1, 2, 3), output_ratio=(0.5, 0.5, 0.5),
                                                          _random_samples=u), (2, 6, 7, 9)),
}


@pytest.mark.parametrize("name", list(FRACTIONAL))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fractional_max_pool(name, dtype, no_fallback):
    torch.manual_seed(0)
    fn, shape = FRACTIONAL[name]
    nd = 3 if name.startswith("3d") else 2
    batch = shape[0] if len(shape) == nd + 2 else 1
    samples = torch.rand(batch, shape[-nd - 1], nd, dtype=dtype)
    # Few distinct values and a NaN: ties pick the first max and NaN its last, as on CPU.
    x = torch.randint(0, 4, shape).to(dtype)
    x.view(-1)[5] = float("nan")
    check(lambda t: fn(t, samples.to(t.device)), x)
    check(lambda t: fn(t, samples.to(t.device)), torch.randn(shape, dtype=dtype))


def test_fractional_max_pool_out_and_errors(no_fallback):
    x, samples = torch.randn(1, 2, 9, 9), torch.rand(1, 2, 2)
    expected = torch.ops.aten.fractional_max_pool2d(x, [2, 2], [4, 4], samples)
    out, indices = torch.empty(0, device="tpu"), torch.empty(0, dtype=torch.long, device="tpu")
    torch.ops.aten.fractional_max_pool2d.output(x.to("tpu"), [2, 2], [4, 4], samples.to("tpu"), output=out,
                                                indices=indices)
    close(out, expected[0])
    close(indices, expected[1])
    # A window that does not fit: PyTorch's own message.
    for device in ("cpu", "tpu"):
        with pytest.raises(RuntimeError, match="too large relative to input"):
            torch.ops.aten.fractional_max_pool2d(x.to(device), [2, 8], [4, 4], samples.to(device))
