"""Quickstart: tensors on device "tpu", ops, views and in-place writes, reading results back, torch.tpu."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="1. Quickstart")


@app.cell
def _():
    import marimo as mo
    import torch

    import torchtpu

    return mo, torch, torchtpu


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 1. Quickstart: tensors on device `"tpu"`

    `import torchtpu` (or just `import torch`: torchtpu registers itself as a `torch.backends` entry
    point) makes a new device type exist, `"tpu"`. Tensors on it behave like CUDA tensors: you create
    them there or move them there, every op on them runs on the device, and a host read brings the
    result back. On this machine the device is XLA's CPU plugin, so everything below runs anywhere;
    on a Cloud TPU the same code runs on the chip.

    Every cell in this notebook computes on `"tpu"` and checks the result against the same program
    on the CPU. Open it yourself with `marimo edit docs/01_quickstart.py` (or run it as a script:
    `python docs/01_quickstart.py`).
    """)
    return


@app.cell
def _(mo, torch, torchtpu):
    # `import torchtpu` never crashes; if the runtime could not start, init_error() says why.
    if not torchtpu.is_available():
        raise RuntimeError(f"torchtpu could not start: {torchtpu.init_error()}")
    mo.md(
        f"""
    | what | value |
    |---|---|
    | `torch.tpu.is_available()` | `{torch.tpu.is_available()}` |
    | `torch.tpu.device_count()` | `{torch.tpu.device_count()}` |
    | `torch.tpu.get_device_name()` | `{torch.tpu.get_device_name()}` |
    | `torch.tpu.get_device_properties()` | `{torch.tpu.get_device_properties()}` |
    | `torch.accelerator.current_accelerator()` | `{torch.accelerator.current_accelerator()}` |
    """
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Tensors and ops

    Create a tensor on the device with `device="tpu"`, or move one there with `.to("tpu")` (also
    `.tpu()`). Each op on a tpu tensor is an ATen kernel generated from a YAML spec: the first call
    compiles a small XLA executable, later calls with the same shapes reuse it.
    """)
    return


@app.cell
def _(torch):
    torch.manual_seed(0)
    x_cpu, w_cpu = torch.randn(4, 8), torch.randn(8, 3)

    x = x_cpu.to("tpu")                 # a copy of a CPU tensor on the device
    w = w_cpu.tpu()                     # the same, spelled like .cuda()
    y = (x @ w).relu() + 1.5            # matmul, relu and add run on tpu
    y_cpu = (x_cpu @ w_cpu).relu() + 1.5

    print(y)                            # printing reads the tensor back; it says where it lives
    y
    return w, w_cpu, x, x_cpu, y, y_cpu


@app.cell
def _(mo, torch, y, y_cpu):
    mo.md(
        f"""
    The result lives on `{y.device}`, has dtype `{y.dtype}` and shape `{tuple(y.shape)}`.
    Compared with the CPU: largest difference **{(y.cpu() - y_cpu).abs().max().item():.2e}**,
    `torch.allclose` says **{torch.allclose(y.cpu(), y_cpu, atol=1e-5)}**.
    """
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Views and in-place writes

    A tpu tensor is a PyTorch view (sizes, strides, offset) over a device storage, as on the CPU.
    Slicing, transposing and `view` make new views of the same storage, and an in-place op on a view
    writes through to every tensor that shares the storage.
    """)
    return


@app.cell
def _(torch, y, y_cpu):
    z, z_cpu = y.clone(), y_cpu.clone()
    for t in (z, z_cpu):
        t[:, 0] = 0                      # index assignment on a view
        t.t()[2].mul_(10)                # in-place through a transposed view: column 2 of t
        t.view(-1)[:2].add_(100)         # through a flattened view
    print("tpu:\n", z.cpu())
    print("cpu:\n", z_cpu)
    print("same storage:", z.t().untyped_storage().data_ptr() == z.untyped_storage().data_ptr())
    print("tpu equals cpu:", torch.allclose(z.cpu(), z_cpu, atol=1e-5))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## dtypes, reductions, random numbers

    Type promotion follows PyTorch (an int tensor plus a float scalar is float). Random numbers are
    drawn on the device from a per-device generator: a seed reproduces the tpu stream (which is not
    the CPU generator's stream).
    """)
    return


@app.cell
def _(torch):
    ints = torch.arange(6, device="tpu").reshape(2, 3)
    halves = ints * 0.5                                    # int64 * float -> float32
    bf16 = halves.to(torch.bfloat16)
    print(ints.dtype, halves.dtype, bf16.dtype)
    print("sum over dim 0:", halves.sum(dim=0).cpu(), " argmax:", ints.argmax().item())
    torch.manual_seed(7)
    a = torch.rand(3, device="tpu")
    torch.manual_seed(7)
    b = torch.rand(3, device="tpu")
    print("same seed, same tpu numbers:", torch.equal(a.cpu(), b.cpu()), a.cpu())
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Reading results back

    Execution is asynchronous: an op returns as soon as its work is queued. Only a host read
    (`.cpu()`, `.item()`, `.tolist()`, `print`) or `torch.tpu.synchronize()` waits for the device.
    Time device work with a `synchronize()` before reading the clock.
    """)
    return


@app.cell
def _(torch, x):
    import time

    big = x.repeat(64, 16)                  # 256 x 128
    big @ big.t()                           # warm up: the first call compiles
    torch.tpu.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        out = big @ big.t()
    queued = time.perf_counter() - start
    torch.tpu.synchronize()
    done = time.perf_counter() - start
    print(f"10 matmuls queued in {queued * 1e3:.2f} ms, finished after {done * 1e3:.2f} ms")
    print("item():", out[0, 0].item(), " tolist():", out[0, :3].tolist())
    return (out,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## `torch.tpu` and what ran

    `torch.tpu` is shaped like `torch.cuda`: `is_available`, `device_count`, `current_device`,
    `set_device`, `device(...)` as a context manager, `synchronize`, `manual_seed`,
    `memory_allocated`, `max_memory_allocated`, `get_rng_state`, streams and events.
    `torchtpu.debug.metrics()` counts what the runtime did: ops by overload, executions, compiles,
    cache hits and CPU fallbacks (notebooks 4 and 8 go deeper).
    """)
    return


@app.cell
def _(mo, out, torch, torchtpu, w, w_cpu, x, x_cpu):
    with torch.tpu.device(0):
        current = torch.tpu.current_device()
    # `out` (the previous cell's) makes this cell run last; one more check against the CPU
    ok = torch.allclose((x @ w).cpu(), x_cpu @ w_cpu, atol=1e-5) and out.device.type == "tpu"
    m = torchtpu.debug.metrics()
    top = sorted(m["ops"].items(), key=lambda kv: -kv[1])[:8]
    rows = "\n".join(f"| `{op}` | {n} |" for op, n in top)
    mo.md(
        f"""
    current device: `{current}`; `x @ w` still equals the CPU: **{ok}**.

    The runtime ran **{m['executions']}** executions of **{m['kernel_cache_entries']}** cached kernels
    ({m['compiles']} compiled in this process, {m['disk_cache_hits']} loaded from the disk cache); CPU fallbacks: **{sum(m['cpu_fallbacks'].values())}**. The busiest overloads:

    | overload | calls |
    |---|---|
    {rows}
    """
    )
    return


if __name__ == "__main__":
    app.run()
