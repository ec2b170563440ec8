"""Results, views, copies, dtypes, promotion and errors on tpu equal PyTorch on the CPU."""

from __future__ import annotations

import pytest
import torch

from conftest import TPU, assert_equal_cpu


def tpu(t):
    return t.to("tpu")


def test_issue_demo_snippet():
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    w = torch.randn(8, 3)
    xt, wt = tpu(x), tpu(w)

    y = (x @ w).relu() + 1.5
    y[:, 0] = 0
    expected = y.sum(dim=0)

    yt = (xt @ wt).relu() + 1.5
    yt[:, 0] = 0
    actual = yt.sum(dim=0)

    assert_equal_cpu(yt, y)
    assert_equal_cpu(actual, expected)


# ----------------------------------------------------------------------------------------------
# Views see writes


def test_write_through_transpose_view():
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    bt = tpu(base)
    v, vt = base.t(), bt.t()
    v[1, 2] = 100.0
    vt[1, 2] = 100.0
    v.mul_(2)
    vt.mul_(2)
    assert_equal_cpu(bt, base, exact=True)
    assert_equal_cpu(vt, v, exact=True)
    assert not vt.is_contiguous()


def test_write_through_step_slice():
    base = torch.arange(10, dtype=torch.float32)
    bt = tpu(base)
    base[1::3] = -1.0
    bt[1::3] = -1.0
    base[::2].add_(10)
    bt[::2].add_(10)
    assert_equal_cpu(bt, base, exact=True)


def test_write_through_select():
    base = torch.zeros(3, 4)
    bt = tpu(base)
    base.select(1, 2).fill_(5.0)
    bt.select(1, 2).fill_(5.0)
    base[0].zero_()
    bt[0].zero_()
    base[2][3] = 7.0
    bt[2][3] = 7.0
    assert_equal_cpu(bt, base, exact=True)


def test_expand_sees_source_writes():
    src = torch.tensor([[1.0], [2.0], [3.0]])
    st = tpu(src)
    e, et = src.expand(3, 4), st.expand(3, 4)
    src.mul_(10)
    st.mul_(10)
    assert_equal_cpu(et, e, exact=True)
    assert et.stride() == e.stride()
    assert_equal_cpu(et.sum(dim=1), e.sum(dim=1))


def test_inplace_add_on_noncontiguous_view():
    base = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    bt = tpu(base)
    v, vt = base.permute(2, 0, 1)[1:3], bt.permute(2, 0, 1)[1:3]
    assert not vt.is_contiguous()
    other = torch.full((2, 2, 3), 0.5)
    v.add_(other, alpha=2)
    vt.add_(tpu(other), alpha=2)
    assert_equal_cpu(bt, base, exact=True)
    assert_equal_cpu(vt, v, exact=True)


def test_out_into_view():
    base = torch.zeros(4, 6)
    bt = tpu(base)
    a = torch.randn(3, 4)
    b = torch.randn(4, 3)
    out_v = base[:, ::2]  # non-contiguous 4x3 view
    out_vt = bt[:, ::2]
    torch.add(a.t(), b, out=out_v)
    torch.add(tpu(a).t(), tpu(b), out=out_vt)
    assert_equal_cpu(bt, base)
    # mm with out= into a transposed view
    base2 = torch.zeros(3, 4)
    bt2 = tpu(base2)
    o, ot = base2.t(), bt2.t()  # 4x3 view
    torch.mm(b, torch.eye(3), out=o)
    torch.mm(tpu(b), tpu(torch.eye(3)), out=ot)
    assert_equal_cpu(bt2, base2)


def test_view_metadata_and_shared_storage():
    base = torch.arange(24, dtype=torch.float32)
    bt = tpu(base)
    views = [
        lambda t: t.view(4, 6),
        lambda t: t.reshape(2, 3, 4),
        lambda t: t.view(4, 6).transpose(0, 1),
        lambda t: t.view(2, 3, 4).permute(2, 0, 1),
        lambda t: t.view(4, 6)[1:3, ::2],
        lambda t: t.view(4, 6).select(0, 2),
        lambda t: t.as_strided((3, 3), (5, 2), 1),
        lambda t: t.view(4, 6).t(),
        lambda t: t.unsqueeze(0).unsqueeze(2),
        lambda t: t[:4].expand(3, 4),
    ]
    for make in views:
        vc, vt = make(base), make(bt)
        assert vt.shape == vc.shape and vt.stride() == vc.stride()
        assert vt.storage_offset() == vc.storage_offset()
        assert vt.untyped_storage().data_ptr() == bt.untyped_storage().data_ptr()
        assert_equal_cpu(vt, vc, exact=True)
    # Write through one view, read through another.
    base.view(4, 6).t()[2, 1] = -5.0
    bt.view(4, 6).t()[2, 1] = -5.0
    assert_equal_cpu(bt.as_strided((3, 3), (5, 2), 1), base.as_strided((3, 3), (5, 2), 1), exact=True)
    assert_equal_cpu(bt, base, exact=True)


# ----------------------------------------------------------------------------------------------
# Copies


def test_noncontiguous_copy_cpu_to_tpu():
    src = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    dst = torch.zeros(5, 4)
    dt = tpu(dst)
    dst.copy_(src.t())
    dt.copy_(src.t())  # cpu non-contiguous -> tpu
    assert_equal_cpu(dt, dst, exact=True)
    # cpu contiguous -> strided tpu destination
    dst2 = torch.zeros(4, 10)
    dt2 = tpu(dst2)
    dst2[:, ::2].copy_(src)
    dt2[:, ::2].copy_(src)
    assert_equal_cpu(dt2, dst2, exact=True)


def test_noncontiguous_copy_tpu_to_cpu():
    src = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    st = tpu(src)
    out = torch.zeros(4, 3, 2)
    out.copy_(st.permute(2, 1, 0))
    assert torch.equal(out, src.permute(2, 1, 0))
    out2 = torch.zeros(3, 8)
    out2[:, 1::2].copy_(st[1])
    ref = torch.zeros(3, 8)
    ref[:, 1::2].copy_(src[1])
    assert torch.equal(out2, ref)
    assert torch.equal(st.permute(2, 1, 0).cpu(), src.permute(2, 1, 0))
    assert torch.equal(st[:, ::2, 1::2].cpu(), src[:, ::2, 1::2])


def test_transposed_source_into_strided_destination_tpu_to_tpu():
    src = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    dst = torch.full((4, 6), -1.0)
    st, dt = tpu(src), tpu(dst)
    dst[:, ::2].copy_(src.t())
    dt[:, ::2].copy_(st.t())
    assert_equal_cpu(dt, dst, exact=True)
    # tpu -> tpu contiguous
    c = torch.empty(3, 4, device="tpu")
    c.copy_(st)
    assert_equal_cpu(c, src, exact=True)


def test_copy_chain_across_dtypes():
    src = torch.tensor([[-2.75, 0.0, 1.5], [3.25, -0.5, 7.0]])
    chain = [torch.bfloat16, torch.float16, torch.int64, torch.bool]
    cur_c, cur_t = src, tpu(src)
    for dtype in chain:
        nxt_c = torch.empty(cur_c.shape[::-1], dtype=dtype).t()  # non-contiguous destination
        nxt_t = torch.empty(cur_c.shape[::-1], dtype=dtype, device="tpu").t()
        nxt_c.copy_(cur_c)
        nxt_t.copy_(cur_t)
        assert_equal_cpu(nxt_t, nxt_c, exact=True)
        cur_c, cur_t = nxt_c, nxt_t
    for dtype in reversed([torch.float32] + chain[:-1]):
        nxt_c = torch.empty(cur_c.shape, dtype=dtype)
        nxt_t = torch.empty(cur_c.shape, dtype=dtype, device="tpu")
        nxt_c.copy_(cur_c)
        nxt_t.copy_(cur_t)
        assert_equal_cpu(nxt_t, nxt_c, exact=True)
        cur_c, cur_t = nxt_c, nxt_t


def test_copy_across_dtypes_between_devices():
    src = torch.tensor([1.9, -2.6, 0.0, 300.7])
    for dtype in [torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool]:
        d = torch.empty(4, dtype=dtype, device="tpu")
        d.copy_(src)  # cpu float32 -> tpu other dtype
        assert_equal_cpu(d, src.to(dtype), exact=True)
        back = torch.empty(4, dtype=torch.float32)
        back.copy_(d)  # tpu other dtype -> cpu float32
        assert torch.equal(back, src.to(dtype).to(torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32,
                                   torch.bool])
def test_dtype_round_trip_exact(dtype):
    torch.manual_seed(1)
    if dtype == torch.bool:
        cpu = torch.rand(3, 5) > 0.5
    elif dtype.is_floating_point:
        cpu = (torch.randn(3, 5) * 100).to(dtype)
        cpu[0, 0] = float("inf")
        cpu[0, 1] = float("-inf")
        cpu[0, 2] = -0.0
    else:
        cpu = torch.randint(torch.iinfo(dtype).min, torch.iinfo(dtype).max, (3, 5), dtype=dtype)
    t = tpu(cpu)
    assert t.dtype == dtype
    back = t.cpu()
    assert back.dtype == dtype
    assert torch.equal(back, cpu)
    if dtype.is_floating_point:
        assert torch.equal(torch.signbit(back), torch.signbit(cpu))
    # through a device-side clone as well
    assert torch.equal(t.clone().cpu(), cpu)


@pytest.mark.parametrize("src,dst", [
    (torch.float32, torch.bfloat16), (torch.float32, torch.float16), (torch.float32, torch.int64),
    (torch.float32, torch.int32), (torch.float32, torch.bool), (torch.int64, torch.float32),
    (torch.bool, torch.float32), (torch.int32, torch.int64), (torch.bfloat16, torch.float16),
])
def test_to_dtype_on_device(src, dst):
    cpu = torch.tensor([[-3.7, 0.0, 2.5], [1.0, 126.9, -0.2]]).to(src)
    assert_equal_cpu(tpu(cpu).to(dst), cpu.to(dst), exact=True)


# ----------------------------------------------------------------------------------------------
# Promotion and broadcasting


@pytest.mark.parametrize("make", [
    lambda: (torch.arange(6, dtype=torch.int64).reshape(2, 3), torch.randn(2, 3)),
    lambda: (torch.arange(6, dtype=torch.int32).reshape(2, 3), torch.randn(3)),
    lambda: (torch.tensor([True, False, True]), torch.tensor([1, 2, 3])),
    lambda: (torch.randn(2, 3).half(), torch.randn(2, 3)),
    lambda: (torch.randn(2, 3).bfloat16(), torch.randn(2, 3).half()),
    lambda: (torch.randn(4, 1, 3), torch.randn(2, 1)),
    lambda: (torch.tensor([1, 2, 3], dtype=torch.int32), torch.tensor(2.5)),  # 0-d float wins
    lambda: (torch.randn(3).half(), torch.tensor(2.0, dtype=torch.float64)),  # 0-d same category
], ids=["int64+f32", "int32+f32bcast", "bool+int", "f16+f32", "bf16+f16", "bcast3d", "int+0d", "f16+0d"])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "eq", "lt"])
def test_binary_promotion_and_broadcast(make, op):
    a, b = make()
    fn = getattr(torch, op)
    if op == "sub" and (a.dtype == torch.bool or b.dtype == torch.bool):
        # Subtracting bools is an error on the CPU; the tpu must raise the same error.
        with pytest.raises(RuntimeError) as cpu_err:
            fn(a, b)
        with pytest.raises(RuntimeError) as tpu_err:
            fn(tpu(a), tpu(b))
        assert str(tpu_err.value) == str(cpu_err.value)
        return
    expected = fn(a, b)
    actual = fn(tpu(a), tpu(b))
    assert_equal_cpu(actual, expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("scalar", [2.5, 3, True, -1])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float16, torch.bool, torch.float32])
@pytest.mark.parametrize("op", ["add", "mul", "div"])
def test_tensor_python_scalar_promotion(dtype, scalar, op):
    cpu = torch.tensor([[0, 1, 2], [3, 4, 5]]).to(dtype)
    fn = getattr(torch, op)
    expected = fn(cpu, scalar)
    actual = fn(tpu(cpu), scalar)
    assert_equal_cpu(actual, expected, rtol=1e-3, atol=1e-3)


def test_operator_forms_promote_like_cpu():
    i = torch.tensor([1, 2, 3])
    f = torch.tensor([0.5, 1.5, 2.5])
    it, ft = tpu(i), tpu(f)
    assert_equal_cpu(it + ft, i + f)
    assert_equal_cpu(it + 1.5, i + 1.5)
    assert_equal_cpu(it / 2, i / 2)
    assert_equal_cpu(2 - it, 2 - i)
    assert_equal_cpu(-it, -i)
    assert_equal_cpu(it.add(it, alpha=3), i.add(i, alpha=3))
    assert_equal_cpu(ft.sub(ft * 2, alpha=0.5), f.sub(f * 2, alpha=0.5))


def test_inplace_promotion_keeps_dtype():
    f = torch.tensor([1.0, 2.0, 3.0])
    ft = tpu(f)
    f.add_(torch.tensor([1, 2, 3]))
    ft.add_(tpu(torch.tensor([1, 2, 3])))
    assert_equal_cpu(ft, f)
    h = torch.tensor([1.0, 2.0], dtype=torch.float16)
    ht = tpu(h)
    h.mul_(torch.tensor([3.0, 0.5]))
    ht.mul_(tpu(torch.tensor([3.0, 0.5])))
    assert_equal_cpu(ht, h, exact=True)


def test_unary_ops_match_cpu():
    cpu = torch.tensor([[0.5, 1.0, 4.0], [2.25, 9.0, 0.01]])
    t = tpu(cpu)
    for name in ["neg", "exp", "log", "sqrt", "relu"]:
        assert_equal_cpu(getattr(torch, name)(t), getattr(torch, name)(cpu))
    signed = torch.tensor([-1.5, 0.0, 2.0])
    assert_equal_cpu(torch.relu(tpu(signed)), torch.relu(signed))
    # int input promotes to float for exp
    i = torch.tensor([0, 1, 2])
    assert_equal_cpu(torch.exp(tpu(i)), torch.exp(i))
    assert_equal_cpu(torch.neg(tpu(i)), torch.neg(i))


def test_where_matches_cpu():
    cond = torch.tensor([[True, False, True], [False, False, True]])
    a = torch.randn(2, 3)
    b = torch.tensor([1, 2, 3])
    assert_equal_cpu(torch.where(tpu(cond), tpu(a), tpu(b)), torch.where(cond, a, b))
    assert_equal_cpu(torch.where(tpu(a) > 0, tpu(a), tpu(a) * 2),
                     torch.where(a > 0, a, a * 2))


def test_addmm_and_mm_match_cpu():
    torch.manual_seed(2)
    m, a, b = torch.randn(3, 5), torch.randn(3, 4), torch.randn(4, 5)
    assert_equal_cpu(torch.mm(tpu(a), tpu(b)), torch.mm(a, b))
    assert_equal_cpu(torch.addmm(tpu(m), tpu(a), tpu(b), beta=0.5, alpha=2.0),
                     torch.addmm(m, a, b, beta=0.5, alpha=2.0))
    bias = torch.randn(5)
    assert_equal_cpu(torch.addmm(tpu(bias), tpu(a), tpu(b)), torch.addmm(bias, a, b))
    # mm of non-contiguous operands
    assert_equal_cpu(torch.mm(tpu(b).t(), tpu(a).t()), torch.mm(b.t(), a.t()))


# ----------------------------------------------------------------------------------------------
# out= and errors equal to CPU


def test_out_resized_like_cpu():
    a = torch.randn(3, 4)
    b = torch.randn(4)
    o = torch.empty(2)
    ot = torch.empty(2, device="tpu")
    torch.add(a, b, out=o)
    torch.add(tpu(a), tpu(b), out=ot)
    assert ot.shape == o.shape == (3, 4)
    assert_equal_cpu(ot, o)
    # zero-size out
    o0 = torch.empty(0)
    ot0 = torch.empty(0, device="tpu")
    torch.mul(a, 2.0, out=o0)
    torch.mul(tpu(a), 2.0, out=ot0)
    assert_equal_cpu(ot0, o0)


def _error_message(fn):
    with pytest.raises(Exception) as info:
        fn()
    return info.type, str(info.value)


def test_inplace_invalid_result_dtype_same_error_as_cpu():
    i = torch.tensor([1, 2, 3])
    f = torch.tensor([0.5, 0.5, 0.5])
    cpu_type, cpu_msg = _error_message(lambda: i.clone().add_(f))
    tpu_type, tpu_msg = _error_message(lambda: tpu(i).add_(tpu(f)))
    assert tpu_type is cpu_type
    assert tpu_msg == cpu_msg


def test_shape_mismatch_same_error_as_cpu():
    cpu_type, cpu_msg = _error_message(lambda: torch.randn(2, 3) + torch.randn(4))
    tpu_type, tpu_msg = _error_message(lambda: torch.randn(2, 3, device="tpu") + torch.randn(4, device="tpu"))
    assert cpu_type is RuntimeError
    assert tpu_type is RuntimeError
    assert tpu_msg == cpu_msg


def test_mm_shape_mismatch_same_error_as_cpu():
    a, b = torch.randn(2, 3), torch.randn(4, 5)
    cpu_type, cpu_msg = _error_message(lambda: torch.mm(a, b))
    tpu_type, tpu_msg = _error_message(lambda: torch.mm(tpu(a), tpu(b)))
    assert cpu_type is RuntimeError and tpu_type is RuntimeError
    assert tpu_msg == cpu_msg


# ----------------------------------------------------------------------------------------------
# Edge shapes, cat, reductions


def test_empty_tensors():
    e = torch.empty(0, 3)
    et = tpu(e)
    assert et.numel() == 0
    assert_equal_cpu(et + 1, e + 1)
    assert_equal_cpu(et + tpu(torch.ones(3)), e + torch.ones(3))
    assert_equal_cpu(et.sum(), e.sum())
    assert_equal_cpu(et.sum(dim=0), e.sum(dim=0))
    assert_equal_cpu(et.sum(dim=1), e.sum(dim=1))
    x = torch.randn(2, 3)
    assert_equal_cpu(torch.cat([et, tpu(x)]), torch.cat([e, x]))
    assert_equal_cpu(torch.cat([et, et], dim=1), torch.cat([e, e], dim=1))
    assert et.tolist() == []


def test_zero_dim_tensor():
    s = torch.tensor(2.5)
    st = tpu(s)
    assert st.dim() == 0 and st.shape == ()
    assert_equal_cpu(st * 2 + 1, s * 2 + 1)
    assert_equal_cpu(st + tpu(torch.ones(2, 2)), s + torch.ones(2, 2))
    assert_equal_cpu(torch.exp(st), torch.exp(s))
    assert_equal_cpu(st.sum(), s.sum())
    st.add_(1)
    s.add_(1)
    assert st.item() == s.item()
    assert_equal_cpu(torch.tensor([1.0, 2.0]).to("tpu").sum(), torch.tensor(3.0))


def test_synchronize_after_work():
    x = tpu(torch.randn(8, 8))
    y = x
    for _ in range(5):
        y = y @ x * 0.1
    torch.tpu.synchronize()
    xc = x.cpu()
    yc = xc
    for _ in range(5):
        yc = yc @ xc * 0.1
    assert_equal_cpu(y, yc, rtol=1e-4, atol=1e-5)


def test_cat_mixed_dtypes():
    parts = [torch.tensor([[1, 2]], dtype=torch.int32), torch.tensor([[0.5, 1.5]]),
             torch.tensor([[1.0, 2.0]], dtype=torch.float16)]
    expected = torch.cat(parts)
    actual = torch.cat([tpu(p) for p in parts])
    assert_equal_cpu(actual, expected)
    b = [torch.tensor([True, False]), torch.tensor([3, 4])]
    assert_equal_cpu(torch.cat([tpu(p) for p in b]), torch.cat(b))


def test_cat_dims_and_noncontiguous():
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    b = torch.arange(4, dtype=torch.float32).reshape(2, 2)
    assert_equal_cpu(torch.cat([tpu(a), tpu(b)], dim=1), torch.cat([a, b], dim=1))
    assert_equal_cpu(torch.cat([tpu(a).t(), tpu(a).t()], dim=-1), torch.cat([a.t(), a.t()], dim=-1))
    o, ot = torch.empty(0), torch.empty(0, device="tpu")
    torch.cat([a, a], out=o)
    torch.cat([tpu(a), tpu(a)], out=ot)
    assert_equal_cpu(ot, o)


@pytest.mark.parametrize("src", [torch.int32, torch.int64, torch.bool, torch.float16, torch.float32])
@pytest.mark.parametrize("dtype", [None, torch.float32, torch.int64, torch.float16])
def test_sum_with_dtype(src, dtype):
    cpu = torch.tensor([[1, 0, 3], [4, 5, 0]]).to(src)
    t = tpu(cpu)
    kw = {} if dtype is None else {"dtype": dtype}
    assert_equal_cpu(t.sum(**kw), cpu.sum(**kw))
    assert_equal_cpu(t.sum(dim=1, **kw), cpu.sum(dim=1, **kw))
    assert_equal_cpu(torch.sum(t, dim=(0, 1), keepdim=True, **kw), torch.sum(cpu, dim=(0, 1), keepdim=True, **kw))


def test_mean_and_sum_all():
    torch.manual_seed(3)
    cpu = torch.randn(2, 3, 4)
    t = tpu(cpu)
    assert_equal_cpu(t.mean(), cpu.mean())
    assert_equal_cpu(t.sum(), cpu.sum())
    assert_equal_cpu(t.permute(2, 0, 1).mean(), cpu.permute(2, 0, 1).mean())


@pytest.mark.parametrize("dims", [0, 1, -1, (0, 2), (1, 2), (0, 1, 2)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_mean_and_sum_over_dims(dims, keepdim):
    torch.manual_seed(3)
    cpu = torch.randn(2, 3, 4)
    t = tpu(cpu)
    assert_equal_cpu(t.mean(dim=dims, keepdim=keepdim), cpu.mean(dim=dims, keepdim=keepdim))
    assert_equal_cpu(t.sum(dim=dims, keepdim=keepdim), cpu.sum(dim=dims, keepdim=keepdim))
    # and on a non-contiguous input
    assert_equal_cpu(t.transpose(0, 2).mean(dim=dims, keepdim=keepdim),
                     cpu.transpose(0, 2).mean(dim=dims, keepdim=keepdim))


def test_mean_with_dtype():
    cpu = torch.tensor([[1.0, 2.0], [3.0, 4.5]], dtype=torch.float16)
    assert_equal_cpu(tpu(cpu).mean(dim=0, dtype=torch.float32), cpu.mean(dim=0, dtype=torch.float32))


def test_fill_zero_clone():
    cpu = torch.randn(3, 4)
    t = tpu(cpu)
    c = t.clone()
    t.fill_(2.5)
    cpu2 = cpu.clone()
    cpu.fill_(2.5)
    assert_equal_cpu(t, cpu)
    assert_equal_cpu(c, cpu2)  # clone is independent of later writes
    t[:, 1].zero_()
    cpu[:, 1].zero_()
    assert_equal_cpu(t, cpu)
    i = torch.zeros(3, dtype=torch.int64, device="tpu").fill_(7)
    assert i.tolist() == [7, 7, 7]
    assert_equal_cpu(tpu(cpu).t().clone(), cpu.t().clone())
    assert tpu(cpu).t().clone(memory_format=torch.preserve_format).stride() == cpu.t().clone().stride()


def test_empty_is_lazy_and_writable():
    e = torch.empty(3, 4, device="tpu")
    assert e.shape == (3, 4) and e.device.type == "tpu"
    e.copy_(torch.ones(3, 4))
    assert torch.equal(e.cpu(), torch.ones(3, 4))
    f = torch.empty(5, device="tpu", dtype=torch.int32)
    f.zero_()
    assert f.cpu().tolist() == [0] * 5


def test_nan_propagates_like_cpu():
    # XLA's CPU maximum/minimum drop NaN; PyTorch's ops keep it.
    x = torch.tensor([float("nan"), -1.0, 2.0, float("inf"), -float("inf")])
    t = x.to("tpu")
    for fn in (torch.relu, lambda v: torch.maximum(v, torch.zeros_like(v)), lambda v: v.clamp(-0.5, 0.5),
               torch.nn.functional.hardtanh, lambda v: v.amax(), lambda v: v.max(), lambda v: v.argmax(),
               lambda v: torch.softmax(v, 0)):
        torch.testing.assert_close(fn(t).cpu(), fn(x), equal_nan=True)


def test_foreach_writes_into_views_of_one_storage_build_on_each_other():
    # FSDP2 copies every shard into views of one all-gather buffer with one _foreach_copy_.
    results = []
    for device in ("cpu", "tpu"):
        buffer = torch.zeros(12, device=device)
        first, second = torch.split(buffer.narrow(0, 6, 6), [4, 2])
        torch._foreach_copy_([first, second], [torch.arange(4.0, device=device), torch.arange(2.0, device=device) + 10])
        results.append(buffer.cpu())
    torch.testing.assert_close(results[1], results[0])


def test_storage_resize_frees_and_regrows_like_cpu():
    # FSDP2 frees unsharded parameters by resizing their storages to 0 and regrows them in place.
    results = []
    for device in ("cpu", "tpu"):
        p = torch.arange(12.0).view(3, 4).to(device)
        flat = p.view(12)
        p.untyped_storage().resize_(0)
        assert p.untyped_storage().nbytes() == 0
        p.untyped_storage().resize_(12 * 4)
        p.copy_(torch.arange(12.0).view(3, 4).to(device) * 2)
        p.untyped_storage().resize_(8 * 4)  # shrinking keeps what fits
        results.append(flat[:8].cpu())
    torch.testing.assert_close(results[1], results[0])


def test_zeros_are_lazy_storages_that_read_as_zeros():
    # A never-written storage reads as zeros, so zeros run nothing until a module reads them.
    from conftest import metrics

    before = metrics()["executions"]
    made = [torch.zeros(3, 4, device="tpu"), torch.zeros_like(torch.empty(2, device="tpu"), dtype=torch.int64),
            torch.empty(1, device="tpu").new_zeros(5), torch.zeros(2, dtype=torch.bool, device="tpu")]
    assert metrics()["executions"] == before
    for t in made:
        assert_equal_cpu(t, torch.zeros(t.shape, dtype=t.dtype), exact=True)
    on_cpu = torch.zeros_like(made[0], device="cpu")
    assert on_cpu.device.type == "cpu" and not on_cpu.any()
    grown = torch.zeros(3, device="tpu").add_(2)
    assert_equal_cpu(grown, torch.full((3,), 2.0), exact=True)


def test_views_with_another_element_width_read_and_write_the_storage_bytes():
    base_cpu = torch.tensor([[1.5, -2.0, 3.25, 0.0], [7.0, 1e-3, -0.5, 2.0]])
    base = base_cpu.to(TPU)
    as_bytes = base.view(torch.uint8)           # f32 storage seen as bytes: (2, 16)
    assert as_bytes.shape == (2, 16)
    assert torch.equal(as_bytes.cpu(), base_cpu.view(torch.uint8))
    as_halves = base.view(torch.int16)[:, 2:6]  # a narrower strided view
    assert torch.equal(as_halves.cpu(), base_cpu.view(torch.int16)[:, 2:6])
    # Writing through the byte view changes the floats that own those bytes.
    as_bytes[1, 4:8] = torch.tensor([0, 0, 128, 63], dtype=torch.uint8).to(TPU)  # 1.0f, little-endian
    expected = base_cpu.clone()
    expected.view(torch.uint8)[1, 4:8] = torch.tensor([0, 0, 128, 63], dtype=torch.uint8)
    assert torch.equal(base.cpu(), expected) and base.cpu()[1, 1] == 1.0
    # A byte storage seen as wider elements.
    raw = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(raw.to(TPU).view(torch.int32).cpu(), raw.view(torch.int32))
    flags = torch.tensor([True, False, True, True])
    assert torch.equal(flags.to(TPU).view(torch.uint8).cpu(), flags.view(torch.uint8))


def test_save_and_load_of_tpu_tensors(tmp_path):
    torch.manual_seed(0)
    weight = torch.randn(3, 5).to(TPU)
    state = {"weight": weight, "row": weight[1], "steps": torch.tensor([3, 1], device=TPU),
             "mask": torch.tensor([True, False], device=TPU), "half": torch.randn(4).to(torch.bfloat16).to(TPU)}
    path = tmp_path / "state.pt"
    torch.save(state, path)
    loaded = torch.load(path)
    for key, value in state.items():
        assert loaded[key].device == value.device and loaded[key].dtype == value.dtype, key
        assert torch.equal(loaded[key].cpu(), value.cpu()), key
    # A view saved with its base still shares the base's storage after loading.
    loaded["weight"][1, 0] = 42.0
    assert loaded["row"].cpu()[0] == 42.0
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu["weight"].device.type == "cpu" and torch.equal(on_cpu["weight"], weight.cpu())
    # A model's state dict round-trips through a file into a fresh model on tpu.
    model = torch.nn.Linear(5, 2).to(TPU)
    torch.save(model.state_dict(), tmp_path / "model.pt")
    fresh = torch.nn.Linear(5, 2).to(TPU)
    fresh.load_state_dict(torch.load(tmp_path / "model.pt"))
    x = torch.randn(4, 5)
    assert torch.equal(fresh(x.to(TPU)).cpu(), model(x.to(TPU)).cpu())


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int32, torch.int64])
def test_shift_operators_match_cpu(dtype, no_fallback):
    """x << n, x >> n, <<= and >>= (aten::__lshift__ and friends, not bitwise_*_shift), by tensors and
    by numbers, including shifts past the width."""
    cpu = torch.tensor([0, 1, 3, 7, 100, 127], dtype=dtype)
    if dtype.is_signed:
        cpu = torch.cat([cpu, -cpu])
    amounts = torch.arange(cpu.numel(), dtype=dtype) % 9
    t, n = tpu(cpu), tpu(amounts)
    assert_equal_cpu(t << n, cpu << amounts, exact=True)
    assert_equal_cpu(t >> n, cpu >> amounts, exact=True)
    assert_equal_cpu(t << 3, cpu << 3, exact=True)
    assert_equal_cpu(t >> 2, cpu >> 2, exact=True)
    ref, out = cpu.clone(), t.clone()
    ref <<= 2
    out <<= 2
    assert_equal_cpu(out, ref, exact=True)
    ref >>= amounts
    out >>= n
    assert_equal_cpu(out, ref, exact=True)


def test_isin_and_bucketize_of_a_number(no_fallback):
    """torch.isin(2, t) and torch.bucketize(2, boundaries): a Python number against a tpu tensor."""
    cpu = torch.tensor([1, 4, 2, 9])
    boundaries = torch.tensor([1.0, 2.5, 3.0, 8.0])
    assert_equal_cpu(torch.isin(2, tpu(cpu)), torch.isin(2, cpu), exact=True)
    assert_equal_cpu(torch.isin(3, tpu(cpu), invert=True), torch.isin(3, cpu, invert=True), exact=True)
    for value, right, int32 in ((2.7, False, False), (3, True, True), (0.5, False, True)):
        assert_equal_cpu(torch.bucketize(value, tpu(boundaries), right=right, out_int32=int32),
                         torch.bucketize(value, boundaries, right=right, out_int32=int32), exact=True)


def test_histogram_matches_cpu(no_fallback):
    """torch.histogram: the data's range, a given range (ends that meet widen by 0.5), weights, density,
    explicit edges (the top edge closes the last bin; outside them nothing counts), empty data, out=."""
    torch.manual_seed(0)
    x = torch.randn(40)
    with_nan = x.clone()
    with_nan[3] = float("nan")  # counts nowhere (without a range, CPU refuses NaN data)
    weight = torch.rand(40)
    cases = [((x, 7), {}), ((with_nan, 5), {"range": (-1.0, 1.0)}), ((x, 4), {"range": (0.5, 0.5)}),
             ((x, 6), {"weight": weight, "density": True}), ((torch.tensor([2.0, 2.0]), 4), {}),
             ((torch.zeros(0), 3), {"density": True}), ((x.double(), 3), {}),
             ((with_nan, torch.tensor([-1.0, -0.25, 0.0, 2.0])), {"weight": weight}),
             ((torch.tensor([0.0, 1.5, 2.0, 9.0, 10.0]), torch.tensor([0.0, 1.5, 2.0, 10.0])), {"density": True})]
    for (data, bins), kwargs in cases:
        expected = torch.histogram(data, bins, **kwargs)
        moved = {k: tpu(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        actual = torch.histogram(tpu(data), tpu(bins) if isinstance(bins, torch.Tensor) else bins, **moved)
        assert_equal_cpu(actual.hist, expected.hist)
        assert_equal_cpu(actual.bin_edges, expected.bin_edges)
    hist, edges = torch.empty(0, device=TPU), torch.empty(0, device=TPU)
    torch.histogram(tpu(x), 5, out=(hist, edges))
    assert_equal_cpu(hist, torch.histogram(x, 5).hist)
    assert_equal_cpu(edges, torch.histogram(x, 5).bin_edges)


@pytest.mark.parametrize("call", [lambda x: torch.histogram(x, 0), lambda x: torch.histogram(x, 3, range=(2.0, 1.0)),
                                  lambda x: torch.histogram(x, 3, weight=torch.ones(4, device=x.device)),
                                  lambda x: torch.histogram(x, torch.tensor([0.0, 1.0], dtype=torch.float64,
                                                                            device=x.device))])
def test_histogram_errors_read_as_on_cpu(call):
    x = torch.randn(5)
    with pytest.raises(RuntimeError) as on_cpu:
        call(x)
    with pytest.raises(RuntimeError) as on_tpu:
        call(tpu(x))
    assert str(on_cpu.value) in str(on_tpu.value)


def test_mode_ties_and_positions(no_fallback):
    """torch.mode: the smallest of equally frequent values, at its last position, along any dim."""
    rows = torch.tensor([[3.0, 1.0, 3.0, 1.0, 2.0], [5.0, 2.0, 2.0, 5.0, 5.0], [1.0, 2.0, 3.0, 4.0, 0.0]])
    for data, dim in ((rows, 1), (rows, 0), (rows.to(torch.int32), -1), (rows > 2, 1), (torch.tensor(4.0), 0)):
        expected = torch.mode(data, dim)
        actual = torch.mode(tpu(data), dim)
        assert_equal_cpu(actual.values, expected.values, exact=True)
        assert_equal_cpu(actual.indices, expected.indices, exact=True)
    # Long rows: CPU's index among many equal values is wherever its unstable sort left one; any
    # position holding the mode is right.
    data = torch.randint(-4, 5, (3, 200), dtype=torch.int16)
    expected, actual = torch.mode(data, 1), torch.mode(tpu(data), 1)
    assert_equal_cpu(actual.values, expected.values, exact=True)
    assert torch.equal(data.gather(1, actual.indices.cpu()[:, None])[:, 0], expected.values)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.0])
def test_segment_reduce_and_gradient(reduce, initial, no_fallback):
    # Empty segments, a zero and a NaN (prod's gradient takes the product of the others there), ties
    # (max/min share the gradient), lengths and offsets, and a batched axis.
    data = torch.tensor([1.0, 2.0, 0.0, 3.0, float("nan"), 4.0, 5.0, 5.0, 0.0, -1.5])
    lengths = torch.tensor([0, 2, 2, 1, 3, 0, 2])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    batched = torch.randn(3, 6, 2, generator=torch.Generator().manual_seed(0))
    batched[1, 2, 0] = 0.0
    batched_lengths = torch.tensor([[2, 0, 4], [1, 3, 2], [6, 0, 0]])
    cases = [(data, {"lengths": lengths}), (data, {"offsets": offsets}), (batched, {"lengths": batched_lengths, "axis": 1})]
    for x, kwargs in cases:
        def run(device):
            xd = x.to(device).requires_grad_()
            args = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            out = torch.segment_reduce(xd, reduce, initial=initial, **args)
            seed = torch.linspace(-1.0, 2.0, out.numel()).reshape(out.shape).to(device)
            (grad,) = torch.autograd.grad(out, xd, seed)
            return out, grad
        (actual, actual_grad), (expected, expected_grad) = run(TPU), run("cpu")
        assert_equal_cpu(actual.detach(), expected.detach(), atol=1e-6, rtol=1e-6)
        assert_equal_cpu(actual_grad, expected_grad, atol=1e-6, rtol=1e-6)


# 64-bit integer division is a loop of its own (XLA's took libtpu 5-30 s to compile per shape):
# exact at the extremes, for every rounding, with broadcasting, as on CPU.
INT64_DIVISIONS = {
    "fmod": torch.fmod,
    "remainder": torch.remainder,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "floor_divide": torch.floor_divide,
}


@pytest.mark.parametrize("name", sorted(INT64_DIVISIONS))
def test_int64_division_is_exact_at_the_extremes(name):
    op = INT64_DIVISIONS[name]
    big, g = 2 ** 63 - 1, torch.Generator().manual_seed(0)
    a = torch.tensor([[-big - 1, -big, big, 2 ** 62 + 1, -(2 ** 40) - 3, 0, 7, -7, 1, -1]], dtype=torch.int64)
    b = torch.tensor([[3], [-3], [7], [big], [-big - 1], [2 ** 40], [-(2 ** 33) - 5], [1], [2]], dtype=torch.int64)
    assert torch.equal(op(a.to(TPU), b.to(TPU)).cpu(), op(a, b))
    wide = torch.randint(-2 ** 62, 2 ** 62, (64,), generator=g)
    narrow = torch.randint(1, 2 ** 20, (64,), generator=g) * (torch.randint(0, 2, (64,), generator=g) * 2 - 1)
    assert torch.equal(op(wide.to(TPU), narrow.to(TPU)).cpu(), op(wide, narrow))
    assert torch.equal(op(wide.to(TPU), 12345).cpu(), op(wide, 12345))
