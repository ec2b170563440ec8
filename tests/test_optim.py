"""Optimizers on tpu: SGD, Adam and AdamW in their default (foreach) and fused forms, and grad
clipping, step for step against the same optimizer on CPU, with nothing falling back."""

import pytest
import torch

import torchtpu
from conftest import no_cpu_fallback

OPTIMIZERS = {
    "sgd": lambda params, **kw: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01, **kw),
    "sgd_nesterov": lambda params, **kw: torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, **kw),
    "adam": lambda params, **kw: torch.optim.Adam(params, lr=0.01, weight_decay=0.01, **kw),
    "adam_amsgrad": lambda params, **kw: torch.optim.Adam(params, lr=0.01, amsgrad=True, **kw),
    "adamw": lambda params, **kw: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, **kw),
    "adamw_maximize": lambda params, **kw: torch.optim.AdamW(params, lr=0.01, maximize=True, **kw),
}


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _train(device, make_optimizer, steps=4, clip=None, **kw):
    model = _model().to(device)
    optimizer = make_optimizer(model.parameters(), **kw)
    data = torch.Generator().manual_seed(1)
    x = torch.randn(steps, 5, 6, generator=data).to(device)
    y = torch.randn(steps, 5, 3, generator=data).to(device)
    for step in range(steps):
        loss = torch.nn.functional.mse_loss(model(x[step]), y[step])
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("form", ["foreach", "fused"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_matches_cpu(name, form):
    kw = {form: True}
    if form == "fused" and name.startswith("sgd"):
        kw = {"fused": True}
    expected = _train("cpu", OPTIMIZERS[name], foreach=False)
    with no_cpu_fallback():
        actual = _train("tpu", OPTIMIZERS[name], **kw)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=2e-6, rtol=2e-5)


def test_fused_adamw_is_one_spec_call_per_step(strict_eager):
    model = _model().to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    model(torch.randn(2, 6, device="tpu")).sum().backward()
    optimizer.step()  # the first step also creates the state (zeros, step counts)
    before = torchtpu.debug.metrics()["executions"]
    with no_cpu_fallback():
        optimizer.step()
    # The step-count increment (one _foreach_add_) and the update of all four parameters (one _fused_adamw_).
    assert torchtpu.debug.metrics()["executions"] - before == 2


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clip_grad_norm_matches_cpu(norm_type, no_fallback):
    results = {}
    for device in ("cpu", "tpu"):
        model = _model().to(device)
        x = torch.randn(5, 6, generator=torch.Generator().manual_seed(3)).to(device)
        (model(x) ** 2).sum().backward()
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, norm_type=norm_type)
        results[device] = (total.cpu(), [p.grad.cpu() for p in model.parameters()])
    torch.testing.assert_close(results["tpu"][0], results["cpu"][0], atol=1e-6, rtol=1e-5)
    for a, e in zip(results["tpu"][1], results["cpu"][1]):
        torch.testing.assert_close(a, e, atol=1e-6, rtol=1e-5)


def test_foreach_ops_write_every_tensor_of_the_list(no_fallback):
    gen = torch.Generator().manual_seed(4)
    cpu = [torch.randn(n, 3, generator=gen) for n in (1, 4, 7)]
    other = [torch.randn(n, 3, generator=gen) for n in (1, 4, 7)]
    tpu = [t.to("tpu") for t in cpu]
    torch._foreach_add_(cpu, [o for o in other], alpha=0.5)
    torch._foreach_add_(tpu, [o.to("tpu") for o in other], alpha=0.5)
    torch._foreach_mul_(cpu, [0.5, 2.0, -1.0])
    torch._foreach_mul_(tpu, [0.5, 2.0, -1.0])
    torch._foreach_lerp_(cpu, other, 0.25)
    torch._foreach_lerp_(tpu, [o.to("tpu") for o in other], 0.25)
    for a, e in zip(tpu, cpu):
        torch.testing.assert_close(a.cpu(), e)
    norms = torch._foreach_norm(tpu)
    for n, e in zip(norms, torch._foreach_norm(cpu)):
        torch.testing.assert_close(n.cpu(), e)
