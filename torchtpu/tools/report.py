"""Runs a program under torchtpu's op tracer and writes a report of where its time went.

    python -m torchtpu.tools.report prog.py                      # writes torchtpu-report/report.html
    python -m torchtpu.tools.report prog.py --out DIR -- --steps 5   # the program's own arguments after --
    python -m torchtpu.tools.report prog.py --no-sync            # keep the program asynchronous

The program runs as `python prog.py args` would (its argv, its directory first on sys.path, as
__main__) inside `torchtpu.debug.trace()`. DIR then holds:

  report.html             self-contained (the charts are embedded): where the time went, why the
                          program is slow (computed from the trace), the families of ops, the CPU
                          fallbacks, device memory over time, the top ops, the metrics and memory summary
  time_split.png          compiling / executing / fallbacks / copies / graphs / outside recorded steps
  time_per_family.png     time per op family (a family is a spec file: specs/unary.yaml -> "unary")
  compile_vs_execute.png  per family, the time spent building executables under the time running them
  cpu_fallbacks.png       the ops with no spec that ran on the CPU, with their call counts
  memory.png              device memory held over time, the peak marked
  trace.json              the Chrome trace (open it in https://ui.perfetto.dev or chrome://tracing)

With sync (the default) every step waits for its results, so its execute time is the device's own;
--no-sync keeps the program's asynchrony and an execute time is the time to enqueue the step.
A program that raises or exits non-zero still gets a report of what ran; the tool then exits with
its status (1 for an exception).
"""

from __future__ import annotations

import argparse
import base64
import collections
import dataclasses
import datetime
import html
import os
import shlex
import statistics
import sys
import time

import torchtpu
from torchtpu.tools import run_as_main

CHARTS = {  # key: (file, heading)
    "split": ("time_split.png", "Where the time went"),
    "families": ("time_per_family.png", "Time per op family"),
    "compile": ("compile_vs_execute.png", "Compile vs execute per family"),
    "fallbacks": ("cpu_fallbacks.png", "CPU fallbacks"),
    "memory": ("memory.png", "Device memory over time"),
}
FALLBACK, COPIES, GRAPHS, BLOCKS, NO_SPEC = ("CPU fallback", "copies", "compiled graphs", "fused blocks",
                                             "ops without a spec file")
OUTSIDE = "outside recorded steps"


# --- Running the program ---------------------------------------------------------------------

@dataclasses.dataclass
class Run:
    """A program run under the tracer."""

    program: str
    args: list[str]
    sync: bool
    trace: "torchtpu.debug.Trace"
    status: int              # what `python prog.py` would have exited with
    error: str | None        # how it ended, when not cleanly
    wall_s: float            # the program's wall time, as the tool measured it
    metrics_before: dict
    metrics_after: dict
    memory_before: dict[int, int]  # bytes held on each device before the program started


def run_program(program: str, args: list[str], sync: bool = True) -> Run:
    """Runs `program` as `python program args...` would, inside `torchtpu.debug.trace()`. Never raises for
    the program's own failure: the traceback is printed (as Python would) and the status recorded."""
    memory_before = {d: torchtpu.device.memory_allocated(d) for d in range(torchtpu.device.device_count())}
    metrics_before = torchtpu.debug.metrics()
    trace = torchtpu.debug.trace(sync=sync, print_table=False)
    start = time.perf_counter()
    with trace:
        status, error = run_as_main(program, args)
    wall_s = time.perf_counter() - start
    return Run(program, list(args), sync, trace, status, error, wall_s, metrics_before,
               torchtpu.debug.metrics(), memory_before)


# --- What the trace says ---------------------------------------------------------------------

@dataclasses.dataclass
class Family:
    name: str
    source: str          # "specs/unary.yaml", or what the family stands for
    calls: int = 0
    compile_ms: float = 0.0
    execute_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return self.compile_ms + self.execute_ms


@dataclasses.dataclass
class Finding:
    title: str
    detail: str
    share: float  # of the wall time, to order findings by


@dataclasses.dataclass
class Analysis:
    wall_ms: float
    recorded_ms: float
    parts: dict[str, float]                      # the wall time split: part -> ms
    families: list[Family]
    fallbacks: list[tuple[str, int, float]]      # (op, calls, ms)
    memory: dict[int, tuple[list[float], list[int]]]  # device -> (ms, live bytes)
    builds: dict[str, tuple[int, float]]         # cache outcome -> (executables built or loaded, ms)
    findings: list[Finding]
    notes: list[str]


def spec_families() -> dict[str, str]:
    """Every spec'd ATen overload -> its spec file ("add.Tensor" -> "specs/elementwise.yaml")."""
    return {name: source.split(":")[0] for name, _, source in torchtpu._C.spec_overloads()}


def family_of(event, families: dict[str, str]) -> tuple[str, str]:
    """(family, what it stands for) of a recorded step."""
    if event.kind == "fallback":
        return FALLBACK, "ops with no spec, run by PyTorch's CPU kernels"
    if event.kind == "copy":
        return COPIES, "host <-> device and device <-> device copies"
    if event.kind == "graph":
        return GRAPHS, "torch.compile(backend=\"tpu\") modules"
    if event.kind == "fused":
        return BLOCKS, "fused eager mode's blocks, each one module (its ops are in their families as recorded)"
    source = families.get(event.name.removeprefix("aten::"))
    if source is None:
        return NO_SPEC, "ops the runtime runs itself"
    return os.path.splitext(os.path.basename(source))[0], source


def fmt_ms(ms: float) -> str:
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    if ms >= 1:
        return f"{ms:.1f} ms"
    return f"{ms * 1000:.0f} µs"


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def pct(part: float, whole: float) -> str:
    if whole <= 0:
        return "-"
    return "<1%" if 0 < part < 0.005 * whole else f"{100 * part / whole:.0f}%"


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def analyze(events, wall_us: float, sync: bool, families: dict[str, str], metrics_before: dict | None = None,
            metrics_after: dict | None = None, memory_before: dict[int, int] | None = None) -> Analysis:
    """The numbers and findings of a report from a trace's events (sorted by start, as `Trace.events`)."""
    metrics_before, metrics_after = metrics_before or {}, metrics_after or {}
    wall_ms = wall_us / 1e3

    # Each top-level step with the compiles of the steps inside it (a fallback's copies build
    # executables too): its compile and execute times, so nothing is counted twice.
    steps: list[list] = []  # [event, compile_ms, execute_ms]
    for e in events:
        if e.depth == 0:
            steps.append([e, e.compile_ms, e.execute_us / 1e3])
        elif steps:
            steps[-1][1] += e.compile_ms
            steps[-1][2] = max(steps[-1][2] - e.compile_ms, 0.0)
    recorded_ms = sum(s[0].total_us for s in steps) / 1e3
    compile_ms = sum(s[1] for s in steps)

    by_family: dict[str, Family] = {}
    by_kind = collections.Counter()
    for e, comp, exe in steps:
        name, source = family_of(e, families)
        f = by_family.setdefault(name, Family(name, source))
        f.calls += 1
        f.compile_ms += comp
        f.execute_ms += exe
        by_kind[e.kind] += exe
    family_list = sorted(by_family.values(), key=lambda f: -f.total_ms)
    parts = {
        "compiling (building or loading executables)": compile_ms,
        "executing spec kernels": by_kind["op"],
        "compiled graphs running": by_kind["graph"],
        "recording ops (fused eager mode)": by_kind["recorded"],
        "fused blocks running": by_kind["fused"],
        "CPU fallbacks": by_kind["fallback"],
        "copies": by_kind["copy"],
        OUTSIDE: max(wall_ms - recorded_ms, 0.0),
    }

    fallback_rows: dict[str, list] = {}
    for e, comp, exe in steps:
        if e.kind == "fallback":
            row = fallback_rows.setdefault(e.name.removeprefix("aten::"), [0, 0.0])
            row[0] += 1
            row[1] += comp + exe
    fallbacks = sorted(((op, n, ms) for op, (n, ms) in fallback_rows.items()), key=lambda r: -r[2])

    memory: dict[int, tuple[list[float], list[int]]] = {}
    for device, held in (memory_before or {}).items():
        if any(e.device == device for e in events):
            memory[device] = ([0.0], [held])
    for e in sorted(events, key=lambda e: e.start_us + e.total_us):  # live_bytes is what is held after it
        xs, ys = memory.setdefault(e.device, ([], []))
        xs.append((e.start_us + e.total_us) / 1e3)
        ys.append(e.live_bytes)

    built = [e for e in events if e.compile_ms > 0]
    builds: dict[str, tuple[int, float]] = {}
    for e in built:
        n, ms = builds.get(e.cache or "?", (0, 0.0))
        builds[e.cache or "?"] = (n + 1, ms + e.compile_ms)

    analysis = Analysis(wall_ms, recorded_ms, parts, family_list, fallbacks, memory, builds, [], [])
    analysis.findings = findings(analysis, events, steps, built, sync, metrics_before, metrics_after)
    if not sync:
        analysis.notes.append("measured with --no-sync: an execute time is the time to enqueue the step; the "
                              "device's work shows up where the program waits for it (reads back to the host) or "
                              "outside recorded steps. Run without --no-sync to time each step on the device.")
    return analysis


def findings(a: Analysis, events, steps, built, sync: bool, before: dict, after: dict) -> list[Finding]:
    """Why the program is slow, in the words of its own numbers, most costly first."""
    out: list[Finding] = []
    wall = max(a.wall_ms, 1e-9)
    startup = None  # the first executable's build, when it is a once-per-process start-up
    if not events:
        return [Finding("Nothing ran on tpu.", "The tracer recorded no step: the program made no tensor on device "
                        "\"tpu\" (move the model and data with .to(\"tpu\")), or it failed before it did.", 1.0)]

    # Compiling. The first executable a process builds or loads also starts the plugin's compiler.
    compile_ms = a.parts["compiling (building or loading executables)"]
    fresh_n, fresh_ms = a.builds.get("compile", (0, 0.0))
    disk_n, disk_ms = a.builds.get("disk", (0, 0.0))
    others = [e.compile_ms for e in built[1:]]
    if built and built[0].compile_ms > 300 and built[0].compile_ms > 5 * statistics.median(others or [0.0]):
        startup = built[0]
    if compile_ms / wall >= 0.2 or (startup is not None and startup.compile_ms / wall >= 0.1):
        title = f"{pct(compile_ms, wall)} of the time went to building executables ({fmt_ms(compile_ms)})"
        built_how = [f"{plural(n, 'executable')} {how} ({fmt_ms(ms)})" for n, ms, how in [
            (fresh_n, fresh_ms, "compiled"), (disk_n, disk_ms, "loaded from the disk cache")] if n]
        detail = [" and ".join(built_how).capitalize() + "."] if built_how else []
        if startup is not None:
            title += f", {fmt_ms(startup.compile_ms)} of it the first one (a once-per-process start-up)"
            detail.append(f"The first, {html.escape(startup.name)} ({startup.cache or 'built'}), took "
                          f"{fmt_ms(startup.compile_ms)}" + (f" against a median {fmt_ms(statistics.median(others))} "
                                                             "for the others" if others else "")
                          + ": the first executable a process builds or loads pays a one-time start-up of the "
                          "plugin's compiler, not that op's cost; a longer run amortizes it.")
        written = after.get("disk_cache_writes", 0) - before.get("disk_cache_writes", 0)
        if fresh_n and os.environ.get("TORCHTPU_CACHE_DIR") != "0":
            detail.append(f"{plural(written, 'new executable')} went to the disk cache: a second run of the same "
                          "program loads them instead of compiling." if written else
                          "Compiled executables are cached on disk: a second run loads them instead of compiling.")
        elif fresh_n:
            detail.append("The disk cache is off (TORCHTPU_CACHE_DIR=0): every run compiles everything again.")
        detail.append("Short runs are dominated by compiling: time more steps to see the steady state.")
        out.append(Finding(title + ".", " ".join(detail), compile_ms / wall))

    # Executables still compiled late in the run: a repeated step compiles in its first pass only.
    late = [e for e in built if e.cache == "compile" and e.kind != "graph" and e.start_us > a.wall_ms * 1e3 / 2]
    late_ms = sum(e.compile_ms for e in late)
    if len(late) >= 3 and late_ms >= 0.02 * wall:
        shapes: dict[str, list] = {}
        for e in late:
            shapes.setdefault(e.name, []).append(e.shapes)
        names = sorted(shapes.items(), key=lambda kv: -len(kv[1]))
        out.append(Finding(
            f"{plural(len(late), 'executable')} compiled in the second half of the run ({fmt_ms(late_ms)}).",
            "A program that repeats one step compiles during its first pass only; these came later, so input shapes "
            "(or dtypes) keep changing: " + ", ".join(f"{html.escape(n)} ({plural(len(set(v)), 'shape')}, e.g. "
                                                     f"{html.escape(v[-1])})" for n, v in names[:5])
            + ". Each new shape is a new executable: keep shapes fixed (pad the last batch, bucket sequence lengths).",
            late_ms / wall))

    # Graph mode: recompiles and splits.
    graph_before, graph_after = before.get("graph", {}), after.get("graph", {})
    recompiles = graph_after.get("recompiles", 0) - graph_before.get("recompiles", 0)
    if recompiles > 0:
        reasons = graph_after.get("recompile_reasons", [])[len(graph_before.get("recompile_reasons", [])):]
        captures = [s for s in steps if s[0].kind == "graph" and s[1] > 0]
        ms = sum(s[1] for s in captures)
        out.append(Finding(f"torch.compile recompiled {recompiles} time{'s' if recompiles > 1 else ''}.",
                           "Each recompile captures and compiles a new module"
                           + (f" (graph captures took {fmt_ms(ms)} in all)" if captures else "") + ". Reasons: "
                           + "; ".join(html.escape(r) for r in reasons[-5:]) + ". Shapes that change between calls "
                           "are the usual cause: keep them fixed, or mark the changing dimension dynamic.",
                           ms / wall))
    splits_before = graph_before.get("splits", {})
    splits = {op: n - splits_before.get(op, 0) for op, n in graph_after.get("splits", {}).items()
              if n > splits_before.get(op, 0)}
    if splits:
        out.append(Finding(f"Compiled graphs were split around {len(splits)} op{'s' if len(splits) > 1 else ''}.",
                           "These ran eagerly between captured modules: " + ", ".join(
                               f"{html.escape(op)} ({n})" for op, n in sorted(splits.items(), key=lambda kv: -kv[1]))
                           + ". An op with no spec, a data-dependent shape or a collective splits a graph.", 0.0))

    # CPU fallbacks.
    if a.fallbacks:
        ms = sum(r[2] for r in a.fallbacks)
        calls = sum(r[1] for r in a.fallbacks)
        names = ", ".join(f"<code>{html.escape(op)}</code> ({n} call{'s' if n > 1 else ''}, {fmt_ms(t)})"
                          for op, n, t in a.fallbacks[:8])
        more = f" and {len(a.fallbacks) - 8} more" if len(a.fallbacks) > 8 else ""
        out.append(Finding(
            f"{len(a.fallbacks)} op{'s' if len(a.fallbacks) > 1 else ''} with no spec ran on the CPU: {calls} calls, "
            f"{fmt_ms(ms)} ({pct(ms, wall)}).",
            f"{names}{more}. Each call copies its inputs to the host, runs PyTorch's CPU kernel and copies the "
            "results back. Add a spec for each (an entry in a file of specs/, see README \"Adding an op\" and "
            "docs/03_adding_an_op.py); TORCHTPU_FALLBACK=error raises at the first one, showing where it is called.",
            max(ms / wall, 0.05)))

    # Copies: reads back to the host wait for the device.
    reads = [s for s in steps if s[0].kind == "copy" and s[0].name.endswith("->cpu")]
    writes = [s for s in steps if s[0].kind == "copy" and "cpu->" in s[0].name]
    copy_ms = a.parts["copies"]
    if len(reads) >= 10 or copy_ms / wall >= 0.1:
        read_ms = sum(s[1] + s[2] for s in reads)
        write_ms = sum(s[1] + s[2] for s in writes)
        out.append(Finding(
            f"{len(reads)} reads back to the host and {len(writes)} copies to the device ({fmt_ms(copy_ms)}, "
            f"{pct(copy_ms, wall)}).",
            f"Reads (.cpu(), .item(), .tolist(), print of a tpu tensor) took {fmt_ms(read_ms)}: each waits for "
            "every step queued before it, so a read per training step keeps the host from running ahead. Read less "
            "often (accumulate a loss on the device, .item() it every N steps). Copies to the device took "
            f"{fmt_ms(write_ms)}: make tensors on the device (device=\"tpu\") or move data once, not per step.",
            copy_ms / wall))

    # Many small eager ops.
    ops = [s for s in steps if s[0].kind == "op"]
    graphs = [s for s in steps if s[0].kind == "graph"]
    outside = a.parts[OUTSIDE]
    gaps = []  # (ms without a recorded step, when it began in ms, the step before it, the step after it)
    end_us, previous = 0.0, None
    for e, _, _ in steps:
        gaps.append(((e.start_us - end_us) / 1e3, end_us / 1e3, previous, f"{e.name} ({e.shapes})"))
        end_us, previous = max(end_us, e.start_us + e.total_us), f"{e.name} ({e.shapes})"
    gaps.append((a.wall_ms - end_us / 1e3, end_us / 1e3, previous, None))
    if len(ops) >= 200:
        median_us = statistics.median(s[2] for s in ops) * 1e3
        median_gap_us = statistics.median(g[0] for g in gaps[1:-1]) * 1e3
        if median_us < 1000:
            advice = ("Run the step under torch.compile(model, backend=\"tpu\") (or compile the whole train step): "
                      "each graph then runs as one executable, with one dispatch instead of hundreds."
                      if not graphs else
                      f"{len(graphs)} compiled-graph runs happened too: these eager ops ran around them (graph breaks "
                      "or code outside the compiled function); compile more of the step.")
            out.append(Finding(
                f"{len(ops)} small eager ops: median {median_us:.0f} µs "
                f"{'on the device' if sync else 'to enqueue'} each, with a median "
                f"{median_gap_us:.0f} µs between one step and the next.",
                f"With ops this small the time goes to launching them (Python, the dispatcher, the runtime) rather "
                f"than computing. {advice}", (len(ops) * median_gap_us / 1e3 + sum(s[2] for s in ops)) / wall))

    # Time outside recorded steps.
    if outside / wall >= 0.3:
        long_gaps = sorted((g for g in gaps if g[0] >= max(0.1 * outside, 1.0)), key=lambda g: -g[0])[:3]
        where = "; ".join(stretch(*g) for g in long_gaps)
        tracing = sum(g[0] for g in gaps if g[3] and g[3].startswith("graph ") and "(captured)" in g[3])
        out.append(Finding(
            f"{pct(outside, wall)} of the wall time ({fmt_ms(outside)}) was outside recorded steps.",
            "That is the program's own Python, PyTorch's dispatcher and autograd, work on CPU tensors, imports, "
            "data preparation and torch.compile's tracing: no tpu op ran then."
            + (f" The longest stretches without a tpu step: {where} (the Chrome trace shows what ran around "
               "them)." if where else "")
            + (f" {fmt_ms(tracing)} of it came right before a compiled graph's first run: torch.compile tracing "
               "the Python (dynamo, AOTAutograd), once per new graph or recompile." if tracing >= 0.1 * outside
               else "")
            + " To see inside them, profile with python -m cProfile or torch.profiler.", outside / wall))

    # The single most expensive op.
    if steps:
        top = max(a.families, key=lambda f: f.total_ms)
        by_name: dict[str, list] = {}
        for e, comp, exe in steps:
            row = by_name.setdefault(e.name, [0, 0.0])
            row[0] += 1
            row[1] += comp + exe
        name, (calls, ms) = max(by_name.items(), key=lambda kv: kv[1][1])
        of_it = (f", {fmt_ms(startup.compile_ms)} of it the start-up above"
                 if startup is not None and startup.name == name else "")
        out.append(Finding(
            f"The costliest step is {html.escape(name)}: {plural(calls, 'call')}, {fmt_ms(ms)} "
            f"({pct(ms, wall)}{of_it}); the costliest family is {html.escape(top.name)} ({fmt_ms(top.total_ms)}).",
            "See the top ops table and the family charts below for the rest.", 0.0))

    out.sort(key=lambda f: -f.share)
    return out


def stretch(ms: float, at: float, before: str | None, after: str | None) -> str:
    """A time without recorded steps, for people."""
    if before and after:
        place = f"between {before} and {after}"
    elif after:
        place = f"before the first step ({after})"
    elif before:
        place = f"after the last step ({before})"
    else:
        place = "with no step at all"
    return f"{fmt_ms(ms)} at {fmt_ms(at)}, {html.escape(place)}"


# --- Writing the report ----------------------------------------------------------------------

def draw_charts(a: Analysis, out_dir: str) -> tuple[dict[str, str], str | None]:
    """The report's PNGs: {key: path}, and why there are none if matplotlib is missing."""
    from torchtpu.tools import plots

    paths = {key: os.path.join(out_dir, name) for key, (name, _) in CHARTS.items()}
    try:
        parts = [(k, v) for k, v in a.parts.items()]
        plots.bar_chart(paths["split"], f"Where {fmt_ms(a.wall_ms)} of wall time went", [k for k, _ in parts],
                        [v for _, v in parts], "ms", horizontal=True, notes=[pct(v, a.wall_ms) for _, v in parts],
                        colors=[plots.PALETTE[i] for i in range(len(parts) - 1)] + [plots.GREY])
        fams = a.families
        plots.bar_chart(paths["families"], "Time per op family (top-level steps)", [f.name for f in fams],
                        [f.total_ms for f in fams], "ms (compile + execute)", horizontal=True,
                        notes=[f"{plural(f.calls, 'call')}, {pct(f.total_ms, a.wall_ms)}" for f in fams],
                        empty_text="no tpu steps recorded")
        plots.stacked_bar_chart(paths["compile"], "Compile vs execute per family", [f.name for f in fams],
                                {"compile (or load from cache)": [f.compile_ms for f in fams],
                                 "execute": [f.execute_ms for f in fams]}, "ms", horizontal=True,
                                empty_text="no tpu steps recorded")
        plots.bar_chart(paths["fallbacks"], "CPU fallbacks (ops with no spec)", [op for op, _, _ in a.fallbacks],
                        [ms for _, _, ms in a.fallbacks], "ms", horizontal=True, colors=[plots.PALETTE[3]],
                        notes=[plural(n, 'call') for _, n, _ in a.fallbacks],
                        empty_text="no CPU fallbacks: every op ran from a spec")
        peak = max((max(ys) for _, ys in a.memory.values() if ys), default=0)
        unit, scale = next(((u, s) for u, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
                            if peak >= s), ("B", 1))
        plots.line_chart(paths["memory"], "Device memory held after each step",
                         {f"tpu:{d}": (xs, [y / scale for y in ys]) for d, (xs, ys) in sorted(a.memory.items())},
                         "ms since the trace started", unit, steps=True, markers=False, mark_peak=True,
                         peak_format="peak {y:.2f} " + unit + " at {x:.0f} ms", empty_text="no tpu steps recorded")
    except plots.PlotsUnavailable as missing:
        return {}, str(missing)
    return paths, None


def embed(path: str) -> str:
    with open(path, "rb") as f:
        return "data:image/png;base64," + base64.b64encode(f.read()).decode("ascii")


class Markup(str):
    """A table cell that is HTML already."""


def table(headers: list[str] | None, rows: list[list], right_from: int = 1) -> str:
    """An HTML table; cells are escaped unless they are Markup; columns from `right_from` align right."""
    def cell(tag: str, i: int, c) -> str:
        text = c if isinstance(c, Markup) else html.escape(str(c))
        return f"<{tag}{' class=r' if i >= right_from else ''}>{text}</{tag}>"

    head = "<tr>" + "".join(cell("th", i, h) for i, h in enumerate(headers)) + "</tr>" if headers else ""
    body = "".join("<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { padding: 2px 10px; border-bottom: 1px solid #eee; text-align: left; } .r { text-align: right; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
img { max-width: 100%; } .failed { color: #b00; font-weight: bold; } li { margin-bottom: 0.6em; }
code { background: #f3f3f3; padding: 0 3px; }
"""


def write_html(path: str, run: Run, a: Analysis, charts: dict[str, str], chart_note: str | None,
               metrics_text: str, memory_text: str) -> None:
    command = " ".join(shlex.quote(p) for p in ["python", run.program, *run.args])
    trace = run.trace
    status = (f"<span class=failed>{html.escape(run.error or '')} (status {run.status}): the report covers what "
              "ran before it ended</span>" if run.status else "finished (status 0)")
    sync_note = ("synchronized: each step waited for its results, so execute times are the device's and the "
                 "program ran slower than it would without the tracer" if run.sync else
                 "not synchronized (--no-sync): execute times are the time to enqueue each step")
    h = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>torchtpu report: {html.escape(run.program)}"
         f"</title><style>{STYLE}</style></head><body>",
         f"<h1>torchtpu report: {html.escape(os.path.basename(run.program))}</h1>",
         table(None, [["command", Markup(f"<code>{html.escape(command)}</code>")],
                      ["program", os.path.abspath(run.program)], ["outcome", Markup(status)],
                          ["wall time", f"{run.wall_s:.2f} s (traced {a.wall_ms / 1e3:.2f} s, "
                                        f"{a.recorded_ms / 1e3:.2f} s of it in {len(trace.events)} recorded steps)"],
                          ["measured", sync_note],
                          ["PJRT plugin", torchtpu._C.platform_name()],
                          ["written", datetime.datetime.now().isoformat(timespec="seconds")]], right_from=9),
         "<h2>Why is it slow</h2><ol>"]
    h += [f"<li><b>{f.title}</b> {f.detail}</li>" for f in a.findings]
    h.append("</ol>")
    h += [f"<p>Note: {html.escape(n)}</p>" for n in a.notes]
    if chart_note:
        h.append(f"<p class=failed>No charts: {html.escape(chart_note)}</p>")

    def figure(key: str, caption: str) -> None:
        if key in charts:
            name, heading = CHARTS[key]
            h.append(f"<h2>{heading}</h2><p>{caption} (<a href='{name}'>{name}</a>)</p>"
                     f"<img alt='{html.escape(heading)}' src='{embed(charts[key])}'>")

    figure("split", "Compiling counts every executable built or loaded (inside fallbacks too); the other parts "
                    "are the recorded steps' execute times by kind; the rest of the wall time is outside them.")
    figure("families", "A family is the spec file of an op's overload (specs/unary.yaml: unary). Only top-level "
                       "steps count: a CPU fallback's copies are inside its time.")
    h.append(table(["family", "what", "calls", "compile ms", "execute ms", "mean execute µs", "of wall"],
                   [[f.name, f.source, f.calls, f"{f.compile_ms:.1f}", f"{f.execute_ms:.1f}",
                     f"{f.execute_ms * 1e3 / f.calls:.1f}", pct(f.total_ms, a.wall_ms)] for f in a.families],
                   right_from=2))
    figure("compile", "Compile: building a module or loading it from the cache, the first time each op, shape "
                      "and dtype runs; execute: running it.")
    figure("fallbacks", "Ops with no spec ran on the CPU (their inputs copied to the host and results back).")
    if a.fallbacks:
        h.append(table(["op", "calls", "ms"], [[op, n, f"{ms:.1f}"] for op, n, ms in a.fallbacks]))
    else:
        h.append("<p>No CPU fallbacks: every op ran from a spec.</p>")
    peaks = {d: max(ys) for d, (_, ys) in a.memory.items() if ys}
    figure("memory", "Device memory held after each recorded step; "
           + ", ".join(f"tpu:{d} peak {fmt_bytes(p)}" for d, p in sorted(peaks.items())) + ".")

    rows = trace.summary()
    h.append(f"<h2>Top ops</h2><p>Top-level steps summed per name, slowest first ({len(rows)} names). Cache: hit "
             "(kernel cache), mem (module text), disk (loaded), comp (compiled), tape (fused eager mode: a block's "
             "executable, or a recorded op's emission, replayed).</p>")
    h.append(table(["name", "kind", "calls", "hit", "mem", "disk", "comp", "tape", "compile ms", "execute µs",
                    "mean µs", "of wall"],
                   [[r["name"], r["kind"], r["calls"], r["hit"], r["memory"], r["disk"], r["compile"], r["tape"],
                     f"{r['compile_ms']:.2f}", f"{r['execute_us']:.1f}", f"{r['execute_us'] / r['calls']:.1f}",
                     pct(r["compile_ms"] + r["execute_us"] / 1e3, a.wall_ms)] for r in rows[:40]], right_from=2))
    if len(rows) > 40:
        h.append(f"<p>... {len(rows) - 40} more in trace.json.</p>")
    h.append("<h2>Trace</h2><p><a href='trace.json'>trace.json</a>: every step with its shapes, cache outcome "
             "and memory; open it in https://ui.perfetto.dev or chrome://tracing.</p>")
    h.append(f"<h2>Metrics</h2><p>torchtpu.debug.metrics_report(), counted since the process started.</p>"
             f"<pre>{html.escape(metrics_text)}</pre>")
    h.append(f"<h2>Memory summary</h2><pre>{html.escape(memory_text)}</pre></body></html>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(h))


def write_report(run: Run, out_dir: str) -> tuple[str, Analysis]:
    trace = run.trace
    a = analyze(trace.events, trace.wall_us or run.wall_s * 1e6, run.sync, spec_families(), run.metrics_before,
                run.metrics_after, run.memory_before)
    if run.status:
        a.findings.insert(0, Finding(f"The program {html.escape(run.error or 'failed')}.",
                                     "Everything below is what ran before it ended.", 1.0))
    trace.export_chrome_trace(os.path.join(out_dir, "trace.json"))
    charts, chart_note = draw_charts(a, out_dir)
    devices = sorted({e.device for e in trace.events}) or [torchtpu.device.current_device()]
    memory_text = "\n".join(torchtpu.device.memory_summary(d) for d in devices)
    path = os.path.join(out_dir, "report.html")
    write_html(path, run, a, charts, chart_note, torchtpu.debug.metrics_report(), memory_text)
    return path, a


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    program_args: list[str] = []
    if "--" in argv:  # everything after the first -- is the program's
        cut = argv.index("--")
        argv, program_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="python -m torchtpu.tools.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("program", help="the Python program to run on tpu")
    parser.add_argument("program_args", nargs="*", default=[], help="its arguments (put options after --)")
    parser.add_argument("--out", default="torchtpu-report", help="where to write the report (default "
                                                                  "./torchtpu-report)")
    parser.add_argument("--no-sync", action="store_true",
                        help="do not wait for each step's results (execute = time to enqueue)")
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (the program's own arguments go after --: "
                     f"python -m torchtpu.tools.report {args.program} [--out DIR] [--no-sync] -- ARGS)")
    if not os.path.isfile(args.program) and not os.path.isfile(os.path.join(args.program, "__main__.py")):
        print(f"report: no such program: {args.program}", file=sys.stderr)
        return 2
    try:
        os.makedirs(args.out, exist_ok=True)
        probe = os.path.join(args.out, ".torchtpu-report-probe")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as error:
        print(f"report: cannot write the report to {args.out}: {error.strerror or error}", file=sys.stderr)
        return 2
    if not torchtpu.is_available():
        print(f"report: torchtpu is not available: {torchtpu.init_error()}", file=sys.stderr)
        return 1

    print(f"report: running {' '.join([args.program, *args.program_args, *program_args])} under the op tracer "
          f"({'not ' if args.no_sync else ''}synchronized)", file=sys.stderr, flush=True)
    run = run_program(args.program, [*args.program_args, *program_args], sync=not args.no_sync)
    path, analysis = write_report(run, args.out)
    print(f"\nreport: {len(run.trace.events)} steps in {run.wall_s:.2f} s; why it is slow:")
    for f in analysis.findings[:4]:
        print(f"  - {html.unescape(f.title)}")
    print(f"report written to {os.path.abspath(path)}")
    return run.status


if __name__ == "__main__":
    sys.exit(main())
