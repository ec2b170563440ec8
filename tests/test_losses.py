"""cross_entropy (log_softmax + nll_loss) and embedding, forward and backward, on tpu equal CPU, and
the indexing overloads behind them run their specs (specs/indexing.yaml), never the CPU fallback.
Out-of-range indices are not checked on tpu (a compiled module cannot raise), so none are used here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_equal_cpu
from torchtpu.testing import check_opinfo



def tpu(t):
    return None if t is None else t.to("tpu")


def grads(loss_fn, inputs, seed_shape_like):
    """(loss, d loss / d inputs) with a random upstream gradient."""
    out = loss_fn(*inputs)
    g = torch.randn(seed_shape_like.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
    return out, torch.autograd.grad(out, inputs, g)


def check_cross_entropy(logits, target, tol=None, **kwargs):
    tol = tol or {}
    x = logits.clone().requires_grad_()
    xt = tpu(logits).requires_grad_()
    kwargs_t = {k: tpu(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    expected = F.cross_entropy(x, target, **kwargs)
    actual = F.cross_entropy(xt, tpu(target), **kwargs_t)
    assert_equal_cpu(actual, expected, **tol)
    g = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    (gx,) = torch.autograd.grad(expected, x, g)
    (gxt,) = torch.autograd.grad(actual, xt, tpu(g))
    assert_equal_cpu(gxt, gx, **tol)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, -100, 3])
def test_cross_entropy(reduction, weighted, ignore, no_fallback):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 5, generator=gen) * 3
    target = torch.tensor([0, 4, 2, 3, 1, 4, 3, 0])
    kwargs = {"reduction": reduction, "label_smoothing": 0.0}
    if weighted:
        kwargs["weight"] = torch.rand(5, generator=gen) + 0.1
    if ignore is not None:
        kwargs["ignore_index"] = ignore
        if ignore == -100:
            target[[1, 6]] = -100
    check_cross_entropy(logits, target, **kwargs)


@pytest.mark.parametrize("shape", [(5,), (3, 4, 6), (2, 3, 4, 5), (2, 3, 2, 2, 3)])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cross_entropy_shapes(shape, reduction, no_fallback):
    # Unbatched [C], [N, C, d] and [N, C, d1, d2(, d3)]: the latter run nll_loss2d.
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(*shape, generator=gen)
    classes = shape[0] if len(shape) == 1 else shape[1]
    target_shape = () if len(shape) == 1 else (shape[0],) + shape[2:]
    target = torch.randint(0, classes, target_shape, generator=gen)
    weight = torch.rand(classes, generator=gen) + 0.5
    check_cross_entropy(logits, target, reduction=reduction, weight=weight, ignore_index=1)


def test_cross_entropy_all_ignored_mean_is_nan(no_fallback):
    logits = torch.randn(3, 4)
    target = torch.full((3,), -100)
    actual = F.cross_entropy(tpu(logits), tpu(target))
    assert_equal_cpu(actual, F.cross_entropy(logits, target))
    assert torch.isnan(actual.cpu())


def test_cross_entropy_float64_and_bfloat16(no_fallback):
    logits = torch.randn(6, 7, generator=torch.Generator().manual_seed(3))
    target = torch.tensor([6, 0, 1, 5, 5, 2])
    check_cross_entropy(logits.double(), target)
    check_cross_entropy(logits.bfloat16(), target, tol={"atol": 2e-2, "rtol": 2e-2})


def test_nll_loss_total_weight(no_fallback):
    x = torch.randn(5, 3).log_softmax(1)
    t = torch.tensor([0, 2, 1, 2, 2])
    w = torch.tensor([0.5, 1.0, 2.0])
    for reduction in (0, 1, 2):
        expected = torch.ops.aten.nll_loss_forward(x, t, w, reduction, 1)
        actual = torch.ops.aten.nll_loss_forward(tpu(x), tpu(t), tpu(w), reduction, 1)
        assert_equal_cpu(actual[0], expected[0])
        assert_equal_cpu(actual[1], expected[1])


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("kwargs", [{}, {"padding_idx": 1}, {"padding_idx": -1}, {"scale_grad_by_freq": True},
                                    {"padding_idx": 0, "scale_grad_by_freq": True}])
def test_embedding(index_dtype, kwargs, no_fallback):
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(10, 4, generator=gen)
    indices = torch.tensor([[1, 2, 1, 9], [0, 9, 1, 1], [3, 3, 3, 0]], dtype=index_dtype)
    w = weight.clone().requires_grad_()
    wt = tpu(weight).requires_grad_()
    expected = F.embedding(indices, w, **kwargs)
    actual = F.embedding(tpu(indices), wt, **kwargs)
    assert_equal_cpu(actual, expected, exact=True)
    g = torch.randn(expected.shape, generator=gen)
    (gw,) = torch.autograd.grad(expected, w, g)
    (gwt,) = torch.autograd.grad(actual, wt, tpu(g))
    assert_equal_cpu(gwt, gw)


def test_embedding_dense_backward_direct(no_fallback):
    grad = torch.randn(2, 3, 5)
    indices = torch.tensor([[4, 0, 4], [6, 4, 0]])
    for padding_idx, scale in ((-1, False), (4, False), (-1, True), (0, True)):
        expected = torch.ops.aten.embedding_dense_backward(grad, indices, 7, padding_idx, scale)
        actual = torch.ops.aten.embedding_dense_backward(tpu(grad), tpu(indices), 7, padding_idx, scale)
        assert_equal_cpu(actual, expected)


# Indexing overloads the generated parity tests do not reach: scatter with a Scalar value (the
# scatter OpInfo passes tensors) and scatter_reduce's other reductions (one OpInfo per reduction).

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_scatter_value(dtype, no_fallback):
    base = torch.zeros(3, 4, dtype=dtype)
    index = torch.tensor([[0, 1, 2, 0], [2, 0, 1, 1]])
    value = True if dtype == torch.bool else 2.5
    assert_equal_cpu(tpu(base).scatter(0, tpu(index), value), base.scatter(0, index, value), exact=True)
    expected = base.clone().scatter_(1, index, value)
    actual = tpu(base)
    actual.scatter_(1, tpu(index), value)
    assert_equal_cpu(actual, expected, exact=True)
    if dtype != torch.bool:
        for reduce in ("add", "multiply"):
            start = torch.full((3, 4), 3, dtype=dtype)
            assert_equal_cpu(tpu(start).scatter(0, tpu(index), 2, reduce=reduce),
                             start.scatter(0, index, 2, reduce=reduce), exact=True)


@pytest.mark.parametrize("reduction", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("dtype", ["int64", "float32"])
def test_scatter_reduce(reduction, dtype):
    check_opinfo(f"scatter_reduce.{reduction}", dtype, overloads=["scatter_reduce.two", "scatter_reduce_.two"],
                 variants=["Functional", "Inplace"])


def ctc_case(concatenated, seed=0, T=12, N=4, C=6, blank=0):
    """log_probs [T, N, C] (log_softmax of random logits), targets with repeated labels (the blank
    between them cannot be skipped), varied input and target lengths (one target empty)."""
    g = torch.Generator().manual_seed(seed)
    log_probs = torch.randn(T, N, C, generator=g).log_softmax(2)
    input_lengths = torch.tensor([T, T - 3, 7, 5][:N])
    target_lengths = torch.tensor([5, 3, 0, 2][:N])
    labels = [c for c in range(C) if c != blank]
    targets = torch.tensor(labels)[torch.randint(0, len(labels), (N, 5), generator=g)]
    targets[0, 1] = targets[0, 2]  # a repeat
    if concatenated:
        targets = torch.cat([targets[i, :n] for i, n in enumerate(target_lengths.tolist())])
    return log_probs, targets, input_lengths, target_lengths


def check_ctc(log_probs, targets, input_lengths, target_lengths, **kwargs):
    def loss_and_grad(device):
        x = log_probs.to(device).requires_grad_()
        loss = F.ctc_loss(x, targets.to(device), input_lengths, target_lengths, **kwargs)
        seed = torch.linspace(0.5, 1.5, loss.numel(), dtype=loss.dtype).reshape(loss.shape).to(device)
        (grad,) = torch.autograd.grad(loss, x, seed)
        return loss, grad
    expected, expected_grad = loss_and_grad("cpu")
    actual, actual_grad = loss_and_grad("tpu")
    assert_equal_cpu(actual, expected, atol=1e-5, rtol=1e-5)
    assert_equal_cpu(actual_grad, expected_grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("concatenated", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ctc_loss(concatenated, reduction, no_fallback):
    check_ctc(*ctc_case(concatenated), reduction=reduction)


def test_ctc_loss_blank_dtype_and_unbatched(no_fallback):
    log_probs, targets, input_lengths, target_lengths = ctc_case(False, seed=1, blank=3)
    check_ctc(log_probs.double(), targets, input_lengths, target_lengths, blank=3)
    check_ctc(log_probs[:, 0], targets[0, :4], torch.tensor(12), torch.tensor(4), reduction="sum")


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_impossible_alignment(zero_infinity, no_fallback):
    # Target 1 needs 7 steps (three repeats need blanks between them) but has 5: the loss is inf, and
    # zero_infinity makes it (and its gradient) 0.
    log_probs, _, _, _ = ctc_case(False, N=2)
    targets = torch.tensor([[1, 2, 3, 4], [2, 2, 2, 2]])
    check_ctc(log_probs, targets, torch.tensor([12, 5]), torch.tensor([4, 4]), reduction="none",
              zero_infinity=zero_infinity)
