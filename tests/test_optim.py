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


def test_foreach_ops_over_0d_tensors_run_as_one_vector(no_fallback):
    # Lists of 0-d tensors (a capturable optimizer's step counts) run an elementwise lowering once over
    # the vector of their values; each result is still its own tensor, with CPU's values.
    steps_cpu = [torch.tensor(float(s)) for s in (1, 2, 5, 9, 40)]
    steps = [s.to("tpu") for s in steps_cpu]
    other = [torch.tensor(v) for v in (0.5, -1.5, 2.0, 3.25, -0.125)]
    torch._foreach_add_(steps, 1)
    torch._foreach_add_(steps_cpu, 1)
    pow_ulps = 3 * 2.0 ** -23  # float32 powers: within 3 ulps of CPU's correctly rounded ones (pow.Scalar's)
    cases = [
        (torch._foreach_pow(0.9, steps), torch._foreach_pow(0.9, steps_cpu), pow_ulps),  # capturable Adam's beta ** step
        (torch._foreach_sqrt(steps), torch._foreach_sqrt(steps_cpu), 0),
        (torch._foreach_addcdiv(steps, steps, [o.to("tpu") for o in other], 0.5),
         torch._foreach_addcdiv(steps_cpu, steps_cpu, other, 0.5), 0),
        (torch._foreach_mul(steps, [2.0, 3.0, 0.5, -1.0, 4.0]), torch._foreach_mul(steps_cpu, [2.0, 3.0, 0.5, -1.0, 4.0]), 0),
        (steps, steps_cpu, 0),
    ]
    for results, expected, rtol in cases:
        assert len(results) == len(expected)
        for a, e in zip(results, expected):
            assert a.shape == e.shape == ()
            torch.testing.assert_close(a.cpu(), e, atol=0, rtol=rtol)
    norms = torch._foreach_norm(steps)  # a reduction: each tensor's sum alone, the roots as one vector
    for n, e in zip(norms, torch._foreach_norm(steps_cpu)):
        torch.testing.assert_close(n.cpu(), e)


POWERS = """
import os, pathlib, torch, torchtpu
steps = [torch.tensor(float(s), device="tpu") for s in range(1, int(os.environ["COUNT"]) + 1)]
powers = torch._foreach_pow(0.9, steps)
torch.testing.assert_close(torch.stack(powers).cpu(), 0.9 ** torch.arange(1.0, len(steps) + 1), atol=0, rtol=3 * 2.0 ** -23)
modules = [path.read_text() for path in pathlib.Path(os.environ["TORCHTPU_DUMP_DIR"]).iterdir()]
print(len(modules), max(len(m.splitlines()) for m in modules))
"""


def test_capturable_bias_corrections_are_one_power_for_every_parameter(tmp_path):
    # torch._foreach_pow(beta, steps), once per step for each of beta1 and beta2: one accurate power
    # over the vector of step counts, whatever the count (ATen's composite took one per parameter).
    from conftest import run_python
    logs = []
    for count in (4, 16):
        result = run_python(POWERS, env={"COUNT": str(count), "TORCHTPU_DUMP_DIR": str(tmp_path / f"m{count}"),
                                         "TORCHTPU_CACHE_DIR": str(tmp_path / "cache"),
                                         "TORCHTPU_EAGER_MODE": "strict"})  # one module per op
        assert result.returncode == 0, result.stderr[-3000:]
        logs.append([int(word) for word in result.stdout.split()[-2:]])
    # as many modules for 16 parameters as for 4 (not one power each), the largest (the power's) growing
    # by a join and a slice per parameter, not by a power
    (modules_4, lines_4), (modules_16, lines_16) = logs
    assert modules_4 == modules_16 and lines_16 - lines_4 < 4 * 12 < lines_4, logs


NORMS = """
import os, pathlib, torch, torchtpu
count = int(os.environ["COUNT"])
grads = [torch.randn(7 * n + 3, 5) for n in range(count)] + [torch.randn(())]  # and a 0-d one
for ord in (2.0, 3.0, float("inf"), 1.0):
    got = torch._foreach_norm([g.to("tpu") for g in grads], ord)
    for g, w in zip(got, torch._foreach_norm(grads, ord)):
        assert g.shape == w.shape == ()
        torch.testing.assert_close(g.cpu(), w)
texts = [path.read_text() for path in pathlib.Path(os.environ["TORCHTPU_DUMP_DIR"]).iterdir()]
print(" ".join(str(sum(t.count(op) for t in texts)) for op in ("stablehlo.sqrt", "stablehlo.power")))
"""


def test_foreach_norm_takes_the_root_once_for_the_whole_list(tmp_path):
    # clip_grad_norm_'s _foreach_norm: one sqrt (an accurate float32 sqrt is ~60 ops) or one root power
    # over the joined sums, whatever the list's length (one per tensor made clip_grad_norm_ over a
    # 110M Llama's gradients ~4,800 ops of its compiled step); values as CPU's.
    from conftest import run_python
    counts = []
    for count in (3, 12):
        result = run_python(NORMS, env={"COUNT": str(count), "TORCHTPU_DUMP_DIR": str(tmp_path / f"m{count}"),
                                        "TORCHTPU_CACHE_DIR": str(tmp_path / "cache"), "TORCHTPU_EAGER_MODE": "strict"})
        assert result.returncode == 0, result.stderr[-3000:]
        counts.append([int(word) for word in result.stdout.split()[-2:]])
    sqrts_3, powers_3 = counts[0]
    # ord 2: one sqrt; ord 3: a power per tensor (|g|^3) and one root; inf and 1 take no root
    assert sqrts_3 == 1 and counts[1][0] == 1, counts
    assert powers_3 == 3 + 1 + 1 and counts[1][1] == 12 + 1 + 1, counts


SMALL_LISTS = """
import os, pathlib, torch, torchtpu
sizes = range(1, 21)
bases = [torch.rand(n, n) + 0.5 for n in sizes]
exponents = [torch.rand(n, n) * 3 for n in sizes]
scalar_exponents = [torch.tensor(float(n) / 7) for n in sizes]
large = [torch.rand(300, 300) + 0.5 for _ in range(2)]  # 180,000 elements: a tensor each
on_tpu = lambda ts: [t.to("tpu") for t in ts]
for got, want in ((torch._foreach_pow(on_tpu(bases), on_tpu(exponents)), torch._foreach_pow(bases, exponents)),
                  (torch._foreach_pow(on_tpu(bases), on_tpu(scalar_exponents)), torch._foreach_pow(bases, scalar_exponents)),
                  (torch._foreach_pow(on_tpu(large), on_tpu(large)), torch._foreach_pow(large, large))):
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g.cpu(), w, atol=0, rtol=3 * 2.0 ** -23)
for path in pathlib.Path(os.environ["TORCHTPU_DUMP_DIR"]).iterdir():
    text = path.read_text()
    results = text.split("->", 1)[1].split("{", 1)[0].count("tensor<")
    if results > 1:  # the three foreach modules: argument and result types, joins, lines
        print(text.split("{", 2)[1].count("tensor<"), text.count("stablehlo.concatenate"), len(text.splitlines()))
"""


def test_a_small_foreach_list_runs_one_lowering_over_its_joined_tensors(tmp_path):
    # A list of at most 2^16 elements in all runs an elementwise lowering once over its tensors joined
    # into one vector (op_db's float32 _foreach_pow modules held the accurate power once per tensor:
    # past a minute on a v5e), 0-d exponents broadcast to their base's shape; a larger list keeps a
    # lowering per tensor (concatenating parameters would cost memory traffic).
    from conftest import run_python
    result = run_python(SMALL_LISTS, env={"TORCHTPU_DUMP_DIR": str(tmp_path / "modules"),
                                          "TORCHTPU_CACHE_DIR": str(tmp_path / "cache"), "TORCHTPU_EAGER_MODE": "strict"})
    assert result.returncode == 0, result.stderr[-3000:]
    modules = sorted(tuple(int(w) for w in line.split()) for line in result.stdout.strip().splitlines())
    assert [(types, joins) for types, joins, _ in modules] == [(6, 0), (60, 2), (60, 2)], modules
    per_tensor_lines = modules[0][2]  # two powers
    assert all(lines < per_tensor_lines for _, _, lines in modules[1:]), modules  # twenty tensors, one power
