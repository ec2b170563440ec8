"""The report tool (python -m torchtpu.tools.report) and the charts it and the benchmarks draw."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types

import pytest

import torchtpu
from torchtpu.debug import OpEvent
from torchtpu.tools import plots, report

pytest.importorskip("matplotlib")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CHART_FILES = ["time_split.png", "time_per_family.png", "compile_vs_execute.png", "cpu_fallbacks.png", "memory.png"]

# A few tpu ops from known spec files (abs: unary, add: elementwise), one op with no spec (aten::_add_relu
# runs on the CPU), a copy back to the host, its own arguments and a module beside it.
PROGRAM = """\
import sys
import torch
import report_helper

def main():
    x = torch.randn(4, 8, device="tpu")
    y = x.abs() + 1.0
    for _ in range(2):
        torch.ops.aten._add_relu.Scalar(y, -2.0)
    print("host", y.cpu().shape, report_helper.NAME, sys.argv[1:])
    if "--fail" in sys.argv:
        raise ValueError("boom after the ops")
    if "--exit" in sys.argv:
        sys.exit(3)

if __name__ == "__main__":
    main()
"""


def assert_png(path) -> None:
    with open(path, "rb") as f:
        data = f.read()
    assert data.startswith(PNG_MAGIC), path
    assert len(data) > 3000, (path, len(data))  # a drawn chart, not an empty canvas


@pytest.fixture
def program(tmp_path):
    (tmp_path / "report_helper.py").write_text("NAME = 'helper beside the program'\n")
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM)
    return path


# --- plots -------------------------------------------------------------------------------------

def test_plots_write_pngs(tmp_path):
    out = lambda name: str(tmp_path / name)  # noqa: E731
    written = [
        plots.bar_chart(out("bar.png"), "time per family", ["unary", "binary", "CPU fallback"], [3.0, 10.0, 50.0],
                        "ms", horizontal=True, notes=["3 calls", "1 call", "2 calls"]),
        plots.grouped_bar_chart(out("grouped.png"), "modes", ["llama train", "resnet train"],
                                {"eager": [30.0, 50.0], "compiled": [5.0, None], "never ran": [None, None]},
                                "ms", log=True, reference=10.0, reference_label="target"),
        plots.stacked_bar_chart(out("stacked.png"), "compile vs execute", ["unary", "nn"],
                                {"compile": [3.0, 5.0], "execute": [1.0, 2.0]}, "ms", horizontal=True),
        plots.line_chart(out("line.png"), "memory", {"tpu:0": ([0.0, 1.0, 2.0, 5.0], [0, 100, 300, 200])}, "ms",
                         "KiB", steps=True, mark_peak=True, peak_format="peak {y:.0f} KiB at {x:.1f} ms"),
        plots.draw(out("two.png"), plots.Lines("bw", {"a": ([4096, 16384], [0.1, 0.3])}, xlog=2,
                                               xticks=[(4096, "4 KiB"), (16384, "16 KiB")]),
                   plots.Bars("empty", [], {"": []}, empty_text="nothing ran"), title="two charts"),
        plots.bar_chart(out("empty.png"), "no fallbacks", [], [], empty_text="no CPU fallbacks"),
    ]
    for path in written:
        assert_png(path)


def test_plots_reject_mismatched_data(tmp_path):
    with pytest.raises(ValueError, match="3 labels"):
        plots.bar_chart(str(tmp_path / "x.png"), "t", ["a", "b", "c"], [1.0, 2.0])
    with pytest.raises(ValueError, match="2 x values and 1 y values"):
        plots.line_chart(str(tmp_path / "y.png"), "t", {"s": ([0, 1], [1])})


# --- analysis, from made-up events --------------------------------------------------------------

def event(name, kind, start_us, compile_ms=0.0, execute_us=10.0, depth=0, cache="hit", live=0, shapes="f32[4]"):
    return OpEvent(name, kind, shapes, cache, start_us, compile_ms, execute_us, live, 0, depth)


def test_analysis_families_fallbacks_and_findings():
    families = {"abs": "specs/unary.yaml", "add.Tensor": "specs/elementwise.yaml"}
    events = [
        event("aten::abs", "op", 0, compile_ms=2.0, execute_us=100, cache="compile", live=64),
        event("aten::add.Tensor", "op", 3000, execute_us=50, live=128),
        # a fallback whose copies (depth 1) built an executable: it counts as the fallback's compile time
        event("aten::_cummax_helper", "fallback", 4000, execute_us=5000, live=256),
        event("aten::_copy_from tpu:0->cpu", "copy", 4100, compile_ms=1.0, execute_us=1200, depth=1, cache="disk"),
        event("aten::_copy_from tpu:0->cpu", "copy", 9500, execute_us=100, live=96),
        event("graph 1", "graph", 9700, execute_us=200, live=512),
    ]
    a = report.analyze(events, wall_us=20000, sync=True, families=families, memory_before={0: 32})
    by_name = {f.name: f for f in a.families}
    assert set(by_name) == {"unary", "elementwise", report.FALLBACK, report.COPIES, report.GRAPHS}
    assert by_name["unary"].source == "specs/unary.yaml" and by_name["unary"].compile_ms == 2.0
    fallback = by_name[report.FALLBACK]
    assert fallback.calls == 1 and fallback.compile_ms == 1.0 and fallback.execute_ms == pytest.approx(4.0)
    assert a.fallbacks == [("_cummax_helper", 1, pytest.approx(5.0))]
    assert a.recorded_ms == pytest.approx(2.0 + 0.1 + 0.05 + 5.0 + 0.1 + 0.2)
    assert a.parts[report.OUTSIDE] == pytest.approx(20.0 - a.recorded_ms)
    xs, ys = a.memory[0]
    assert ys[0] == 32 and max(ys) == 512 and xs == sorted(xs)
    text = " ".join(f.title + " " + f.detail for f in a.findings)
    assert "_cummax_helper" in text and "Add a spec" in text
    assert "outside recorded steps" in text  # most of the 20 ms is between the steps


def test_analysis_sees_late_compiles_and_small_ops():
    # 300 small cached ops, then the same op compiled again for new shapes late in the run
    events = [event("aten::add.Tensor", "op", i * 100, execute_us=20) for i in range(300)]
    events += [event("aten::add.Tensor", "op", 30000 + i * 1000, compile_ms=5.0, cache="compile",
                     shapes=f"f32[{i + 5}]") for i in range(4)]
    a = report.analyze(events, wall_us=40000, sync=True, families={"add.Tensor": "specs/elementwise.yaml"})
    titles = [f.title for f in a.findings]
    assert any("compiled in the second half of the run" in t for t in titles), titles
    assert any("small eager ops" in t for t in titles), titles
    late = next(f for f in a.findings if "second half" in f.title)
    assert "aten::add.Tensor (4 shapes" in late.detail


def test_analysis_of_nothing():
    a = report.analyze([], wall_us=1000, sync=True, families={})
    assert a.findings[0].title == "Nothing ran on tpu."


# --- the tool, on a real program ------------------------------------------------------------

def html_of(out) -> str:
    return (out / "report.html").read_text(encoding="utf-8")


def test_report_on_a_small_program(tmp_path, program, capsys):
    out = tmp_path / "rep"
    argv = sys.argv[:]
    assert report.main([str(program), "--out", str(out), "--", "--steps", "2"]) == 0
    assert sys.argv == argv  # restored
    printed = capsys.readouterr().out
    assert "host torch.Size([4, 8]) helper beside the program ['--steps', '2']" in printed
    assert f"report written to {out / 'report.html'}" in printed

    for name in CHART_FILES:
        assert_png(out / name)
    page = html_of(out)
    assert page.count("src='data:image/png;base64,") == len(CHART_FILES)  # self-contained
    assert "aten::_add_relu.Scalar" in page and "Add a spec" in page
    assert "specs/unary.yaml" in page and "<td>unary</td>" in page  # abs's family
    assert "<td>elementwise</td>" in page  # add's
    assert "python " + str(program) + " --steps 2" in page
    assert "torchtpu memory summary" in page and "ops executed:" in page  # memory_summary, metrics_report

    trace = json.loads((out / "trace.json").read_text())
    steps = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    names = {e["name"] for e in steps}
    assert {"aten::abs", "aten::add.Tensor", "aten::_add_relu.Scalar"} <= names, names
    assert [e["cat"] for e in steps if e["name"] == "aten::_add_relu.Scalar"] == ["fallback", "fallback"]
    assert any(e["cat"] == "copy" and e["name"].endswith("->cpu") for e in steps)


def test_report_of_a_failing_program(tmp_path, program, capsys):
    out = tmp_path / "rep"
    assert report.main([str(program), "--out", str(out), "--", "--fail"]) == 1
    captured = capsys.readouterr()
    assert "ValueError: boom after the ops" in captured.err  # the program's traceback, as Python prints it
    page = html_of(out)
    assert "raised ValueError: boom after the ops" in page and "status 1" in page
    assert "aten::_add_relu.Scalar" in page  # what ran before the failure is there
    assert "aten::abs" in (out / "trace.json").read_text()

    assert report.main([str(program), "--out", str(tmp_path / "exit"), "--", "--exit"]) == 3
    assert "exited with status 3" in html_of(tmp_path / "exit")


def test_report_user_mistakes(tmp_path, capsys):
    assert report.main([str(tmp_path / "missing.py")]) == 2
    assert "no such program" in capsys.readouterr().err
    prog = tmp_path / "p.py"
    prog.write_text("pass\n")
    (tmp_path / "file").write_text("")
    assert report.main([str(prog), "--out", str(tmp_path / "file" / "sub")]) == 2
    assert "cannot write the report" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        report.main([str(prog), "--steps", "2"])
    assert stop.value.code == 2
    assert "go after --" in capsys.readouterr().err


def test_report_command_line_has_no_traceback_for_a_missing_program(tmp_path):
    from conftest import skip_if_device_is_exclusive

    skip_if_device_is_exclusive()
    proc = subprocess.run([sys.executable, "-m", "torchtpu.tools.report", str(tmp_path / "nope.py")],
                          capture_output=True, text=True, cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 2
    assert "no such program" in proc.stderr and "Traceback" not in proc.stderr


# --- the benchmarks' --plot, from made-up results (running them takes minutes) -----------------

def load_benchmark(name: str, monkeypatch) -> types.ModuleType:
    monkeypatch.setattr(sys, "path", list(sys.path))  # compile_step puts examples/ on it
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(REPO, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_eager_overhead_plot(tmp_path, monkeypatch):
    bench = load_benchmark("eager_overhead", monkeypatch)
    path = tmp_path / "eager.png"
    bench.plot(str(path), [("add (x + y)", 7.0, 2.5, 3.2), ("mm (x @ y)", 17.5, 2.8, 2.7)], 2.5, "8x8 float32")
    assert_png(path)


def test_compile_step_plot(tmp_path, monkeypatch):
    bench = load_benchmark("compile_step", monkeypatch)
    R = bench.Result
    results = {"llama": {"train": {"tpu eager": R(ms=30.0), "tpu compiled": R(ms=5.0), "cpu eager": R(ms=12.0),
                                   "jax.jit": R(ms=4.5)},
                         "inference": {"tpu eager": R(ms=9.0), "tpu compiled": R(note="failed"),
                                       "cpu eager": R(ms=3.0), "jax.jit": R(ms=1.0)}},
               "resnet": {"train": {"tpu eager": R(ms=19.0), "tpu compiled": R(ms=8.0), "cpu eager": R(ms=4.5),
                                    "jax.jit": R(note="Llama only")}}}
    path = tmp_path / "compile.png"
    bench.plot(str(path), results)
    assert_png(path)


def test_collectives_plot(tmp_path, monkeypatch):
    bench = load_benchmark("collectives", monkeypatch)
    tpu, gloo = bench.TRANSPORTS
    results = [{"world": 1, "allreduce": {}, "ddp": {tpu: {"seconds": 0.02}, gloo: {"seconds": 0.004}}},
               {"world": 2, "allreduce": {tpu: {"4096": {"seconds": 1e-3}, "16384": {"seconds": 2e-3}},
                                          gloo: {"4096": {"seconds": 5e-4}, "16384": {"seconds": 9e-4}}},
                "ddp": {tpu: {"seconds": 0.03}, gloo: {"seconds": 0.005}}}]
    path = tmp_path / "collectives.png"
    bench.plot(str(path), results, [4096, 16384], types.SimpleNamespace(batch=8))
    assert_png(path)


# --- the benchmarks themselves, at their smallest (the flags keep working) --------------------

def run_benchmark(name: str, *args: str) -> subprocess.CompletedProcess:
    from conftest import skip_if_device_is_exclusive

    skip_if_device_is_exclusive()
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", f"{name}.py"), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_compile_step_runs_its_size_dtype_and_mode_flags():
    proc = run_benchmark("compile_step", "--model", "llama", "--size", "tiny", "--dtype", "bfloat16",
                         "--precision", "medium", "--modes", "tpu graph,tpu eager", "--steps", "1", "--warmup", "0")
    out = proc.stdout
    assert "Llama tiny, bfloat16, matmul precision medium" in out
    assert "tokens/s" in out and "peak MiB" in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("train ", "inference "))]
    graph = [r for r in rows if r[1:3] == ["tpu", "graph"]]
    assert len(graph) == 2 and all(float(r[3]) > 0 for r in graph)  # a median per phase
    assert any(r[1:3] == ["cpu", "eager"] and "not in --modes" in " ".join(r) for r in rows)


def test_compile_step_isolate_runs_each_mode_and_phase_in_its_own_process():
    proc = run_benchmark("compile_step", "--model", "llama", "--isolate", "--modes", "tpu graph,tpu eager",
                         "--phases", "inference", "--steps", "1", "--warmup", "0")
    out = proc.stdout
    assert out.count("--isolate: inference") == 2  # one process per mode of the one phase
    rows = [line.split() for line in out.splitlines() if line.startswith(("train ", "inference "))]
    merged = [r for r in rows if "/" not in r][-10:]  # the parent's table: every mode of both phases
    assert [r for r in merged if r[0] == "train" and "not in --phases" in " ".join(r)]
    ran = [r for r in merged if r[0] == "inference" and r[1] == "tpu" and r[2] in ("graph", "eager")]
    assert len(ran) == 2 and all(float(r[3]) > 0 for r in ran)


def test_compile_step_device_profile_sums_each_device_op_per_step(monkeypatch):
    bench = load_benchmark("compile_step", monkeypatch)
    N = types.SimpleNamespace

    def event(name, ns, **stats):
        return N(name=name, duration_ns=ns, stats=list(stats.items()))

    device = N(name="/device:TPU:0", lines=[
        N(name="XLA Modules", events=[event("jit_train(1)", 9e6), event("jit_train(1)", 11e6)]),
        N(name="XLA Ops", events=[event("%fusion.1 = f32[8]", 4e6, long_name="fusion.1 text", hlo_category="loop fusion"),
                                  event("%fusion.1 = f32[8]", 6e6), event("%sort = u32[4]", 1e6),
                                  *[event("%add.1 = f32[]", 2e3, hlo_category="scalar")] * 4])])
    host = N(name="/host:CPU", lines=[N(name="python", events=[event("step", 5e7)])])
    by_line, counts, hlo, categories = bench.device_time_by_line([host, device], steps=2)
    assert by_line["XLA Modules"] == {"jit_train(1)": 10.0}  # ms per step
    assert by_line["XLA Ops"] == {"%fusion.1 = f32[8]": 5.0, "%sort = u32[4]": 0.5, "%add.1 = f32[]": 0.004}
    assert counts == {"%fusion.1 = f32[8]": 2, "%sort = u32[4]": 1, "%add.1 = f32[]": 4}
    assert hlo["%fusion.1 = f32[8]"] == "fusion.1 text" and "python" not in by_line
    assert categories == {"%fusion.1 = f32[8]": "loop fusion", "%sort = u32[4]": "other", "%add.1 = f32[]": "scalar"}
    # per step: fusion.1 once at 5 ms, the 1 ms sort every other step, the add twice at 2 us
    by_category, by_length = bench.op_time_classes(by_line["XLA Ops"], counts, categories, steps=2)
    assert by_category == "by category: loop fusion 5.00 ms, other 0.50 ms, scalar 0.00 ms"
    assert by_length == "by op length: < 5 us 2 ops 0.00 ms, >= 500 us 2 ops 5.50 ms"


def test_compile_step_table_sets_device_times_side_by_side(monkeypatch, capsys):
    bench = load_benchmark("compile_step", monkeypatch)
    R = bench.Result
    modes = {m: R(note="not in --modes") for m in bench.MODES}
    train = dict(modes, **{"tpu graph": R(ms=35.4, first_s=58.8, device_ms=33.2), "jax.jit": R(ms=32.8, device_ms=30.6)})
    bench.print_table("llama", {"train": train, "inference": dict(modes)}, tokens=4096, flops=None)
    assert "device time per step (--profile): jax.jit 30.60 ms, tpu graph 33.20 ms (1.08x)" in capsys.readouterr().out


def test_compile_step_profile_flag_runs():
    proc = run_benchmark("compile_step", "--model", "llama", "--modes", "tpu graph", "--phases", "inference",
                         "--steps", "1", "--warmup", "0", "--profile", "1")
    # jax is the profiler: without it (the test extra) the mode says so; with it, the device's part
    assert ("--profile inference tpu graph: 1 steps, wall" in proc.stdout
            or "--profile inference tpu graph: needs jax" in proc.stdout), proc.stdout[-2000:]


def test_eager_overhead_dispatch_variants():
    proc = run_benchmark("eager_overhead", "--iterations", "20", "--repeats", "1", "--dispatch-variants")
    for variant in ("portable, outputs dropped", "assigned, outputs kept"):
        assert variant in proc.stdout
