"""scaled_dot_product_attention on tpu: the flash kernel (specs/nn.yaml) where it applies, math elsewhere,
CPU's values and gradients either way, in eager mode, torch.tpu.graph and torch.compile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import TPU

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


class OpsSeen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func)
        return func(*args, **(kwargs or {}))


def attention_inputs(dtype, heads=4, kv_heads=4, length=6, kv_length=6, size=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, length, size, generator=g, dtype=dtype)
    k = torch.randn(2, kv_heads, kv_length, size, generator=g, dtype=dtype)
    v = torch.randn(2, kv_heads, kv_length, size, generator=g, dtype=dtype)
    return q, k, v


def run(device, q, k, v, mask=None, **kwargs):
    """sdpa's result and the gradients of q, k, v for a fixed upstream gradient; the ops it dispatched."""
    leaves = [t.to(device).requires_grad_() for t in (q, k, v)]
    seen = OpsSeen()
    with seen:
        out = F.scaled_dot_product_attention(*leaves, attn_mask=None if mask is None else mask.to(device), **kwargs)
        upstream = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape).to(device)
        out.backward(upstream)
    return [t.detach().cpu() for t in (out, *(leaf.grad for leaf in leaves))], seen.ops


CASES = {
    "plain": {},
    "causal": {"is_causal": True},
    "scale": {"scale": 0.3},
    "causal_longer_keys": {"is_causal": True, "kv_length": 9},
    "float_mask": {"mask": "float"},
    "bool_mask": {"mask": "bool"},
    "grouped_heads": {"kv_heads": 2, "enable_gqa": True, "is_causal": True},
}


def case_inputs(name, dtype):
    case = dict(CASES[name])
    kv_length, kv_heads = case.pop("kv_length", 6), case.pop("kv_heads", 4)
    q, k, v = attention_inputs(dtype, kv_heads=kv_heads, kv_length=kv_length)
    mask = case.pop("mask", None)
    if mask == "float":  # [B, 1, L, S], one query row with every key masked (its result and gradients are 0)
        mask = torch.randn(2, 1, 6, kv_length, dtype=dtype)
        mask[1, 0, 2] = -float("inf")
    elif mask == "bool":
        mask = torch.rand(6, kv_length, generator=torch.Generator().manual_seed(1)) > 0.3
        mask[:, 0] = True
    return (q, k, v, mask), case


@pytest.mark.parametrize("name", list(CASES))
def test_float32_flash_matches_cpu(no_fallback, name):
    (q, k, v, mask), kwargs = case_inputs(name, torch.float32)
    got, ops = run(TPU, q, k, v, mask, **kwargs)
    want, cpu_ops = run("cpu", q, k, v, mask, **kwargs)
    assert FLASH in ops and FLASH_BACKWARD in ops
    assert FLASH in cpu_ops  # CPU takes the same kernel: the comparison is like for like
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1.3e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["causal", "float_mask", "grouped_heads"])
def test_half_flash_matches_cpu(no_fallback, name, dtype):
    (q, k, v, mask), kwargs = case_inputs(name, dtype)
    got, ops = run(TPU, q, k, v, mask, **kwargs)
    want, _ = run("cpu", q, k, v, mask, **kwargs)
    assert FLASH in ops and all(t.dtype == dtype for t in got)
    # float32 scores and sums on both; the products' operands are rounded to the half type on both,
    # CPU's in blocks with a running max: a few half ulps apart.
    tolerance = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 2e-3, "rtol": 2e-3}
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **tolerance)


def test_output_keeps_the_query_layout_and_logsumexp_is_float32(no_fallback):
    q, k, v = attention_inputs(torch.bfloat16)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # [B, L, H, E] in memory, as a model's projections give
    out, lse = FLASH(q.to(TPU), k.to(TPU), v.to(TPU))
    cpu_out, cpu_lse = FLASH(q, k, v)
    assert out.stride() == cpu_out.stride() and lse.stride() == cpu_lse.stride()
    assert lse.dtype == torch.float32
    torch.testing.assert_close(lse.cpu(), cpu_lse, atol=1e-2, rtol=1e-3)
    torch.testing.assert_close(out.cpu(), cpu_out, atol=2e-2, rtol=2e-2)


def test_math_where_flash_does_not_apply(no_fallback):
    q, k, v = attention_inputs(torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        for kwargs in ({"dropout_p": 0.5}, {"attn_mask": torch.zeros(6, 6, device=TPU, requires_grad=True)}):
            seen = OpsSeen()
            with seen:
                F.scaled_dot_product_attention(q.to(TPU), k.to(TPU), v.to(TPU), **kwargs)
            assert FLASH not in seen.ops, kwargs
        seen = OpsSeen()
        with seen, sdpa_kernel(SDPBackend.MATH):
            out = F.scaled_dot_product_attention(q.to(TPU), k.to(TPU), v.to(TPU), is_causal=True)
        assert FLASH not in seen.ops
        torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                   atol=1e-5, rtol=1.3e-6)


def test_flash_with_dropout_is_cpus_error(no_fallback):
    q, k, v = attention_inputs(torch.float32)
    with pytest.raises(RuntimeError, match="Currently do not support dropout > 0"):
        FLASH(q, k, v, dropout_p=0.5)
    with pytest.raises(RuntimeError, match="Currently do not support dropout > 0"):
        FLASH(q.to(TPU), k.to(TPU), v.to(TPU), dropout_p=0.5)[0].cpu()


def test_graph_and_compile_take_the_flash_kernel(no_fallback):
    q, k, v = attention_inputs(torch.float32, kv_heads=2)

    def step(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        return (out, *grads)

    leaves = [t.to(TPU).requires_grad_() for t in (q, k, v)]
    eager = [t.cpu() for t in step(*leaves)]
    compiled = [t.cpu() for t in torch.compile(step, backend="tpu")(*leaves)]
    graph = torch.tpu.TPUGraph()
    with torch.tpu.graph(graph):
        static = step(*leaves)
    graph.replay()
    replayed = [t.cpu() for t in static]
    want = step(*[t.requires_grad_() for t in (q, k, v)])
    for results in (eager, compiled, replayed):
        for a, b in zip(results, want):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1.3e-6)
