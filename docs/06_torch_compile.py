"""torch.compile(backend="tpu"): a compiled model and a compiled training step, executions per step
eager against compiled, and the graph counters: captures, recompiles and their reasons, splits."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="6. torch.compile")


@app.cell
def _():
    import copy
    import time

    import marimo as mo
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import torchtpu

    return F, copy, mo, nn, time, torch, torchtpu


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 6. Graph mode: `torch.compile(backend="tpu")`

    In eager mode every op is one executable run: a training step of a small model is dozens of
    executions, each with its own dispatch and launch overhead. `torch.compile(model, backend="tpu")`
    hands the Python to dynamo, which traces it into graphs; AOTAutograd splits each graph into a
    forward and a backward graph; on the first call each graph is *captured* (it runs once through
    the same spec kernels as eager mode, recording instead of executing) into **one** StableHLO
    module, compiled once and cached like eager kernels. Later calls run the module as one
    executable.

    In fused eager mode (`torch.tpu.set_eager_mode("fused")`) compiled graphs do not run one by one:
    each call joins the pending fused block as a call of the graph's module, so a training step's
    forward, backward and optimizer graphs run as **one** module a step (the README's "Graph mode").
    """)
    return


@app.cell
def _(F, copy, nn, torch, torchtpu):
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(16, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)) for _ in range(4)]

    def executions() -> int:
        return torchtpu.debug.metrics()["executions"]

    def train(model, steps=4):
        """Per step: the loss and how many executables ran."""
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        out = []
        for x, y in batches[:steps]:
            before = executions()
            opt.zero_grad()
            loss = F.cross_entropy(model(x.to("tpu")), y.to("tpu"))
            loss.backward()
            opt.step()
            value = loss.item()
            out.append((value, executions() - before))
        return out

    eager = train(copy.deepcopy(base).to("tpu"))
    compiled_model = torch.compile(copy.deepcopy(base).to("tpu"), backend="tpu")
    compiled = train(compiled_model)
    return base, batches, compiled, eager, executions


@app.cell
def _(compiled, eager, mo, torch):
    torch.testing.assert_close(torch.tensor([l for l, _ in compiled]), torch.tensor([l for l, _ in eager]),
                               rtol=1e-4, atol=1e-5)
    _rows = "\n".join(f"| {i} | {le:.5f} | {ne} | {lc:.5f} | {nc} |"
                      for i, ((le, ne), (lc, nc)) in enumerate(zip(eager, compiled)))
    mo.md(
        f"""
    | step | eager loss | eager executions | compiled loss | compiled executions |
    |---|---|---|---|---|
    {_rows}

    The losses are the same. Compiled, the forward pass is one module and the backward pass another;
    the optimizer step (not compiled here) still runs its `_foreach_*` kernels eagerly. Step 0 of the
    compiled model also captured and compiled its graphs.
    """
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Compiling the whole step

    Compile a function that does the forward pass, backward pass and `opt.step()` and the optimizer
    joins the graphs: its updates of parameters and optimizer state are written back into their
    storages in place (and donated, so there is no second copy).
    """)
    return


@app.cell
def _(F, base, batches, copy, executions, mo, time, torch):
    model = copy.deepcopy(base).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def train_step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    step = torch.compile(train_step, backend="tpu")
    on_device = [(x.to("tpu"), y.to("tpu")) for x, y in batches]
    per_step = []
    for _x, _y in on_device:
        _before, _start = executions(), time.perf_counter()
        _loss = step(_x, _y).item()
        per_step.append((_loss, executions() - _before, (time.perf_counter() - _start) * 1e3))
    _rows = "\n".join(f"| {i} | {l:.5f} | {n} | {ms:.1f} |" for i, (l, n, ms) in enumerate(per_step))
    mo.md(
        f"""
    | step | loss | executions | ms |
    |---|---|---|---|
    {_rows}

    The first two calls capture (the optimizer creates its state on the first step, so the second
    sees different inputs and captures again); from then on a whole training step is
    **{per_step[-1][1]}** executions.
    """
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## What the graph counters say

    `torchtpu.debug.metrics()["graph"]` counts graph mode's work: `graphs` (compiled modules),
    `captures`, `executions`, `recompiles` with their `recompile_reasons`, and `splits` by op.
    Shapes are static: a new input shape captures a new module once (dynamo may then mark the size
    dynamic, which is one more capture), and the reason is recorded.
    """)
    return


@app.cell
def _(compiled_model, torch, torchtpu):
    before = torchtpu.debug.metrics()["graph"]
    compiled_model(torch.randn(5, 16, device="tpu"))      # batch 5 instead of 32: a recompile
    compiled_model(torch.randn(5, 16, device="tpu"))      # cached now
    after = torchtpu.debug.metrics()["graph"]
    print("recompiles:", after["recompiles"] - before["recompiles"])
    for reason in after["recompile_reasons"][len(before["recompile_reasons"]):]:
        print("  reason:", reason)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Graph breaks and splits

    Two things cut a program into several modules:

    - **graph breaks** are dynamo's: Python it cannot trace (a `.item()`, a branch on a tensor's
      value) ends a graph, and each piece is compiled on its own. `torch._dynamo.explain` lists them.
    - **splits** are torchtpu's: a node that cannot be part of a module (an op without a spec, a
      data-dependent output shape, a collective) runs eagerly between two captured parts. An op
      without a spec warns once and is counted under `splits`.
    """)
    return


@app.cell
def _(torch):
    def branchy(a):
        b = a.sin()
        if b.sum().item() > 0:        # reads a value: dynamo breaks the graph here
            return b * 2
        return b - 1

    explained = torch._dynamo.explain(branchy)(torch.randn(5, device="tpu"))
    print(f"graphs: {explained.graph_count}, graph breaks: {explained.graph_break_count}")
    for _r in explained.break_reasons:
        print("  break:", str(_r.reason).splitlines()[0])
    return (explained,)


@app.cell
def _(torch, torchtpu):
    def positive_part(a):
        # relu(a - 0.5) through aten::_add_relu, an internal fused op with no spec: the graph is split around it
        centered = torch.ops.aten._add_relu.Scalar(a, -0.5)
        return centered / (centered.abs().mean() + 1e-6)

    splits_before = dict(torchtpu.debug.metrics()["graph"]["splits"])
    values = torch.randn(64)
    scaled = torch.compile(positive_part, backend="tpu")(values.to("tpu"))
    splits = torchtpu.debug.metrics()["graph"]["splits"]
    print("split around:", {op: n - splits_before.get(op, 0) for op, n in splits.items() if n != splits_before.get(op, 0)})
    print(f"the result is on {scaled.device}; equal to the CPU's:", torch.allclose(scaled.cpu(), positive_part(values), atol=1e-5))
    return (scaled,)


@app.cell
def _(explained, mo, scaled, torchtpu):
    assert explained.graph_break_count and scaled.device.type == "tpu"   # (runs after both cells above)
    report = torchtpu.debug.metrics_report()
    graph_lines = [line for line in report.splitlines() if "graph" in line or "recompiled" in line or "split" in line]
    mo.md("`torchtpu.debug.metrics_report()`, its graph lines:\n\n```\n" + "\n".join(graph_lines) + "\n```")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Habits that keep graphs whole

    - Keep shapes fixed (pad the last batch) or expect one capture per new shape.
    - Keep `.item()`, `print(tensor)` and branches on values out of the compiled function.
    - A Python number in a graph is a constant of its module (dynamo specialises it): a learning
      rate that changes every step belongs in a tensor, or every new value recompiles.
    - Every example in `examples/` takes `--compile`: `python examples/llama.py --tiny --compile`.
    """)
    return


if __name__ == "__main__":
    app.run()
