"""Normalization on tpu (specs/normalization.yaml): nn.LayerNorm / nn.GroupNorm forward and backward
against CPU, output_mask, and the OpInfos the generated parity tests do not cover. None may fall back
to the CPU."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import close, module_forward_backward
from torchtpu.testing import check_opinfo, find_opinfo







@pytest.mark.parametrize("shape,normalized", [((4, 10), (10,)), ((2, 3, 8), (8,)), ((2, 3, 4, 5), (4, 5)),
                                              ((6,), (6,))])
def test_layer_norm_module_forward_backward(shape, normalized, no_fallback):
    torch.manual_seed(0)
    cpu = torch.nn.LayerNorm(normalized)
    with torch.no_grad():
        cpu.weight.copy_(torch.randn(normalized))
        cpu.bias.copy_(torch.randn(normalized))
    tpu = torch.nn.LayerNorm(normalized)
    tpu.load_state_dict(cpu.state_dict())
    x = torch.randn(shape) * 3 + 1
    expected = module_forward_backward(cpu, x, "cpu")
    actual = module_forward_backward(tpu, x, "tpu")
    for a, e in zip(actual, expected):
        close(a, e, atol=1e-5, rtol=1e-5)


def test_layer_norm_without_affine(no_fallback):
    x = torch.randn(3, 5, 7)
    xc = x.clone().requires_grad_(True)
    xt = x.to("tpu").requires_grad_(True)
    torch.nn.functional.layer_norm(xc, (5, 7)).pow(2).sum().backward()
    out = torch.nn.functional.layer_norm(xt, (5, 7))
    out.pow(2).sum().backward()
    close(out.detach(), torch.nn.functional.layer_norm(x, (5, 7)), atol=1e-5, rtol=1e-5)
    close(xt.grad, xc.grad, atol=1e-4, rtol=1e-4)


def test_layer_norm_bfloat16_module(no_fallback):
    torch.manual_seed(1)
    cpu = torch.nn.LayerNorm(16).bfloat16()
    tpu = torch.nn.LayerNorm(16).bfloat16()
    tpu.load_state_dict(cpu.state_dict())
    x = torch.randn(4, 16).bfloat16()
    expected = module_forward_backward(cpu, x, "cpu")
    actual = module_forward_backward(tpu, x, "tpu")
    for a, e in zip(actual, expected):
        close(a, e, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("mask", [[True, False, False], [False, True, True], [True, True, False]])
def test_layer_norm_backward_output_mask(mask, no_fallback):
    x, g, w, b = torch.randn(3, 4, 6), torch.randn(3, 4, 6), torch.randn(6), torch.randn(6)
    _, mean, rstd = torch.native_layer_norm(x, [6], w, b, 1e-5)
    args = [g, x, [6], mean, rstd, w, b, mask]
    expected = torch.ops.aten.native_layer_norm_backward(*args)
    actual = torch.ops.aten.native_layer_norm_backward(*[a.to("tpu") if isinstance(a, torch.Tensor) else a
                                                          for a in args])
    for a, e, wanted in zip(actual, expected, mask):
        if not wanted:
            assert a is None and e is None
        else:
            close(a, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape,groups", [((2, 6, 5), 3), ((3, 4, 2, 3), 2), ((2, 4, 3), 4)])
def test_group_norm_module_forward_backward(shape, groups, no_fallback):
    torch.manual_seed(2)
    cpu = torch.nn.GroupNorm(groups, shape[1])
    with torch.no_grad():
        cpu.weight.copy_(torch.randn(shape[1]))
        cpu.bias.copy_(torch.randn(shape[1]))
    tpu = torch.nn.GroupNorm(groups, shape[1])
    tpu.load_state_dict(cpu.state_dict())
    x = torch.randn(shape) * 2 - 1
    expected = module_forward_backward(cpu, x, "cpu")
    actual = module_forward_backward(tpu, x, "tpu")
    for a, e in zip(actual, expected):
        close(a, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("opinfo", ["nn.functional.layer_norm", "nn.functional.group_norm"])
def test_backward_over_opinfo_samples(opinfo, no_fallback):
    """Gradients of input, weight and bias over every OpInfo sample (those CPU accepts)."""
    info = find_opinfo(opinfo)
    checked = 0
    for sample in info.sample_inputs("cpu", torch.float32, requires_grad=True):
        cpu_leaves = [t for t in [sample.input, *sample.args, *sample.kwargs.values()]
                      if isinstance(t, torch.Tensor) and t.requires_grad]
        try:
            expected = info.op(sample.input, *sample.args, **sample.kwargs)
            grads = torch.autograd.grad(expected, cpu_leaves, torch.ones_like(expected) * 0.5 + expected.detach())
        except RuntimeError:
            continue  # CPU rejects it
        moved = {id(t): t.detach().to("tpu").requires_grad_(True) for t in cpu_leaves}

        def move(v):
            if isinstance(v, torch.Tensor):
                return moved.get(id(v), v.detach().to("tpu"))
            return v

        out = info.op(move(sample.input), *[move(a) for a in sample.args],
                      **{k: move(v) for k, v in sample.kwargs.items()})
        actual = torch.autograd.grad(out, [moved[id(t)] for t in cpu_leaves],
                                     (torch.ones_like(expected) * 0.5 + expected.detach()).to("tpu"))
        close(out.detach(), expected.detach(), atol=1e-5, rtol=1e-5)
        for a, e in zip(actual, grads):
            close(a, e, atol=1e-4, rtol=1e-4)
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_native_layer_norm_opinfo(dtype):
    # (out, mean, rstd). Not bfloat16: Meta (as CUDA) gives float32 mean/rstd for half-precision
    # input where CPU gives the input dtype; `out` is checked in bfloat16 by test_native_layer_norm.
    check_opinfo("native_layer_norm", dtype, overloads=["native_layer_norm"], variants=["Functional"],
                 atol=1e-5, rtol=1.3e-6, grad_atol=1e-4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_rms_norm_opinfo(dtype, no_fallback):
    # F.rms_norm is CompositeImplicitAutograd: on tpu it decomposes into pow, mean, add, rsqrt, mul
    # (ATen routes only CUDA/MPS/XPU to _fused_rms_norm), so it needs no spec of its own.
    check_opinfo("nn.functional.rms_norm", dtype, overloads=[], variants=["Functional"], atol=1e-5, rtol=1.3e-6)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 4), (2, 3, 2, 3, 2)])
def test_batch_norm_train_and_eval_match_cpu(shape, affine, no_fallback):
    """Training steps update running_mean/running_var in place as on CPU; eval uses them; grads match."""
    kind = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d, 5: torch.nn.BatchNorm3d}
    results = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        bn = kind[len(shape)](3, affine=affine, momentum=0.2)
        if affine:  # initialized on the CPU, so both devices start from the same weights
            with torch.no_grad():
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.5, 0.5)
        bn.to(device)
        gen = torch.Generator().manual_seed(1)
        outs = []
        for _ in range(2):
            x = (torch.randn(shape, generator=gen) * 2 + 1).to(device).requires_grad_()
            y = bn(x)
            (y * torch.arange(y.numel()).reshape(y.shape).to(device).float()).sum().backward()
            outs += [y.detach(), x.grad] + ([bn.weight.grad, bn.bias.grad] if affine else [])
        bn.eval()
        outs.append(bn(torch.randn(shape, generator=gen).to(device)))
        outs += [bn.running_mean, bn.running_var, bn.num_batches_tracked]
        results[device] = [t.cpu() for t in outs]
    for a, e in zip(results["tpu"], results["cpu"]):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)


def test_batch_norm_without_running_stats(no_fallback):
    for device in ("cpu", "tpu"):
        bn = torch.nn.BatchNorm2d(3, track_running_stats=False).to(device)
        x = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(2))
        y = bn(x.to(device))
        if device == "cpu":
            expected = y
    torch.testing.assert_close(y.cpu(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op", [torch.native_batch_norm, torch.ops.aten._native_batch_norm_legit])
def test_eval_batch_norm_saves_nothing_like_cpu(op, no_fallback):
    # In eval mode CPU returns empty save_mean/save_invstd (Meta sizes them [C]); so does tpu.
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(3))
    mean, var = torch.rand(3), torch.rand(3) + 0.5
    expected = op(x, None, None, mean.clone(), var.clone(), False, 0.1, 1e-5)
    actual = op(x.to("tpu"), None, None, mean.to("tpu"), var.to("tpu"), False, 0.1, 1e-5)
    assert [tuple(t.shape) for t in actual] == [tuple(t.shape) for t in expected] == [(2, 3, 4), (0,), (0,)]
    torch.testing.assert_close(actual[0].cpu(), expected[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dim", [0, -1, 2])
def test_weight_norm_forward_backward(dim, no_fallback):
    # nn.utils.parametrizations.weight_norm fuses dims 0 and last (aten::_weight_norm_interface and its
    # backward; wav2vec2's positional convolution uses the last); other dims compose from other specs.
    torch.manual_seed(0)
    conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(4, 6, 3), dim=dim)
    x = torch.randn(2, 4, 9)

    def run(device):
        module = copy.deepcopy(conv).to(device)
        inputs = x.to(device).requires_grad_(True)
        out = module(inputs)
        (out * torch.linspace(-1.0, 2.0, out.numel()).reshape(out.shape).to(device)).sum().backward()
        weight = module.parametrizations.weight
        return [out.detach(), inputs.grad, weight.original0.grad, weight.original1.grad, module.bias.grad]

    for actual, expected in zip(run("tpu"), run("cpu")):
        close(actual, expected, atol=1e-5, rtol=1e-5)
