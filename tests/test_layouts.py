"""A device buffer's layout is the plugin's business: a TPU stores some shapes in another dim order
((2, 5, 5) as {2,0,1} with (2, 128) tiles) and executables expect exactly those layouts. Every read of
a tpu tensor, of its views and of what is computed from them must still see PyTorch's row-major
elements: before, a copy to the host took the buffer's own dim order, and on a TPU views read back
held other elements. XLA's CPU plugin stores every array row-major and copies to the host row-major
whatever it is asked, so there these tests pass either way; on a TPU they check what went wrong."""

import itertools

import pytest
import torch

import torchtpu  # noqa: F401

# Shapes a TPU stores in another dim order than row-major (small minor dims are moved).
SHAPES = [(5, 5, 5), (2, 5, 5), (4, 3, 2), (12, 2), (25, 5), (3, 1, 4)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_views_and_results_read_row_major(shape):
    x = torch.randn(shape)
    t = x.to("tpu")
    layout = torch.ops.torchtpu.device_layout(t)
    assert sorted(layout) == list(range(len(shape))), layout  # a permutation, whichever the device chose
    assert torch.equal(t.cpu(), x)
    assert torch.equal(t.reshape(-1).cpu(), x.reshape(-1))
    assert torch.equal(t.reshape(shape[0], -1).cpu(), x.reshape(shape[0], -1))
    assert torch.equal((t + 1).reshape(-1, shape[-1]).cpu(), (x + 1).reshape(-1, shape[-1]))
    assert torch.equal(t.transpose(0, 1).cpu(), x.transpose(0, 1))
    assert torch.equal(t.transpose(0, 1).contiguous().cpu(), x.transpose(0, 1).contiguous())
    assert torch.equal(t.split(2)[-1].cpu(), x.split(2)[-1])
    assert torch.equal(t.split(2)[-1].clone().cpu(), x.split(2)[-1])
    assert t[-1].flatten()[-1].item() == x[-1].flatten()[-1].item()
    u, y = t.clone(), x.clone()
    u[1:].transpose(0, -1).mul_(2)  # a write through a view is seen by the whole storage
    y[1:].transpose(0, -1).mul_(2)
    assert torch.equal(u.cpu(), y)


def orders(rank):
    return [list(p) for p in itertools.permutations(range(rank))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16, torch.bool, torch.complex64])
def test_host_copies_are_row_major_whatever_the_buffer_layout(dtype):
    # Buffers made in every dim order (torchtpu::upload_with_layout, a test hook): the copy back to
    # the host must give the elements in row-major order. (A TPU's executables take each shape only in
    # its own default layout, so such buffers are only copied back here.)
    x = torch.arange(2 * 3 * 5).reshape(2, 3, 5).to(dtype)
    for minor_to_major in orders(3):
        t = torch.ops.torchtpu.upload_with_layout(x, minor_to_major)
        assert torch.ops.torchtpu.device_layout(t) == minor_to_major
        assert torch.equal(t.cpu(), x), minor_to_major


OFFSET_VIEWS = """
import os, pathlib, torch, torchtpu
x = torch.randn(2, 6, 4, 8)
t = x.to("tpu")
graph = torch.tpu.TPUGraph()
with torch.tpu.graph(graph):
    y = t * 2
    halves = (-y[..., 4:], y[..., :4] * 3, y.chunk(2, 1)[1] + 1, y[1, 2:5, :, 2:6] - 1)
graph.replay()
z = x * 2
for got, want in zip(halves, (-z[..., 4:], z[..., :4] * 3, z.chunk(2, 1)[1] + 1, z[1, 2:5, :, 2:6] - 1)):
    assert torch.equal(got.cpu(), want)
for path in pathlib.Path(os.environ["TORCHTPU_DUMP_DIR"]).iterdir():
    text = path.read_text()
    print("flat" if "tensor<384xf32>" in text else "-", "padded" if "concatenate" in text else "-")
"""


def test_offset_views_read_as_a_box_of_their_storage(tmp_path):
    # rotate_half's x[..., d/2:], a chunk's second half, a sub-box: one reshape and slice of the value.
    # Read through the flat storage from the view's offset (padded past its end), each was on a TPU a
    # copy of the whole tensor into a flat tiled buffer and back: part of the 216 copies and 70 reshapes
    # (2.5 ms) a v5e profile found in the 110M Llama's train step and not in jax.jit's.
    from conftest import run_python
    result = run_python(OFFSET_VIEWS, env={"TORCHTPU_DUMP_DIR": str(tmp_path / "modules"),
                                           "TORCHTPU_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["-", "-"], result.stdout


LINEAR_ROWS = """
import os, pathlib, re, torch, torchtpu
torch.manual_seed(0)
linear = torch.nn.Linear(8, 5, bias=False)
x = torch.randn(4, 6, 8)
heads_first = torch.randn(4, 2, 6, 4)  # attention's [B, H, L, D] output, to be [B, L, H*D] again
on_tpu = torch.nn.Linear(8, 5, bias=False).to("tpu")
on_tpu.load_state_dict(linear.state_dict())
t, h = x.to("tpu"), heads_first.to("tpu")
graph = torch.tpu.TPUGraph()
with torch.tpu.graph(graph):
    heads = on_tpu(t).view(4, 6, 5, 1) * 2
    projected = on_tpu(h.transpose(1, 2).reshape(4, 6, 8))
    with torch.autocast("tpu", dtype=torch.bfloat16):
        low = on_tpu(t)
graph.replay()
with torch.autocast("cpu", dtype=torch.bfloat16):
    low_cpu = linear(x)
assert torch.allclose(heads.cpu(), linear(x).view(4, 6, 5, 1) * 2, atol=1e-5, rtol=1e-5)
assert torch.allclose(projected.cpu(), linear(heads_first.transpose(1, 2).reshape(4, 6, 8)), atol=1e-5, rtol=1e-5)
assert low.dtype == torch.bfloat16 and torch.allclose(low.cpu().float(), low_cpu.float(), atol=2e-2, rtol=1e-2)
for path in pathlib.Path(os.environ["TORCHTPU_DUMP_DIR"]).iterdir():
    for line in path.read_text().splitlines():
        if "dot_general" in line:
            print(re.search(r": \\((tensor<[^>]*>)", line).group(1))
"""


def test_a_linear_of_rows_contracts_the_unmerged_input(tmp_path):
    # PyTorch's linear folds a [4, 6, 8] input (or an attention output made contiguous, through its
    # flat storage) into [24, 8] around mm. Handed to XLA so, on a v5e the 110M Llama's residual
    # stream came out transposed ([4096, 1024] column-major) with a relayout copy around each
    # projection (50 copies against jax.jit's 2); jax contracts [B, L, K] with [K, N].
    from conftest import run_python
    result = run_python(LINEAR_ROWS, env={"TORCHTPU_DUMP_DIR": str(tmp_path / "modules"),
                                          "TORCHTPU_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(set(result.stdout.split())) == ["tensor<4x6x8xbf16>", "tensor<4x6x8xf32>"], result.stdout
