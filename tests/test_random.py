"""Random numbers on tpu: reproducible under the seeding APIs, right distributions, no CPU fallback.

The tpu stream is not the CPU generator's stream, so these tests check seeds and statistics
(with bounds many standard errors wide) rather than values."""

import math

import pytest
import torch


N = 200_000


def test_torch_manual_seed_reproduces_and_streams_advance():
    torch.manual_seed(1234)
    a = torch.rand(1000, device="tpu").cpu()
    b = torch.rand(1000, device="tpu").cpu()
    torch.manual_seed(1234)
    assert torch.equal(torch.rand(1000, device="tpu").cpu(), a)
    assert torch.equal(torch.rand(1000, device="tpu").cpu(), b)
    assert not torch.equal(a, b)
    torch.manual_seed(4321)
    assert not torch.equal(torch.rand(1000, device="tpu").cpu(), a)


def test_tpu_seeding_api():
    torch.tpu.manual_seed(7)
    assert torch.tpu.initial_seed() == 7
    first = torch.randn(64, device="tpu").cpu()
    torch.tpu.manual_seed_all(7)
    assert torch.equal(torch.randn(64, device="tpu").cpu(), first)
    state = torch.tpu.get_rng_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    x = torch.randn(64, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.randn(64, device="tpu").cpu(), x)
    torch.tpu.seed()
    assert torch.tpu.initial_seed() != 7 or not torch.equal(torch.randn(64, device="tpu").cpu(), x)


def test_explicit_generator():
    g = torch.Generator(device="tpu")
    assert g.device.type == "tpu"
    g.manual_seed(99)
    a = torch.rand(32, generator=g, device="tpu").cpu()
    g.manual_seed(99)
    b = torch.rand(32, generator=g, device="tpu").cpu()
    assert torch.equal(a, b)
    # The default generator is untouched by an explicit one.
    torch.manual_seed(5)
    c = torch.rand(32, device="tpu").cpu()
    torch.manual_seed(5)
    torch.rand(32, generator=g, device="tpu")
    assert torch.equal(torch.rand(32, device="tpu").cpu(), c)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_uniform_distribution(dtype, no_fallback):
    x = torch.empty(N, device="tpu", dtype=dtype).uniform_(-2.0, 3.0)
    assert x.dtype == dtype and x.device.type == "tpu"
    host = x.cpu().double()
    assert host.min() >= -2.0 and host.max() <= 3.0
    mean, var = 0.5, 25.0 / 12.0
    assert abs(host.mean().item() - mean) < 6 * math.sqrt(var / N) + 1e-2 * (dtype == torch.bfloat16)
    assert abs(host.var().item() - var) < 0.03 * var


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_normal_distribution(dtype, no_fallback):
    x = torch.randn(N, device="tpu", dtype=dtype)
    y = torch.empty(N, device="tpu", dtype=dtype).normal_(3.0, 0.5)
    hx, hy = x.cpu().double(), y.cpu().double()
    assert abs(hx.mean().item()) < 6 / math.sqrt(N) + 1e-3
    assert abs(hx.std().item() - 1.0) < 0.02
    assert abs(hy.mean().item() - 3.0) < 6 * 0.5 / math.sqrt(N) + 3e-3
    assert abs(hy.std().item() - 0.5) < 0.01
    # Tails exist but are not absurd.
    assert (hx.abs() > 3).double().mean().item() < 0.01 and hx.abs().max() < 8


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_bernoulli(p, no_fallback):
    x = torch.empty(N, device="tpu").bernoulli_(p)
    host = x.cpu()
    assert set(host.unique().tolist()) <= {0.0, 1.0}
    assert abs(host.mean().item() - p) < 6 * math.sqrt(p * (1 - p) / N)
    b = torch.bernoulli(torch.empty(1000, device="tpu", dtype=torch.bool), 0.5)
    assert b.dtype == torch.bool


def test_rand_like_and_shapes():
    x = torch.zeros(3, 5, 7, device="tpu")
    r = torch.rand_like(x)
    assert r.shape == x.shape and r.device == x.device
    assert not torch.equal(r.cpu()[0], r.cpu()[1])
    # A strided view is filled in place through its view.
    base = torch.zeros(4, 6, device="tpu")
    base[:, ::2].uniform_(1.0, 2.0)
    host = base.cpu()
    assert (host[:, 1::2] == 0).all() and (host[:, ::2] >= 1).all()


def test_uniform_rejects_integer_tensors_like_cpu():
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch.empty(3, dtype=torch.int64).uniform_()
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch.empty(3, dtype=torch.int64, device="tpu").uniform_()


def test_dropout_zeroes_at_rate_and_scales_the_rest(no_fallback):
    torch.manual_seed(0)
    x = torch.ones(200, 100, device="tpu", requires_grad=True)
    y = torch.nn.functional.dropout(x, p=0.3, training=True)
    kept = (y != 0).float().mean().item()
    assert abs(kept - 0.7) < 0.01, kept
    assert torch.allclose(y[y != 0].cpu(), torch.full((1,), 1 / 0.7))
    y.sum().backward()  # the gradient flows through the kept elements, scaled the same way
    torch.testing.assert_close(x.grad.cpu(), y.detach().cpu())


def test_dropout_keeps_the_input_values_scaled(no_fallback):
    # each kept element is its input times 1/(1-p), not 1/(1-p) alone (a mask-only result passed the
    # test above, whose input is all ones)
    x = torch.randn(64, 32)
    y, mask = torch.ops.aten.native_dropout(x.to("tpu"), 0.25, True)
    y, mask = y.cpu(), mask.cpu()
    torch.testing.assert_close(y, x * mask / 0.75)
    assert 0 < mask.sum() < mask.numel()


def test_dropout_is_reproducible_and_off_in_eval(no_fallback):
    x = torch.randn(64, 64, device="tpu")
    torch.manual_seed(5)
    a = torch.nn.functional.dropout(x, 0.5)
    torch.manual_seed(5)
    b = torch.nn.functional.dropout(x, 0.5)
    c = torch.nn.functional.dropout(x, 0.5)
    assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(b.cpu(), c.cpu())
    layer = torch.nn.Dropout(0.5).eval()
    assert torch.equal(layer(x).cpu(), x.cpu())


def test_multinomial_follows_the_weights(no_fallback):
    torch.manual_seed(0)
    weights = torch.tensor([[0.1, 0.0, 0.6, 0.3], [1.0, 1.0, 1.0, 1.0]], device="tpu")
    draws = torch.multinomial(weights, 4000, replacement=True).cpu()
    assert draws.dtype == torch.int64 and draws.shape == (2, 4000)
    frequencies = torch.stack([torch.bincount(row, minlength=4) for row in draws]).float() / 4000
    torch.testing.assert_close(frequencies[0], torch.tensor([0.1, 0.0, 0.6, 0.3]), atol=0.03, rtol=0)
    torch.testing.assert_close(frequencies[1], torch.full((4,), 0.25), atol=0.03, rtol=0)
    without = torch.multinomial(torch.ones(10, device="tpu"), 10).cpu()
    assert sorted(without.tolist()) == list(range(10))  # without replacement: each category once
    torch.manual_seed(3)
    a = torch.multinomial(weights, 5, replacement=True).cpu()
    torch.manual_seed(3)
    assert torch.equal(torch.multinomial(weights, 5, replacement=True).cpu(), a)


def test_randint_and_randperm(no_fallback):
    torch.manual_seed(0)
    draws = torch.randint(-3, 7, (5000,), device="tpu").cpu()
    assert draws.dtype == torch.int64 and draws.min() == -3 and draws.max() == 6
    counts = torch.bincount(draws + 3).float() / 5000
    torch.testing.assert_close(counts, torch.full((10,), 0.1), atol=0.02, rtol=0)
    floats = torch.randint(0, 4, (100,), device="tpu", dtype=torch.float32).cpu()
    assert floats.dtype == torch.float32 and set(floats.tolist()) <= {0.0, 1.0, 2.0, 3.0}
    perm = torch.randperm(50, device="tpu").cpu()
    assert perm.dtype == torch.int64 and sorted(perm.tolist()) == list(range(50))
    torch.manual_seed(1)
    again = torch.randperm(50, device="tpu").cpu()
    torch.manual_seed(1)
    assert torch.equal(torch.randperm(50, device="tpu").cpu(), again)


def test_more_distributions(no_fallback):
    """exponential_, cauchy_, geometric_, log_normal_, normal(Tensor, Tensor), bernoulli(p Tensor):
    checked by statistics that do not need the stream (medians and means many errors wide)."""
    e = torch.empty(N, device="tpu").exponential_(2.0).cpu().double()
    assert e.min() >= 0 and abs(e.mean().item() - 0.5) < 6 * 0.5 / math.sqrt(N)
    c = torch.empty(N, device="tpu").cauchy_(1.0, 2.0).cpu().double()
    assert abs(c.median().item() - 1.0) < 0.05
    assert abs(((c - 1.0).abs() < 2.0).double().mean().item() - 0.5) < 0.01  # the quartiles sit at +-sigma
    g = torch.empty(N, device="tpu").geometric_(0.25).cpu().double()
    assert g.min() >= 1 and torch.equal(g, g.round()) and abs(g.mean().item() - 4.0) < 0.05
    ln = torch.empty(N, device="tpu").log_normal_(0.5, 0.25).cpu().double()
    assert abs(ln.log().mean().item() - 0.5) < 0.01 and abs(ln.log().std().item() - 0.25) < 0.01
    mean = torch.linspace(-3, 3, N).to("tpu")
    n = torch.normal(mean, torch.full((N,), 0.5, device="tpu")).cpu().double()
    assert abs((n - mean.cpu().double()).std().item() - 0.5) < 0.01
    n = torch.normal(mean, 2.0).cpu().double()
    assert abs((n - mean.cpu().double()).std().item() - 2.0) < 0.04
    p = torch.rand(N).to("tpu")
    b = torch.bernoulli(p).cpu()
    assert set(b.unique().tolist()) <= {0.0, 1.0}
    assert abs(b.mean().item() - p.cpu().mean().item()) < 0.01
    torch.manual_seed(3)
    first = torch.empty(100, device="tpu").exponential_().cpu()
    torch.manual_seed(3)
    assert torch.equal(torch.empty(100, device="tpu").exponential_().cpu(), first)


@pytest.mark.parametrize("dtype,top", [(torch.float32, 2**24), (torch.bfloat16, 2**8), (torch.int16, 2**15 - 1),
                                       (torch.uint8, 255), (torch.bool, 1)])
def test_random_without_bounds_spans_cpus_range(dtype, top, no_fallback):
    """x.random_() draws integers in [0, 2^mantissa digits] for floats and [0, max] for integers."""
    torch.manual_seed(5)
    draws = torch.empty(20_000, dtype=dtype, device="tpu").random_().cpu()
    values = draws.double()
    assert draws.dtype == dtype and values.min() >= 0 and values.max() <= top
    assert torch.equal(values, values.floor())
    # uniform over [0, top]: the mean is top/2 (many standard errors wide), and both ends are reached
    assert abs(values.mean().item() - top / 2) < 0.05 * top
    if top <= 255:
        assert values.min() == 0 and values.max() == top
