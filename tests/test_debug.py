"""The debugging tools: the op tracer (torchtpu.debug.trace), torch.profiler ranges, and memory
statistics as torch.cuda reports them."""

import json
import os
import warnings

import pytest
import torch

import torchtpu
from conftest import eager_mode

TPU = torch.device("tpu")


def traced(fn, **kwargs):
    with torchtpu.debug.trace(print_table=False, **kwargs) as t:
        result = fn()
    return t, result


def test_trace_in_fused_mode_records_each_op_and_the_blocks_that_run_them():
    x_cpu = torch.randn(29, 11)
    x = x_cpu.to(TPU)

    def step():
        return torch.sinh(x * 5.0).cpu()  # a host read: the block runs

    with eager_mode("fused"):
        step()  # the tape learns the block
        t, values = traced(lambda: [step() for _ in range(2)])
    torch.testing.assert_close(values[1], torch.sinh(x_cpu * 5.0))
    sinh = [e for e in t.events if e.name == "aten::sinh"]
    assert [e.kind for e in sinh] == ["recorded"] * 2 and all(e.shapes == "f32[29, 11]" for e in sinh)
    assert all(e.cache == "tape" and e.compile_ms == 0 and e.execute_us > 0 for e in sinh)  # replayed
    blocks = [e for e in t.events if e.kind == "fused"]
    assert len(blocks) == 2 and all(e.cache == "tape" for e in blocks)  # each block's executable from the tape
    assert blocks[0].start_us > sinh[0].start_us
    rows = {r["name"]: r for r in t.summary()}
    assert rows["aten::sinh"]["tape"] == 2
    assert "aten::sinh" in t.table()


def test_trace_records_each_op_with_its_cache_outcome_and_times(strict_eager):
    x_cpu = torch.randn(37, 13)
    x = x_cpu.to(TPU)
    # A shape no other test uses: the first call builds a module, the second finds it in the kernel cache.
    t, (first, second) = traced(lambda: (torch.tanh(x * 3.0), torch.tanh(x * 3.0)))
    torch.testing.assert_close(first.cpu(), torch.tanh(x_cpu * 3.0))
    torch.testing.assert_close(second.cpu(), first.cpu())

    tanh = [e for e in t.events if e.name == "aten::tanh"]
    assert len(tanh) == 2
    assert all(e.kind == "op" and e.shapes == "f32[37, 13]" and e.device == 0 and e.depth == 0 for e in tanh)
    built, cached = tanh
    assert built.cache in ("compile", "disk", "memory") and built.compile_ms > 0
    assert cached.cache == "hit" and cached.compile_ms == 0
    assert cached.execute_us > 0 and cached.start_us > built.start_us
    assert [e.name for e in t.events if e.name.startswith("aten::mul")] == ["aten::mul.Tensor"] * 2
    # Memory after each step: the second result is held on top of the first.
    assert cached.live_bytes >= built.live_bytes >= 37 * 13 * 4

    rows = {r["name"]: r for r in t.summary()}
    assert rows["aten::tanh"]["calls"] == 2 and rows["aten::tanh"]["hit"] == 1
    table = t.table()
    assert "aten::tanh" in table and "synchronized" in table and "CPU fallbacks: 0 calls" in table


def test_trace_records_fallbacks_copies_and_their_nesting():
    x_cpu = torch.tensor([[1.0, 2.0, 2.0, 5.0], [3.0, 3.0, 1.0, 1.0], [0.0, 4.0, 4.0, 4.0]])
    x = x_cpu.to(TPU)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # _add_relu has no spec: it falls back to the CPU, warned once
        t, result = traced(lambda: torch.ops.aten._add_relu.Scalar(x, -2.0))
    torch.testing.assert_close(result.cpu(), torch.relu(x_cpu - 2.0))

    fallback = [e for e in t.events if e.kind == "fallback"]
    assert [e.name for e in fallback] == ["aten::_add_relu.Scalar"]
    assert fallback[0].shapes.startswith("f32[3, 4]")
    # The fallback moves its tensors to the CPU and back: copies one level inside it.
    copies = [e for e in t.events if e.kind == "copy"]
    assert any(e.name == "aten::_copy_from tpu:0->cpu" and e.depth == 1 for e in copies)
    assert any(e.name == "aten::_copy_from cpu->tpu:0" and e.depth == 1 for e in copies)
    # Counted once, at the top level.
    assert [r["name"] for r in t.summary() if r["kind"] == "copy"] == []
    assert "CPU fallbacks: 1 calls" in t.table()

    t, value = traced(lambda: x.sum().item())
    assert value == x_cpu.sum().item()
    assert [e.name for e in t.events if e.kind == "copy"] == ["aten::_local_scalar_dense (.item())"]


def test_trace_records_compiled_graph_captures_and_runs(strict_eager):
    def f(a, b):
        return torch.relu(a @ b) + 1.0

    compiled = torch.compile(f, backend="tpu")
    a_cpu, b_cpu = torch.randn(5, 7), torch.randn(7, 3)
    a, b = a_cpu.to(TPU), b_cpu.to(TPU)
    t, results = traced(lambda: [compiled(a, b) for _ in range(3)])
    for r in results:
        torch.testing.assert_close(r.cpu(), f(a_cpu, b_cpu))
    graphs = [e for e in t.events if e.kind == "graph"]
    captured = [e for e in graphs if e.name.endswith("(captured)")]
    assert len(captured) == 1
    graph_id = captured[0].name.split()[1]
    runs = [e for e in graphs if e.name == f"graph {graph_id}"]
    # A graph compiles when it first runs on its own (in fused mode its calls join blocks instead).
    assert len(runs) == 3 and runs[0].cache == "compile" and runs[0].compile_ms > 0, runs
    assert all(e.cache == "hit" for e in runs[1:]) and all(e.execute_us > 0 for e in runs)
    # Inside the graph, nothing ran op by op.
    assert not [e for e in t.events if e.name == "aten::mm" and e.start_us > captured[0].start_us]


def test_chrome_trace_export(tmp_path):
    x = torch.randn(8, 8, device=TPU)
    t, _ = traced(lambda: (x @ x).sum().cpu())
    path = t.export_chrome_trace(str(tmp_path / "trace.json"))
    data = json.load(open(path))
    slices = [e for e in data["traceEvents"] if e["ph"] == "X" and e["cat"] != "compile"]
    assert [e["name"] for e in slices] == [e.name for e in t.events]
    for s, e in zip(slices, t.events):
        assert s["ts"] == e.start_us and s["dur"] == pytest.approx(e.total_us)
        assert s["args"]["shapes"] == e.shapes and s["args"]["cache"] == e.cache
    counters = [e for e in data["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == len(t.events) and all("live bytes" in c["args"] for c in counters)
    assert any(e["ph"] == "M" and e["args"]["name"] == "tpu:0" for e in data["traceEvents"])


def test_traces_do_not_nest_and_stop_on_errors():
    with torchtpu.debug.trace(print_table=False):
        with pytest.raises(RuntimeError, match="already running"):
            with torchtpu.debug.trace(print_table=False):
                pass
    with pytest.raises(ValueError):
        with torchtpu.debug.trace(print_table=False):
            raise ValueError("user code failed")
    # The failed trace ended: a new one starts.
    t, _ = traced(lambda: torch.ones(2, device=TPU) + 1)
    assert t.events


def test_trace_without_synchronizing_keeps_the_program_asynchronous(strict_eager):
    x = torch.randn(16, 16, device=TPU)
    t, y = traced(lambda: x @ x, sync=False)
    assert [e.name for e in t.events] == ["aten::mm"]
    assert "not synchronized" in t.table()
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu(), rtol=1e-4, atol=1e-4)


def test_profiler_shows_tpu_ops_and_their_device_time(strict_eager):
    x = torch.randn(23, 29, device=TPU)
    with torch.profiler.profile() as prof:
        y = torch.sigmoid(x @ x.t())  # a shape no other test uses: its modules are built under the profiler
        y.cpu()
    names = {e.key: e.count for e in prof.key_averages()}
    assert names.get("aten::mm") == 1 and names.get("aten::sigmoid") == 1
    assert names.get("tpu::execute", 0) >= 2 and names.get("tpu::copy", 0) >= 1
    assert names.get("tpu::compile", 0) >= 2
    # The execute ranges sit inside their ops.
    mm = next(e for e in prof.events() if e.name == "aten::mm")
    assert any(c.name == "tpu::execute" for c in mm.cpu_children)


def test_memory_statistics_count_device_buffers_as_cuda_does():
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == before

    x = torch.ones(256, 4).to(TPU)  # one 4 KiB buffer
    assert torch.tpu.memory_allocated() == before + 4096
    assert torch.tpu.max_memory_allocated() >= before + 4096
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == before + 4096
    assert stats["allocation.all.current"] >= 1 and stats["allocation.all.allocated"] >= 1
    assert stats["reserved_bytes.all.current"] == stats["allocated_bytes.all.current"]  # no caching allocator
    assert torch.accelerator.memory_allocated() == torch.tpu.memory_allocated()

    del x
    assert torch.tpu.memory_allocated() == before
    assert torch.tpu.max_memory_allocated() >= before + 4096
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == before

    summary = torch.tpu.memory_summary()
    assert "Allocated memory" in summary and "tpu:0" in summary
    torch.tpu.empty_cache()  # nothing cached; allowed as on cuda
    with pytest.raises(ValueError, match="Expected a tpu device"):
        torch.tpu.memory_allocated("cpu")


def test_device_memory_stats_are_the_plugins_view():
    stats = torch.tpu.device_memory_stats()
    if not stats:  # a plugin may keep no count (PJRT lets it answer UNIMPLEMENTED)
        assert "plugin's allocator" not in torch.tpu.memory_summary()
        return
    x = torch.ones(1 << 20).to(TPU)  # 4 MiB
    assert torch.tpu.device_memory_stats()["bytes_in_use"] >= 4 << 20
    assert "plugin's allocator" in torch.tpu.memory_summary()
    del x


def test_out_of_memory_is_torchs_error_and_the_process_goes_on(strict_eager):
    held = torch.ones(1024).to(TPU)
    torch.zeros(4, dtype=torch.uint8, device=TPU).add_(1)  # the small scalars the runtime keeps, made now
    before = torch.tpu.memory_allocated()
    # far beyond any host's or chip's memory: the plugin refuses the allocation
    huge = torch.zeros(1 << 48, dtype=torch.uint8, device=TPU)  # a fill: no buffer of its size yet
    with pytest.raises(torch.OutOfMemoryError, match=r"TPU out of memory on tpu:0.*Tensors hold"):
        huge.add_(1)  # the add's result is the allocation
    del huge
    assert torch.tpu.memory_allocated() == before
    assert torch.equal((held + 1).cpu(), torch.full((1024,), 2.0))


def test_fused_eager_mode_is_the_default_on_a_tpu_only():
    from torchtpu import _plugins

    assert _plugins.default_eager_mode("tpu") == "fused"
    assert _plugins.default_eager_mode("cpu") == _plugins.default_eager_mode("cuda") == "strict"
    if "TORCHTPU_EAGER_MODE" not in os.environ:  # this process started in its platform's default
        platform = torch.tpu.get_device_properties(0).platform
        assert torch.tpu.get_eager_mode() == _plugins.default_eager_mode(platform)


def test_eager_modes_switch_and_give_the_same_results(strict_eager):
    assert torch.tpu.get_eager_mode() == "strict"
    x = torch.randn(64, 64)
    strict = (x.to(TPU) @ x.to(TPU)).relu().sum(0).cpu()
    torch.tpu.set_eager_mode("blocking")  # every op waits for the device before it returns
    try:
        assert torch.tpu.get_eager_mode() == "blocking"
        assert "eager mode:          blocking" in torchtpu.debug.metrics_report()
        blocking = (x.to(TPU) @ x.to(TPU)).relu().sum(0).cpu()
        with pytest.raises(torch.OutOfMemoryError):  # raised by the op itself
            torch.zeros(1 << 48, dtype=torch.uint8, device=TPU).add_(1)
    finally:
        torch.tpu.set_eager_mode("strict")
    assert torch.equal(strict, blocking)
    with pytest.raises(ValueError, match="mode must be one of 'strict', 'blocking'"):
        torch.tpu.set_eager_mode("lazy")


def test_eager_mode_from_the_environment():
    from conftest import run_python

    code = "import torch, torchtpu; print(torch.tpu.get_eager_mode())"
    proc = run_python(code, {"TORCHTPU_EAGER_MODE": "blocking"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "blocking"


def test_donated_buffers_are_not_counted_twice():
    # An in-place update donates its storage's buffer to the execution: the result takes its memory,
    # so the peak does not count both (eager ops and torch.tpu.graph replays alike).
    p, q = torch.zeros(1 << 16, device=TPU), torch.zeros(1 << 16, device=TPU)

    def step():
        p.add_(1)
        q.mul_(2).add_(p)

    step()
    graph = torch.tpu.TPUGraph()
    with torch.tpu.graph(graph):
        step()
    for run in (step, graph.replay):
        torch.tpu.synchronize()
        held = torch.tpu.memory_allocated()
        torch.tpu.reset_peak_memory_stats()
        run()
        torch.tpu.synchronize()
        assert torch.tpu.memory_allocated() == held
        assert torch.tpu.max_memory_allocated() == held, run
    assert torch.equal(p.cpu(), torch.full((1 << 16,), 3.0))
