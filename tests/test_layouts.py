"""A device buffer's layout is the plugin's business: a TPU stores some shapes in another dim order
((2, 5, 5) with dim 1 outermost) and tiles them. Every read of a tpu tensor, of its views and of what
is computed from them must still see PyTorch's row-major elements (before, a copy to the host took
the buffer's own dim order, and views read back on a TPU held other elements). Here buffers are made
with such layouts on purpose (torchtpu::upload_with_layout). XLA's CPU plugin honours the layout but
copies to the host row-major whatever it is asked, so there these tests pass either way; on a TPU
they check what went wrong."""

import itertools

import pytest
import torch

import torchtpu  # noqa: F401

SHAPES = [(2, 5, 5), (4, 3, 2), (12, 2), (25, 5), (3, 1, 4)]


def orders(rank):
    return [list(p) for p in itertools.permutations(range(rank)) if list(p) != list(range(rank - 1, -1, -1))]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_reads_are_row_major_whatever_the_device_layout(shape):
    x = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
    for minor_to_major in orders(len(shape)):
        t = torch.ops.torchtpu.upload_with_layout(x, minor_to_major)
        assert torch.ops.torchtpu.device_layout(t) == minor_to_major
        assert torch.equal(t.cpu(), x), minor_to_major
        assert torch.equal(t.reshape(-1).cpu(), x.reshape(-1)), minor_to_major
        assert torch.equal((t + 1).cpu(), x + 1), minor_to_major
        assert torch.equal(t.transpose(0, 1).cpu(), x.transpose(0, 1)), minor_to_major
        assert torch.equal(t[1:].clone().cpu(), x[1:]), minor_to_major
        assert t[-1].flatten()[-1].item() == x[-1].flatten()[-1].item()


@pytest.mark.parametrize("dtype", [torch.int64, torch.bfloat16, torch.bool, torch.complex64])
def test_other_dtypes_read_row_major(dtype):
    x = torch.arange(30).reshape(2, 3, 5).to(dtype)
    t = torch.ops.torchtpu.upload_with_layout(x, [1, 0, 2])
    assert torch.equal(t.cpu(), x)
    assert torch.equal(t.view(6, 5).cpu(), x.view(6, 5))
