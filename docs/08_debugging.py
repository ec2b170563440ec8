"""Debugging a slow or falling-back model: the fallback warning and TORCHTPU_FALLBACK=error, the metrics
report, coverage --workload, the op tracer (per-op table, cache outcomes, a Chrome trace) and memory
statistics, then the fixes and the same measurements again."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="8. Debugging a slow or falling-back model")


@app.cell
def _():
    import os
    import pathlib
    import runpy
    import subprocess
    import sys
    import tempfile
    import textwrap

    import marimo as mo
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import torchtpu

    REPO = pathlib.Path(mo.notebook_dir()).resolve().parent
    return F, REPO, mo, nn, os, runpy, subprocess, sys, tempfile, textwrap, torch, torchtpu


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 8. Debugging a slow or falling-back model

    A model on tpu is slow for a few reasons, and each has a tool that shows it:

    | symptom | cause | tool |
    |---|---|---|
    | a warning `... has no spec yet, so it runs on the CPU` | an op without a spec: its inputs go to the host and back | `torchtpu.debug.metrics_report()`, `TORCHTPU_FALLBACK=error`, `python -m torchtpu.tools.coverage --workload prog.py` |
    | every step slow, compiles keep growing | shapes that change from step to step: each new shape is new executables | `torchtpu.debug.trace()` (cache column), `metrics()["compiles"]` |
    | one op dominates | a slow lowering, or a fallback | `torchtpu.debug.trace()`: the per-op table and a Chrome trace |
    | out of memory | too much alive at once | `torch.tpu.memory_summary()`, `max_memory_allocated()` |

    Below is a small program with two of these problems. We find both, fix them, and measure again.
    """)
    return


@app.cell(hide_code=True)
def _(tempfile, textwrap):
    # tagger.py, written to a temporary file (the next cell shows it)
    PROGRAM = textwrap.dedent(r'''
        """A per-position tagger: robust normalisation, then an MLP. Two slow spots, on purpose."""
        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        def row_median(x: torch.Tensor) -> torch.Tensor:
            return x.median(dim=-1, keepdim=True).values


        # A library's op with a CPU kernel only, as many third-party ops are (defined once per process).
        if not hasattr(torch.ops.tagger, "row_median"):
            torch.library.custom_op("tagger::row_median", row_median, mutates_args=(), device_types="cpu")


        class RobustNorm(nn.Module):
            """Centre each position's features on their median."""

            def forward(self, x):
                median = torch.ops.tagger.row_median(x)             # no tpu kernel: runs on the CPU
                centered = x - median
                return centered / centered.abs().mean(dim=-1, keepdim=True).clamp_min(1e-3)


        class Tagger(nn.Module):
            def __init__(self, features=16, classes=5):
                super().__init__()
                self.norm = RobustNorm()
                self.mlp = nn.Sequential(nn.Linear(features, 64), nn.GELU(), nn.Linear(64, classes))

            def forward(self, x):
                return self.mlp(self.norm(x))


        def batches(steps, seed=0):
            """Sequences of 8 to 32 positions, as text or audio batches come: a new shape every step."""
            g = torch.Generator().manual_seed(seed)
            for step in range(steps):
                length = int(torch.randint(8, 33, (), generator=g))
                yield torch.randn(8, length, 16, generator=g), torch.randint(0, 5, (8, length), generator=g)


        def train(model, device, steps=6, seed=0):
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            losses = []
            for x, y in batches(steps, seed):
                opt.zero_grad()
                loss = F.cross_entropy(model(x.to(device)).flatten(0, 1), y.to(device).flatten())
                loss.backward()
                opt.step()
                losses.append(loss.item())
            return losses


        if __name__ == "__main__":
            torch.manual_seed(0)
            print("losses:", train(Tagger().to("tpu"), "tpu"))
    ''')
    program_path = tempfile.NamedTemporaryFile("w", suffix="_tagger.py", delete=False).name
    with open(program_path, "w") as _f:
        _f.write(PROGRAM)
    return PROGRAM, program_path


@app.cell
def _(PROGRAM, mo):
    mo.md(f"**`tagger.py`**, the program under investigation:\n\n```python\n{PROGRAM.strip()}\n```")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 1. The warning and the metrics report

    Run it. An op without a spec warns **once**, naming itself, and then quietly runs on the CPU on
    every call: its inputs are copied to the host, PyTorch's CPU kernel runs, the result is copied
    back. `torchtpu.debug.metrics_report()` counts every call, so it shows how often that happened.
    """)
    return


@app.cell
def _(program_path, runpy, torch, torchtpu):
    tagger = runpy.run_path(program_path)          # the program's classes and functions, without running main
    torch.manual_seed(0)
    slow_losses = tagger["train"](tagger["Tagger"]().to("tpu"), "tpu")
    print(torchtpu.debug.metrics_report())
    return slow_losses, tagger


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. Make fallbacks errors, or list them for a whole program

    In a test or CI job, `TORCHTPU_FALLBACK=error` turns the first fallback into an exception
    that names the op (and your line, in the traceback). For a whole program,
    `python -m torchtpu.tools.coverage --workload prog.py` runs it and lists every op it ran on the
    CPU, with counts, which is the list of spec entries to add (notebook 3).
    """)
    return


@app.cell
def _(REPO, os, program_path, subprocess, sys):
    strict = subprocess.run([sys.executable, program_path], cwd=REPO, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, TORCHTPU_FALLBACK="error"))
    assert strict.returncode != 0
    _last = [line for line in strict.stderr.strip().splitlines() if line.strip()][-1]
    print(f"$ TORCHTPU_FALLBACK=error python tagger.py   -> exit status {strict.returncode}")
    print(_last)

    workload = subprocess.run([sys.executable, "-m", "torchtpu.tools.coverage", "--workload", program_path],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
    assert workload.returncode == 0, workload.stderr[-3000:]
    print("\n$ python -m torchtpu.tools.coverage --workload tagger.py")
    print(workload.stdout.strip())
    return (workload,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. The op tracer

    `with torchtpu.debug.trace() as t:` records every step the runtime takes inside the block: each
    spec kernel call (`kind="op"`), CPU fallback (`"fallback"`), host/device copy (`"copy"`) and
    compiled-graph run (`"graph"`); in fused eager mode each recorded op (`"recorded"`, its time the
    host's) and each block that runs (`"fused"`); with its input shapes, where its executable came
    from (`cache`: `"hit"` in the kernel cache, `"memory"`, `"disk"`, `"compile"`, or `"tape"`: fused
    mode's replay), compile
    milliseconds, execute microseconds and the device memory held after it. With the default
    `sync=True` each op waits for its result, so the times are the device's. `t.table()` sums the
    events per op, slowest first (printed when the block exits unless `print_table=False`), and
    `t.export_chrome_trace(path)` writes a file that Perfetto (ui.perfetto.dev) or
    `chrome://tracing` shows as a timeline.
    """)
    return


@app.cell
def _(tagger, torch, torchtpu):
    torch.manual_seed(0)
    slow_model = tagger["Tagger"]().to("tpu")
    with torchtpu.debug.trace(print_table=False) as slow_trace:
        tagger["train"](slow_model, "tpu", steps=6, seed=1)   # six batches this process has not seen
    print(slow_trace.table(top=15))
    return (slow_trace,)


@app.cell
def _(mo, slow_trace):
    fallback_events = [e for e in slow_trace.events if e.kind == "fallback"]
    misses = [e for e in slow_trace.events if e.kind == "op" and e.cache in ("compile", "disk", "memory")]
    addmm_shapes = sorted({e.shapes for e in slow_trace.events if e.name == "aten::addmm"})
    assert fallback_events and misses
    _first = fallback_events[0]
    _fallback_ms = sum(e.total_us for e in fallback_events) / 1e3
    _miss_ms = sum(e.total_us for e in misses) / 1e3
    _outcomes = {c: sum(e.cache == c for e in misses) for c in ("compile", "disk", "memory")}
    mo.md(
        f"""
    What the events say (`t.events`, a list of `torchtpu.debug.OpEvent`):

    - **{len(fallback_events)}** fallback events, {_fallback_ms:.1f} ms in all; the first:
      `{_first.name}` on `{_first.shapes}`.
    - **{len(misses)}** op calls found no executable in the kernel cache
      ({_outcomes["compile"]} compiled, {_outcomes["disk"]} loaded from disk, {_outcomes["memory"]} from
      the module-text cache), {_miss_ms:.1f} ms in all. `addmm` alone was called with
      **{len(addmm_shapes)}** different input shapes, for example `{addmm_shapes[0]}` and `{addmm_shapes[-1]}`.
    - the whole block took {slow_trace.wall_us / 1e3:.1f} ms.
    """
    )
    return


@app.cell
def _(mo, os, slow_trace, tempfile):
    chrome_path = os.path.join(tempfile.mkdtemp(prefix="torchtpu-trace-"), "tagger_trace.json")
    slow_trace.export_chrome_trace(chrome_path)
    mo.md(
        f"""
    `slow_trace.export_chrome_trace(...)` wrote `{chrome_path}` ({os.path.getsize(chrome_path)} bytes):
    open it in Perfetto or `chrome://tracing` to see the steps on a timeline, compiles as their own
    slices and device memory as a counter track. For a whole program,
    `python -m torchtpu.tools.report prog.py` writes this trace, the table and a memory plot as an
    HTML report.
    """
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. Memory

    tpu memory is counted the way `torch.cuda` counts it: `torch.tpu.memory_allocated()` is the bytes
    held by live device buffers now, `max_memory_allocated()` the peak since the start or since
    `reset_peak_memory_stats()`, and `memory_summary()` prints a table. There is no caching
    allocator: a buffer is freed as soon as its last tensor goes.
    """)
    return


@app.cell
def _(tagger, torch):
    torch.tpu.reset_peak_memory_stats()
    held_before = torch.tpu.memory_allocated()
    torch.manual_seed(0)
    memory_model = tagger["Tagger"]().to("tpu")
    tagger["train"](memory_model, "tpu", steps=2)           # (batches of seed 0: shapes seen before)
    print(f"held before: {held_before} bytes; peak during two training steps: "
          f"{torch.tpu.max_memory_allocated()} bytes; held now: {torch.tpu.memory_allocated()} bytes")
    print(torch.tpu.memory_summary())
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 5. The fixes

    - **The fallback:** `tagger::row_median` has a CPU kernel only. The median of a row is the
      middle element of the sorted row, and `sort` has a spec; for an even count `torch.median`
      returns the lower of the two middle values, index `(n - 1) // 2`. (For an ATen op without a
      spec, the lasting fix is a spec: notebook 3.)
    - **The shape churn:** pad every batch to one fixed length and ignore the padding in the loss
      (`ignore_index`), so every step reuses the same executables.
    """)
    return


@app.cell
def _(F, nn, tagger, torch):
    class SortedMedianNorm(nn.Module):
        def forward(self, x):
            middle = (x.shape[-1] - 1) // 2
            median = x.sort(dim=-1).values[..., middle:middle + 1]     # sort has a spec
            centered = x - median
            return centered / centered.abs().mean(dim=-1, keepdim=True).clamp_min(1e-3)

    PAD_TO = 32

    def train_fixed(model, device, steps=6, seed=0):
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        losses = []
        for x, y in tagger["batches"](steps, seed):
            pad = PAD_TO - x.shape[1]
            x = F.pad(x, (0, 0, 0, pad))                     # (8, 32, 16) whatever the length, padded on
            y = F.pad(y, (0, pad), value=-100)               # the host; padded positions: ignored by the loss
            opt.zero_grad()
            loss = F.cross_entropy(model(x.to(device)).flatten(0, 1), y.to(device).flatten(), ignore_index=-100)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    def fixed_model():
        torch.manual_seed(0)
        model = tagger["Tagger"]()
        model.norm = SortedMedianNorm()
        return model.to("tpu")

    return fixed_model, train_fixed


@app.cell
def _(fixed_model, slow_losses, tagger, torch, train_fixed):
    # Same numbers: the fixed program trains exactly like the original, on the CPU as on tpu.
    torch.manual_seed(0)
    reference = tagger["train"](tagger["Tagger"](), "cpu")
    fixed_losses = train_fixed(fixed_model(), "tpu")
    torch.testing.assert_close(torch.tensor(fixed_losses), torch.tensor(reference), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.tensor(slow_losses), torch.tensor(reference), rtol=1e-4, atol=1e-5)
    print("losses, original on CPU:", [round(v, 5) for v in reference])
    print("losses, fixed on tpu:   ", [round(v, 5) for v in fixed_losses])
    return


@app.cell
def _(fixed_model, torch, torchtpu, train_fixed):
    fast_model = fixed_model()
    train_fixed(fast_model, "tpu", steps=1, seed=2)          # warm up: the one padded shape
    with torchtpu.debug.trace(print_table=False) as fast_trace:
        train_fixed(fast_model, "tpu", steps=6, seed=1)      # the batches the slow trace ran
    print(fast_trace.table(top=10))
    assert torch.tpu.is_available()
    return (fast_trace,)


@app.cell
def _(fast_trace, mo, slow_trace):
    def summary(t):
        events = [e for e in t.events if e.depth == 0]
        return {
            "fallbacks": sum(e.kind == "fallback" for e in events),
            "cache misses": sum(e.kind == "op" and e.cache in ("compile", "disk", "memory") for e in events),
            "compile ms": sum(e.compile_ms for e in events),
            "steps": len(events),
            "ms for 6 training steps": t.wall_us / 1e3,
        }

    before, after = summary(slow_trace), summary(fast_trace)
    assert before["fallbacks"] and not after["fallbacks"] and not after["cache misses"]
    _rows = "\n".join(f"| {k} | {before[k]:.4g} | {after[k]:.4g} |" for k in before)
    mo.md(
        f"""
    The same six batches, traced:

    | | original | fixed |
    |---|---|---|
    {_rows}

    The fixed program runs no fallback and finds every executable in the kernel cache: each step
    reuses the executables of the first. Most of what the original spent beyond that went to
    building or loading executables for shapes it had not seen (the `compile ms` row); that cost
    returns with every new length, for as long as training runs. Padding does more arithmetic
    (32 positions for every batch), which is why real programs pad to a few bucket sizes rather
    than one. On the CPU plugin a fallback is cheap, since host and device share memory; on a TPU
    each one is a device-to-host-to-device round trip that also stalls the queue of work behind it.
    """
    )
    return


@app.cell
def _(os, program_path, workload):
    os.remove(program_path)     # after the last program run (`workload`)
    print(f"removed {program_path}; coverage exited {workload.returncode}")
    return


if __name__ == "__main__":
    app.run()
