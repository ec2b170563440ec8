"""torch.autocast("tpu", ...): CUDA's cast policy on device tpu, with no CPU fallback."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import TPU

LOW = [torch.bfloat16, torch.float16]


def test_device_module_advertises_amp_dtypes():
    assert torch.bfloat16 in torch.tpu.get_amp_supported_dtype()
    assert torch.float16 in torch.tpu.get_amp_supported_dtype()
    assert torch.tpu.is_bf16_supported()
    assert torch.amp.is_autocast_available("tpu")


@pytest.mark.parametrize("dtype", LOW)
def test_enabled_and_dtype_state(dtype):
    assert not torch.is_autocast_enabled("tpu")
    with torch.autocast("tpu", dtype=dtype):
        assert torch.is_autocast_enabled("tpu")
        assert torch.get_autocast_dtype("tpu") == dtype
        assert not torch.is_autocast_enabled("cpu")
        with torch.autocast("tpu", enabled=False):
            assert not torch.is_autocast_enabled("tpu")
        assert torch.is_autocast_enabled("tpu")
    assert not torch.is_autocast_enabled("tpu")


@pytest.mark.parametrize("dtype", LOW)
def test_lower_precision_ops(no_fallback, dtype):
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 4).to(TPU)
    x = torch.randn(3, 8, device=TPU)
    a, b = torch.randn(2, 3, 5, device=TPU), torch.randn(2, 5, 6, device=TPU)
    with torch.autocast("tpu", dtype=dtype):
        out = linear(x)
        assert out.dtype == dtype
        assert (x @ linear.weight.t()).dtype == dtype
        assert torch.mm(x, linear.weight.t()).dtype == dtype
        assert torch.bmm(a, b).dtype == dtype
        assert torch.addmm(linear.bias, x, linear.weight.t()).dtype == dtype
        assert torch.baddbmm(torch.zeros(2, 3, 6, device=TPU), a, b).dtype == dtype
        conv = torch.nn.Conv2d(3, 4, 3).to(TPU)
        assert conv(torch.randn(2, 3, 8, 8, device=TPU)).dtype == dtype
    # the parameters keep their dtype; only the op's inputs were cast
    assert linear.weight.dtype == torch.float32
    expected = F.linear(x.cpu().to(dtype), linear.weight.cpu().to(dtype), linear.bias.cpu().to(dtype))
    torch.testing.assert_close(out.cpu(), expected)


@pytest.mark.parametrize("dtype", LOW)
def test_float32_ops(no_fallback, dtype):
    x = torch.randn(4, 16, device=TPU).to(dtype)
    with torch.autocast("tpu", dtype=dtype):
        for out in (torch.softmax(x, -1), F.log_softmax(x, -1), F.layer_norm(x, (16,)),
                    torch.exp(x), torch.log(x.abs() + 1), torch.pow(x, 2), x.sum(), x.cumsum(0),
                    F.mse_loss(x, torch.zeros_like(x))):
            assert out.dtype == torch.float32, out.dtype
        # an explicit dtype wins over the float32 default of softmax/sum
        assert torch.softmax(x, -1, dtype=dtype).dtype == dtype
        # ops on no list run in the dtype they are given
        assert torch.relu(x).dtype == dtype
        assert (x + 1).dtype == dtype
    ref = torch.softmax(x.cpu().float(), -1)
    with torch.autocast("tpu", dtype=dtype):
        torch.testing.assert_close(torch.softmax(x, -1).cpu(), ref)


@pytest.mark.parametrize("dtype", LOW)
def test_promote_ops(no_fallback, dtype):
    low = torch.randn(2, 3, device=TPU).to(dtype)
    full = torch.randn(2, 3, device=TPU)
    with torch.autocast("tpu", dtype=dtype):
        cat = torch.cat([low, full])
        assert cat.dtype == torch.float32
        assert torch.stack([low, full]).dtype == torch.float32
        assert torch.addcmul(full, low, full).dtype == torch.float32
        assert torch.cat([low, low]).dtype == dtype
    torch.testing.assert_close(cat.cpu(), torch.cat([low.cpu().float(), full.cpu()]))


def test_nested_disable(no_fallback):
    linear = torch.nn.Linear(8, 4).to(TPU)
    x = torch.randn(3, 8, device=TPU)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert linear(x).dtype == torch.bfloat16
        with torch.autocast("tpu", enabled=False):
            assert linear(x).dtype == torch.float32
        assert linear(x).dtype == torch.bfloat16
    assert linear(x).dtype == torch.float32


def test_cpu_tensors_are_left_alone():
    # tpu autocast casts tpu tensors only; CPU autocast is a separate switch
    linear = torch.nn.Linear(8, 4)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert linear(torch.randn(3, 8)).dtype == torch.float32


def test_binary_cross_entropy_refused():
    p = torch.rand(4, device=TPU)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, torch.ones(4, device=TPU))


def test_sdpa_runs_in_low_precision(no_fallback):
    q, k, v = (torch.randn(2, 4, 6, 8, device=TPU) for _ in range(3))
    with torch.autocast("tpu", dtype=torch.bfloat16):
        out = F.scaled_dot_product_attention(q, k, v)
    assert out.dtype == torch.bfloat16
    ref = F.scaled_dot_product_attention(*(t.cpu().bfloat16() for t in (q, k, v)))
    torch.testing.assert_close(out.cpu(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", LOW)
def test_dtypes_agree_with_cpu_autocast_where_policies_agree(no_fallback, dtype):
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 4)
    x, y = torch.randn(3, 8), torch.randn(3, 4)

    def run(device):
        lin, xd, yd = linear.to(device), x.to(device), y.to(device)
        with torch.autocast(device, dtype=dtype):
            h = lin(xd)
            outs = (h, xd @ xd.t(), torch.cat([h, yd]), F.mse_loss(h, yd))
        return [o.dtype for o in outs], [o.float().cpu() for o in outs]

    tpu_dtypes, tpu_values = run("tpu")
    cpu_dtypes, cpu_values = run("cpu")
    assert tpu_dtypes == cpu_dtypes == [dtype, dtype, torch.float32, torch.float32]
    for a, b in zip(tpu_values, cpu_values):
        torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-2)


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
        torch.nn.Linear(64, 64), torch.nn.SiLU(), torch.nn.Linear(64, 5),
    )


def train(device: str, dtype: torch.dtype, steps: int = 12):
    torch.manual_seed(0)
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)
    inputs = torch.randn(steps, 32, 16, generator=data)
    targets = inputs[..., :5].argmax(-1)
    losses, dtypes = [], None
    for step in range(steps):
        x, y = inputs[step].to(device), targets[step].to(device)
        with torch.autocast(device, dtype=dtype):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        if dtypes is None:
            dtypes = (logits.dtype, loss.dtype)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    return losses, dtypes


def test_training_matches_cpu_autocast(no_fallback):
    # CPU's autocast policy is not CUDA's (e.g. layer_norm stays in the input dtype there), so the
    # curves agree to bf16 accuracy, not bit for bit; the output dtypes agree.
    tpu_losses, tpu_dtypes = train("tpu", torch.bfloat16)
    cpu_losses, cpu_dtypes = train("cpu", torch.bfloat16)
    assert tpu_dtypes == cpu_dtypes == (torch.bfloat16, torch.float32)
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), atol=1e-2, rtol=1e-2)
    assert tpu_losses[-1] < tpu_losses[0]


def test_training_float16(no_fallback):
    fp16_losses, dtypes = train("tpu", torch.float16)
    assert dtypes == (torch.float16, torch.float32)
    ref_losses, _ = train("cpu", torch.float16)
    torch.testing.assert_close(torch.tensor(fp16_losses), torch.tensor(ref_losses), atol=5e-3, rtol=5e-3)
