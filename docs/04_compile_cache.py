"""The compile cache: what compiles and what is reused in a process, where the persistent cache lives,
and a second process that compiles nothing."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="4. The compile cache")


@app.cell
def _():
    import json
    import os
    import pathlib
    import subprocess
    import sys
    import tempfile
    import textwrap

    import marimo as mo
    import torch

    import torchtpu

    REPO = pathlib.Path(mo.notebook_dir()).resolve().parent
    return REPO, json, mo, os, pathlib, subprocess, sys, tempfile, textwrap, torch, torchtpu


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 4. The compile cache

    Every eager op on tpu runs an XLA executable. On an op's first call with a given input layout
    (dtype, sizes, strides) the runtime emits a small StableHLO module and compiles it; the
    executable, and the output layout that goes with it, are kept under a key, so every later call
    with the same layout skips shape inference, emission and compilation. Compiled modules are also
    written to a persistent directory, so a *new process* loads them instead of compiling again.

    | tier | lives | key | counted in `torchtpu.debug.metrics()` as |
    |---|---|---|---|
    | kernel cache | this process | op + input layouts + compile-time attributes | `kernel_cache_entries` |
    | module text | this process | the StableHLO text | `memory_cache_hits` |
    | disk | `TORCHTPU_CACHE_DIR` (default `~/.cache/torchtpu/compile`; `0` turns it off) | module text, compile options, plugin identity | `disk_cache_hits`, `disk_cache_writes`, `disk_cache_rejected` |
    | none: compile | | | `compiles`, `compile_seconds` |
    """)
    return


@app.cell
def _(torchtpu):
    KEYS = ["executions", "compiles", "kernel_cache_entries", "memory_cache_hits", "disk_cache_hits", "disk_cache_writes"]

    def counters() -> dict:
        m = torchtpu.debug.metrics()
        return {k: m[k] for k in KEYS}

    def delta(before: dict, after: dict) -> dict:
        return {k: after[k] - before[k] for k in KEYS}

    def table(rows: list) -> str:
        head = "| call | " + " | ".join(KEYS) + " |\n|---|" + "---|" * len(KEYS) + "\n"
        return head + "\n".join(f"| {name} | " + " | ".join(str(d[k]) for k in KEYS) + " |" for name, d in rows)

    return counters, delta, table


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## In one process

    Each row is what one call added to the counters. The first `softplus` of a new shape needs an
    executable (compiled, or loaded from disk if an earlier run of this notebook left it there);
    the second call with the same shape only executes. A new shape is a new key. Python numbers are
    runtime values by default, so `x * 2.0` and `x * 3.0` share one executable.
    """)
    return


@app.cell
def _(counters, delta, mo, table, torch):
    import torch.nn.functional as F

    rows = []

    def measure(name, fn):
        before = counters()
        out = fn()
        out.cpu()  # wait for it
        rows.append((name, delta(before, counters())))
        return out

    x, other = torch.randn(37, 53, device="tpu"), torch.randn(37, 53, device="tpu")
    wider = torch.randn(38, 53, device="tpu")
    measure("softplus(x), first time for 37x53", lambda: F.softplus(x))
    measure("softplus(x), again", lambda: F.softplus(x))
    measure("softplus(other), same shape, other values", lambda: F.softplus(other))
    measure("softplus(wider), new shape 38x53", lambda: F.softplus(wider))
    measure("x * 2.0", lambda: x * 2.0)
    measure("x * 3.0, another scalar", lambda: x * 3.0)
    mo.md(table(rows))
    return (rows,)


@app.cell
def _(mo, os, rows, torchtpu):
    # Where the persistent cache of this process is (TORCHTPU_CACHE_DIR, else the default).
    cache = torchtpu._plugins.cache_dir()
    entries = [os.path.join(cache, name) for name in os.listdir(cache)] if cache and os.path.isdir(cache) else []
    size_mb = sum(os.path.getsize(p) for p in entries) / 2**20
    again = rows[1][1]
    mo.md(
        f"""
    The second call ran **{again['executions']}** execution and compiled **{again['compiles']}**.

    This process's persistent cache: `{cache or '(disabled)'}`, **{len(entries)}** entries,
    **{size_mb:.1f} MiB**. Each entry is one compiled executable, written atomically and checked when
    loaded: a truncated, corrupt or foreign file is dropped and compiled again, never trusted.
    """
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## A second process compiles nothing

    The same small training step runs in three fresh processes, all with a new, empty
    `TORCHTPU_CACHE_DIR`. The first compiles every executable and writes it; the second loads them
    all from disk and compiles **nothing**; before the third, one cache entry is truncated: the runtime
    rejects it, compiles that one module again, and the losses stay the same.
    """)
    return


@app.cell
def _(REPO, json, os, subprocess, sys, tempfile, textwrap):
    PROGRAM = r'''
    import json, time
    import torch, torchtpu
    start = time.perf_counter()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(16, 32).to("tpu"), torch.randn(16, 1).to("tpu")
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(round(loss.item(), 6))
    m = torchtpu.debug.metrics()
    print(json.dumps({"seconds": round(time.perf_counter() - start, 2), "losses": losses,
                      **{k: m[k] for k in ("compiles", "compile_seconds", "disk_cache_hits",
                                           "disk_cache_writes", "disk_cache_rejected")}}))
    '''

    def run_program(cache_dir: str) -> dict:
        env = dict(os.environ, TORCHTPU_CACHE_DIR=cache_dir)
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(PROGRAM)], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    fresh_cache = tempfile.mkdtemp(prefix="torchtpu-cache-")
    first = run_program(fresh_cache)
    second = run_program(fresh_cache)
    victim = sorted(os.listdir(fresh_cache))[0]
    with open(os.path.join(fresh_cache, victim), "r+b") as f:
        f.truncate(os.path.getsize(f.name) // 2)        # a torn write, as a crash might leave it
    third = run_program(fresh_cache)
    assert second["compiles"] == 0 and second["losses"] == first["losses"] == third["losses"]
    return first, fresh_cache, second, third


@app.cell
def _(first, mo, second, third):
    def row(name, r):
        return (f"| {name} | {r['compiles']} | {r['compile_seconds']:.2f} | {r['disk_cache_hits']} | "
                f"{r['disk_cache_writes']} | {r['disk_cache_rejected']} | {r['seconds']:.2f} | {r['losses']} |")

    mo.md(
        f"""
    | process | compiles | compile s | disk loads | disk writes | rejected | step time s | losses |
    |---|---|---|---|---|---|---|---|
    {row("1st, empty cache", first)}
    {row("2nd, same cache", second)}
    {row("3rd, one entry truncated", third)}
    """
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## What this means for you

    - The first run of a model on a machine pays for compilation; runs after it (and other programs
      with the same ops and shapes) load from disk. Compiled graphs from `torch.compile(backend="tpu")`
      share the same two tiers (notebook 6).
    - Changing shapes costs compiles: every new input layout of an op is a new executable. Fixed
      batch and sequence sizes (pad the last batch) keep the count small; notebook 8 shows how to spot
      shape churn.
    - Entries are keyed by the plugin's identity too, so a cache directory can be shared between
      machines and plugin versions without ever loading a foreign executable.
    - `TORCHTPU_CACHE_DIR=0` turns the disk tier off (every process compiles); deleting the directory
      is always safe.
    """)
    return


@app.cell
def _(first, fresh_cache, third):
    import shutil

    shutil.rmtree(fresh_cache, ignore_errors=True)
    print(f"the scratch cache is gone; the first process compiled {first['compiles']}, the third {third['compiles']}")
    return


if __name__ == "__main__":
    app.run()
