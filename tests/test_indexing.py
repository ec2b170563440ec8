"""Advanced indexing on tpu vs CPU, with no CPU fallback: x[idx] (index.Tensor), x[idx] = v and
index_put_ with accumulate (index_put / _index_put_impl_), bool masks (expanded through nonzero),
nonzero and masked_select (data-dependent shapes), isin, embedding_bag forward and gradients."""

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from conftest import TPU, assert_equal_cpu, error_raised_by, last_json, run_python


def both(fn, *tensors, grad=()):
    """fn on CPU tensors and on tpu copies; `grad` names the positions that require grad."""
    cpu = [t.clone().requires_grad_(i in grad) for i, t in enumerate(tensors)]
    dev = [t.to(TPU).requires_grad_(i in grad) for i, t in enumerate(tensors)]
    return fn(*cpu), fn(*dev), cpu, dev


def test_index_forms(no_fallback):
    x = torch.randn(4, 5, 6)
    i = torch.tensor([0, 3, -1, 2])
    j = torch.tensor([[1, 3], [0, 2]])
    cases = [
        lambda x, i, j: x[i],
        lambda x, i, j: x[:, i],
        lambda x, i, j: x[:, :, i],
        lambda x, i, j: x[i, :, i],          # separated: the broadcast dims come first
        lambda x, i, j: x[j, j],             # adjacent 2-D indices
        lambda x, i, j: x[:, j, j],
        lambda x, i, j: x[1:3, j],           # a view, then an index
        lambda x, i, j: x[j],
    ]
    for case in cases:
        expected, actual, _, _ = both(case, x, i, j)
        assert_equal_cpu(actual, expected, exact=True)


def test_index_int32_and_cpu_indices(no_fallback):
    x = torch.arange(24.).reshape(4, 6)
    idx = torch.tensor([3, 0, 1], dtype=torch.int32)
    assert_equal_cpu(x.to(TPU)[idx.to(TPU)], x[idx], exact=True)
    assert_equal_cpu(x.to(TPU)[:, idx], x[:, idx], exact=True)  # a CPU index tensor moves to the device


def test_bool_mask_index(no_fallback):
    x = torch.randn(5, 4)
    for mask in (x > 0, (x > 0)[:, 0], torch.zeros(5, 4, dtype=torch.bool), torch.ones(5, dtype=torch.bool)):
        expected = x[mask]
        actual = x.to(TPU)[mask.to(TPU)]
        assert_equal_cpu(actual, expected, exact=True)
    y = x.clone()
    y[x > 0] = 0.5
    d = x.to(TPU)
    d[d > 0] = 0.5
    assert_equal_cpu(d, y, exact=True)


def test_setitem_and_index_put(no_fallback):
    x = torch.randn(6, 3)
    idx = torch.tensor([4, 0, 5])
    v = torch.randn(3, 3)
    y, d = x.clone(), x.to(TPU)
    y[idx] = v
    d[idx.to(TPU)] = v.to(TPU)
    assert_equal_cpu(d, y, exact=True)
    y[idx] += 1.0
    d[idx.to(TPU)] += 1.0
    assert_equal_cpu(d, y, exact=True)
    y[:, torch.tensor([2, 0])] = 7.0
    d[:, torch.tensor([2, 0], device=TPU)] = 7.0
    assert_equal_cpu(d, y, exact=True)
    dup = torch.tensor([1, 1, 4, 1])
    vals = torch.randn(4, 3)
    for acc in (True,):
        expected = x.index_put((dup,), vals, accumulate=acc)
        actual = x.to(TPU).index_put((dup.to(TPU),), vals.to(TPU), accumulate=acc)
        assert_equal_cpu(actual, expected, atol=1e-6, rtol=1e-6)
    ints = torch.arange(12).reshape(3, 4)
    expected = ints.clone().index_put_((torch.tensor([0, 0]), torch.tensor([1, 1])), torch.tensor(5), accumulate=True)
    actual = ints.to(TPU).index_put_((torch.tensor([0, 0], device=TPU), torch.tensor([1, 1], device=TPU)),
                                     torch.tensor(5, device=TPU), accumulate=True)
    assert_equal_cpu(actual, expected, exact=True)


def test_index_put_into_view(no_fallback):
    x = torch.zeros(4, 6)
    d = x.to(TPU)
    x[1:3][:, torch.tensor([0, 5])] = 2.0
    d[1:3][:, torch.tensor([0, 5], device=TPU)] = 2.0
    assert_equal_cpu(d, x, exact=True)


@pytest.mark.parametrize("case", ["plain", "column", "pair", "mask", "repeat"])
def test_index_gradient(no_fallback, case):
    x = torch.randn(5, 4)
    i = torch.tensor([1, 3, 1, 0])  # repeated: the backward accumulates
    fns = {
        "plain": lambda x: x[i.to(x.device)],
        "column": lambda x: x[:, i.to(x.device)[:2]],
        "pair": lambda x: x[i.to(x.device), i.to(x.device)],
        "mask": lambda x: x[x > 0],
        "repeat": lambda x: x[i.to(x.device)][i.to(x.device)],
    }
    fn = fns[case]
    w = None
    (expected, actual, cpu, dev) = both(fn, x, grad=(0,))
    w = torch.randn(expected.shape)
    (expected * w).sum().backward()
    (actual * w.to(TPU)).sum().backward()
    assert_equal_cpu(actual.detach(), expected.detach(), exact=True)
    assert_equal_cpu(dev[0].grad, cpu[0].grad, atol=1e-6, rtol=1e-6)


def test_index_put_gradient(no_fallback):
    x = torch.randn(5, 3)
    v = torch.randn(2, 3)
    idx = torch.tensor([4, 1])

    def fn(x, v):
        return x.index_put((idx.to(x.device),), v * 2, accumulate=True)

    expected, actual, cpu, dev = both(fn, x, v, grad=(0, 1))
    w = torch.randn(5, 3)
    (expected * w).sum().backward()
    (actual * w.to(TPU)).sum().backward()
    assert_equal_cpu(actual.detach(), expected.detach(), atol=1e-6, rtol=1e-6)
    assert_equal_cpu(dev[0].grad, cpu[0].grad, exact=True)
    assert_equal_cpu(dev[1].grad, cpu[1].grad, exact=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_nonzero_masked_select(no_fallback, dtype):
    x = (torch.randn(3, 4, 5) * 2).to(dtype)
    for t in (x, x[0], x[0, 0], x.reshape(-1)[:0], torch.zeros(3, 2, dtype=dtype)):
        assert_equal_cpu(torch.nonzero(t.to(TPU)), torch.nonzero(t), exact=True)
        mask = torch.randn(t.shape) > 0
        assert_equal_cpu(torch.masked_select(t.to(TPU), mask.to(TPU)), torch.masked_select(t, mask), exact=True)
    mask = torch.randn(4, 1) > 0  # broadcasts
    assert_equal_cpu(torch.masked_select(x.to(TPU), mask.to(TPU)), torch.masked_select(x, mask), exact=True)
    assert_equal_cpu(torch.nonzero(torch.tensor(3, dtype=dtype).to(TPU)), torch.nonzero(torch.tensor(3, dtype=dtype)),
                     exact=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_unique(no_fallback, dtype):
    x = torch.randint(-3, 4, (4, 5)).to(dtype)
    if dtype.is_floating_point:
        x[1, 2] = x[3, 0] = float("nan")  # each NaN is its own value, after the others
    for t in (x, x[0, 0], x.reshape(-1)[:0]):
        for sorted_ in (True, False):
            for inverse in (True, False):
                for counts in (True, False):
                    actual = torch.unique(t.to(TPU), sorted=sorted_, return_inverse=inverse, return_counts=counts)
                    expected = torch.unique(t, sorted=sorted_, return_inverse=inverse, return_counts=counts)
                    if not isinstance(actual, tuple):
                        actual, expected = (actual,), (expected,)
                    assert_equal_cpu(actual[0], expected[0], exact=True)
                    if counts:
                        assert_equal_cpu(actual[-1], expected[-1], exact=True)
                    if inverse:
                        check_inverse(actual[0], actual[1], expected[1], t)
    values, inverse = torch.ops.aten._unique(x.to(TPU), True, True)
    expected_values, expected_inverse = torch.ops.aten._unique(x, True, True)
    assert_equal_cpu(values, expected_values, exact=True)
    check_inverse(values, inverse, expected_inverse, x)


def check_inverse(values, inverse, expected, t):
    """The inverse indices equal CPU's except among NaNs (CPU's unstable sort orders those as it
    happens to); every index gives back its element."""
    nan = t.isnan() if t.dtype.is_floating_point else torch.zeros_like(t, dtype=torch.bool)
    assert_equal_cpu(inverse.masked_fill(nan.to(TPU), -1), expected.masked_fill(nan, -1), exact=True)
    assert_equal_cpu(values[inverse], t, exact=True)


def test_index_fill_gradient_runs_on_tpu(no_fallback):
    # index_fill's backward takes the unique indices (aten::_unique).
    x = torch.randn(3, 5)
    index = torch.tensor([1, 3, 1])
    expected, actual, cpu, dev = both(lambda x: x.index_fill(1, index.to(x.device), 2.0), x, grad=(0,))
    (expected * torch.arange(15.0).reshape(3, 5)).sum().backward()
    (actual * torch.arange(15.0).reshape(3, 5).to(TPU)).sum().backward()
    assert_equal_cpu(dev[0].grad, cpu[0].grad, exact=True)


def test_masked_select_gradient(no_fallback):
    x = torch.randn(4, 5)
    mask = torch.randn(4, 5) > 0
    expected, actual, cpu, dev = both(lambda x: torch.masked_select(x, mask.to(x.device)), x, grad=(0,))
    expected.sum().backward()
    actual.sum().backward()
    assert_equal_cpu(dev[0].grad, cpu[0].grad, exact=True)


def test_masked_scatter(no_fallback):
    x = torch.randn(3, 4)
    mask = torch.randn(3, 4) > 0
    src = torch.randn(12)
    assert_equal_cpu(x.to(TPU).masked_scatter(mask.to(TPU), src.to(TPU)), x.masked_scatter(mask, src), exact=True)
    row = torch.tensor([True, False, True, True])  # broadcasts over rows
    assert_equal_cpu(x.to(TPU).masked_scatter_(row.to(TPU), src.to(TPU)), x.clone().masked_scatter_(row, src),
                     exact=True)


def test_isin(no_fallback):
    e = torch.randint(0, 10, (4, 5))
    t = torch.tensor([1, 3, 7, 3])
    for invert in (False, True):
        assert_equal_cpu(torch.isin(e.to(TPU), t.to(TPU), invert=invert), torch.isin(e, t, invert=invert), exact=True)
        assert_equal_cpu(torch.isin(e.to(TPU), 3, invert=invert), torch.isin(e, 3, invert=invert), exact=True)
    f = torch.tensor([0.5, 1.0, 2.0])
    assert_equal_cpu(torch.isin(f.to(TPU), t.to(TPU)), torch.isin(f, t), exact=True)
    assert_equal_cpu(torch.isin(e.to(TPU), t[:0].to(TPU)), torch.isin(e, t[:0]), exact=True)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("include_last_offset", [False, True])
@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_bag(no_fallback, mode, include_last_offset, padding_idx):
    weight = torch.randn(10, 3)
    indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 2])
    offsets = torch.tensor([0, 4, 4, 6, 9]) if include_last_offset else torch.tensor([0, 4, 4, 6])

    def fn(w, psw=None):
        return F.embedding_bag(indices.to(w.device), w, offsets.to(w.device), mode=mode, per_sample_weights=psw,
                               include_last_offset=include_last_offset, padding_idx=padding_idx)

    expected, actual, cpu, dev = both(fn, weight, grad=(0,))
    assert_equal_cpu(actual.detach(), expected.detach(), atol=1e-6, rtol=1e-6)
    g = torch.randn(expected.shape)
    (expected * g).sum().backward()
    (actual * g.to(TPU)).sum().backward()
    assert_equal_cpu(dev[0].grad, cpu[0].grad, atol=1e-6, rtol=1e-6)
    with torch.no_grad():  # _embedding_bag_forward_only
        assert_equal_cpu(fn(weight.to(TPU)), fn(weight), atol=1e-6, rtol=1e-6)


def test_embedding_bag_per_sample_weights(no_fallback):
    weight = torch.randn(8, 4)
    indices = torch.tensor([1, 2, 0, 7, 7, 3])
    offsets = torch.tensor([0, 3, 3])
    psw = torch.rand(6)

    def fn(w, p):
        return F.embedding_bag(indices.to(w.device), w, offsets.to(w.device), mode="sum", per_sample_weights=p)

    expected, actual, cpu, dev = both(fn, weight, psw, grad=(0, 1))
    assert_equal_cpu(actual.detach(), expected.detach(), atol=1e-6, rtol=1e-6)
    expected.sum().backward()
    actual.sum().backward()
    assert_equal_cpu(dev[0].grad, cpu[0].grad, atol=1e-6, rtol=1e-6)
    assert_equal_cpu(dev[1].grad, cpu[1].grad, atol=1e-6, rtol=1e-6)


def test_embedding_bag_module_trains(no_fallback):
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(20, 4, mode="mean")
    dev_bag = torch.nn.EmbeddingBag(20, 4, mode="mean").to(TPU)
    dev_bag.load_state_dict(bag.state_dict())
    indices = torch.randint(0, 20, (12,))
    offsets = torch.tensor([0, 3, 7])
    for b, device in ((bag, "cpu"), (dev_bag, TPU)):
        opt = torch.optim.SGD(b.parameters(), lr=0.5)
        for _ in range(3):
            opt.zero_grad()
            b(indices.to(device), offsets.to(device)).square().sum().backward()
            opt.step()
    assert_equal_cpu(dev_bag.weight.detach(), bag.weight.detach(), atol=1e-5, rtol=1e-5)


def test_out_of_range_does_not_raise(no_fallback):
    """Documented behaviour without TORCHTPU_CHECK_INDICES: a module cannot raise, so index clamps and
    index_put drops."""
    x = torch.arange(4.)
    d = x.to(TPU)
    assert d[torch.tensor([7], device=TPU)].cpu().tolist() == [3.0]
    d[torch.tensor([7], device=TPU)] = 9.0
    assert d.cpu().tolist() == x.tolist()


def test_negative_indices_where_cpu_takes_them(no_fallback):
    """index_fill, take and put wrap negative positions once, as CPU does (without any check mode)."""
    x = torch.arange(12.).reshape(3, 4)
    cases = [
        lambda x, t: x.clone().index_fill_(1, t([-1, 0]), -5.0),
        lambda x, t: x.clone().index_fill_(0, t([-3]), 2.5),
        lambda x, t: x.take(t([-1, 3, -12])),
        lambda x, t: x.clone().put_(t([-2]), torch.full((1,), 7.0, device=x.device)),
    ]
    for fn in cases:
        assert_equal_cpu(fn(x.to(TPU), lambda v: torch.tensor(v, device=TPU)), fn(x, lambda v: torch.tensor(v)))


@pytest.fixture
def check_indices():
    """The body runs as under TORCHTPU_CHECK_INDICES=1."""
    torchtpu._C.set_check_indices(True)
    try:
        yield
    finally:
        torchtpu._C.set_check_indices(False)


# (name, fn(x, long tensor on x's device)) over x = arange(6.).reshape(2, 3): each raises on CPU.
OUT_OF_RANGE = {
    "gather": lambda x, t: torch.gather(x, 1, t([[0, 5]])),
    "gather_negative": lambda x, t: torch.gather(x, -1, t([[0, -1]])),
    "scatter_value": lambda x, t: x.clone().scatter_(1, t([[0, 5]]), 1.0),
    "scatter_add": lambda x, t: x.clone().scatter_add_(1, t([[0, 3]]), torch.ones_like(x[:1, :2])),
    "scatter_reduce": lambda x, t: x.clone().scatter_reduce_(0, t([[2, 0]]), torch.ones_like(x[:1, :2]), "amax"),
    "index": lambda x, t: x[t([0, 2])],
    "index_negative": lambda x, t: x[t([0, -3])],
    "index_second_dim": lambda x, t: x[:, t([0, 3])],
    "index_bool_and_long": lambda x, t: x[torch.tensor([True, False], device=x.device), t([5])],
    "index_select": lambda x, t: x.index_select(0, t([0, 2])),
    "embedding": lambda x, t: F.embedding(t([[0, 7]]), x),
    "embedding_negative": lambda x, t: F.embedding(t([0, -1]), x),
    "take": lambda x, t: x.take(t([0, 6])),
    "take_negative": lambda x, t: x.take(t([0, -7])),
    "put": lambda x, t: x.clone().put_(t([6]), torch.ones_like(x[0, :1])),
    "index_put": lambda x, t: x.clone().index_put_((t([0, 2]),), torch.ones_like(x[0, 0])),
    "index_put_accumulate": lambda x, t: x.clone().index_put_((t([0, 2]),), torch.ones_like(x[0, 0]), accumulate=True),
    "setitem": lambda x, t: x.clone().__setitem__(t([0, -3]), 1.0),
    "index_add": lambda x, t: x.clone().index_add_(0, t([0, -1]), torch.ones_like(x)),
    "index_copy": lambda x, t: x.clone().index_copy_(0, t([0, 2]), torch.ones_like(x)),
    "index_fill": lambda x, t: x.clone().index_fill_(1, t([0, 3]), 1.0),
    "nll_loss": lambda x, t: F.nll_loss(x, t([0, 3])),
    "cross_entropy_negative": lambda x, t: F.cross_entropy(x, t([0, -1])),
    "nll_loss2d": lambda x, t: F.nll_loss(x.reshape(1, 2, 3, 1), t([[[0], [2], [1]]])),
    "embedding_bag": lambda x, t: F.embedding_bag(t([0, 1, 7]), x, t([0])),
}


@pytest.mark.parametrize("name", OUT_OF_RANGE)
def test_check_indices_raises_like_cpu(check_indices, no_fallback, name):
    """Under TORCHTPU_CHECK_INDICES=1 an out-of-range position raises CPU's error, type and text."""
    fn = OUT_OF_RANGE[name]
    x = torch.arange(6.).reshape(2, 3)
    cpu_error = error_raised_by(lambda: fn(x, lambda v: torch.tensor(v)))
    tpu_error = error_raised_by(lambda: fn(x.to(TPU), lambda v: torch.tensor(v, device=TPU)))
    assert cpu_error is not None and tpu_error is not None, (cpu_error, tpu_error)
    assert type(tpu_error) is type(cpu_error), (tpu_error, cpu_error)
    assert str(tpu_error) == str(cpu_error)


def test_check_indices_passes_in_range_values(check_indices, no_fallback):
    """The checks let valid positions through (negative ones where CPU takes them, ignore_index) and
    leave the results and the device as they were."""
    x = torch.arange(6.).reshape(2, 3)
    cases = [
        lambda x, t: torch.gather(x, 1, t([[0, 2], [1, 1]])),
        lambda x, t: x[t([1, -2])],
        lambda x, t: x.take(t([5, -6])),
        lambda x, t: x.clone().index_fill_(1, t([-1]), 7.0),
        lambda x, t: F.nll_loss(x, t([0, 9]), ignore_index=9),
        lambda x, t: x.clone().scatter_(0, t([[1, 0, 1]]), 5.0),
    ]
    for fn in cases:
        assert_equal_cpu(fn(x.to(TPU), lambda v: torch.tensor(v, device=TPU)), fn(x, lambda v: torch.tensor(v)))


def test_check_indices_env_variable_subprocess():
    code = """
import json, torch, torchtpu
x = torch.arange(6.).reshape(2, 3).to("tpu")
try:
    torch.gather(x, 1, torch.tensor([[0, 5]], device="tpu"))
    error = None
except RuntimeError as e:
    error = str(e)
print(json.dumps({"error": error, "after": x.sum().item()}))
"""
    proc = run_python(code, {"TORCHTPU_CHECK_INDICES": "1"})
    assert proc.returncode == 0, proc.stderr
    out = last_json(proc.stdout)
    assert out == {"error": "index 5 is out of bounds for dimension 1 with size 3", "after": 15.0}, out


def test_histc_of_integers_counts_as_cuda_does():
    # CPU has no integer histc; CUDA's (what transformers' MoE routers call off the CPU) counts in the
    # input's dtype with the float rules' bins.
    x = torch.tensor([0, 1, 1, 3, 3, 3, 7, -2, 9], dtype=torch.int32)
    got = torch.histc(x.to(TPU), bins=4, min=0, max=7)
    assert got.dtype == torch.int32
    assert torch.equal(got.cpu(), torch.histc(x.float(), bins=4, min=0, max=7).int())
    degenerate = torch.tensor([5, 5, 5], dtype=torch.int64)
    assert torch.equal(torch.histc(degenerate.to(TPU), bins=3).cpu(), torch.histc(degenerate.float(), bins=3).long())
