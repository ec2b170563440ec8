"""Counters for people and tests (ops executed, compiles, cache tiers, bytes moved, CPU fallbacks)
and the op tracer (`trace()`)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import torch

import torchtpu


def metrics() -> dict:
    ext = torchtpu._require_runtime()
    m = ext.metrics()
    # Graph mode's counters (torch.compile); loading it here would import dynamo, so only if used.
    compile_module = sys.modules.get("torchtpu._compile")
    m["graph"] = compile_module.stats() if compile_module else {
        "graphs": 0, "captures": 0, "recompiles": 0, "executions": 0, "recompile_reasons": [], "splits": {}}
    # Fused eager mode: ops recorded, blocks run and compiled (a block met again is not), and what
    # made each block run.
    m["fused"] = ext._fused_metrics()
    return m


def fallbacks_since(before: dict) -> dict:
    """The CPU fallbacks counted since `before` (a copy of metrics()["cpu_fallbacks"]), op -> calls."""
    return {op: n - before.get(op, 0) for op, n in metrics()["cpu_fallbacks"].items() if n > before.get(op, 0)}


def metrics_report() -> str:
    m = metrics()
    ops = m["ops"]
    lines = [
        f"eager mode:          {torch.tpu.get_eager_mode()}, math {torch.tpu.get_math_mode()}",
        f"ops executed:        {sum(ops.values())} calls of {len(ops)} spec'd overloads",
        *(f"  {op}: {count}" for op, count in sorted(ops.items(), key=lambda kv: -kv[1])[:10]),
        f"executions:          {m['executions']}",
        f"compiles:            {m['compiles']} ({m['compile_seconds']:.3f} s)",
        f"in-process hits:     {m['memory_cache_hits']} (module text), kernel entries {m['kernel_cache_entries']}",
        f"disk cache:          {m['disk_cache_hits']} loads, {m['disk_cache_writes']} writes, "
        f"{m['disk_cache_rejected']} rejected",
        f"bytes host->device:  {m['bytes_to_device']}",
        f"bytes device->host:  {m['bytes_to_host']}",
        f"live buffers:        {m['live_buffers']} ({m['live_bytes']} bytes, peak {m['peak_live_bytes']})",
    ]
    graph = m["graph"]
    lines.append(f"compiled graphs:     {graph['graphs']} ({graph['captures']} captures, {graph['executions']} runs, "
                 f"{graph['recompiles']} recompiles)")
    lines += [f"  recompiled: {reason}" for reason in graph["recompile_reasons"][-5:]]
    lines += [f"  split around {op}: {n}" for op, n in sorted(graph["splits"].items(), key=lambda kv: -kv[1])]
    fused = m["fused"]
    lines.append(f"fused blocks:        {fused['blocks_run']} run ({fused['ops_recorded']} ops recorded, "
                 f"{fused['ops_replayed']} of them replayed from the tape), {fused['blocks_compiled']} compiled, "
                 f"{fused['blocks_reused']} reused from the tape")
    lines += [f"  ran at {reason}: {n}" for reason, n in sorted(fused["flush_reasons"].items(), key=lambda kv: -kv[1])]
    fallbacks = m["cpu_fallbacks"]
    lines.append(f"CPU fallbacks:       {sum(fallbacks.values())}")
    for op, count in sorted(fallbacks.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {op}: {count}")
    return "\n".join(lines)


# --- The op tracer ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class OpEvent:
    """One step recorded by `trace()`: a spec kernel call, CPU fallback, copy or compiled-graph run."""

    name: str          # "aten::add.Tensor", "aten::mode", "graph 3", "aten::_copy_from cpu->tpu:0"
    kind: str          # "op" | "fallback" | "graph" | "copy" | "fused" (a block) | "recorded" (an op fused mode recorded)
    shapes: str        # its tensor arguments, e.g. "f32[4, 8], f32[8]"
    cache: str         # where its executable came from: "hit" (kernel cache), "memory", "disk", "compile", "tape"
                       # (a fused block's executable, or a recorded op's emission, from the tape), ""
    start_us: float    # since the trace started
    compile_ms: float  # building and compiling its module (0 when cached)
    execute_us: float  # running it; with sync=True until its results were ready (recorded: the host's time recording it)
    live_bytes: int    # device memory held after it
    device: int
    depth: int         # 0, or how deep inside another recorded step it ran (a fallback's copies: 1)

    @property
    def total_us(self) -> float:
        return self.compile_ms * 1e3 + self.execute_us


class Trace:
    """What `with torchtpu.debug.trace() as t:` recorded; see `trace()`."""

    def __init__(self, sync: bool = True, print_table: bool = True):
        self.sync = sync
        self.print_table = print_table
        self.events: list[OpEvent] = []
        self.wall_us = 0.0

    def __enter__(self) -> "Trace":
        C = torchtpu._require_runtime()
        if self.sync:
            C.synchronize()  # what ran before the trace is not its time
        self._start_ns = C._trace_start(self.sync)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        C = torchtpu._require_runtime()
        try:
            if self.sync:
                C.synchronize()
        finally:  # the trace stops even when waiting for the device fails
            self.wall_us = (C._trace_now_ns() - self._start_ns) / 1e3
            raw = C._trace_stop()
        self.events = [
            OpEvent(name, kind, shapes, cache, (start_ns - self._start_ns) / 1e3, compile_ns / 1e6, execute_ns / 1e3,
                    live_bytes, device, depth)
            for name, kind, shapes, cache, start_ns, compile_ns, execute_ns, live_bytes, device, depth in raw]
        self.events.sort(key=lambda e: e.start_us)
        if self.print_table and exc_type is None:
            print(self.table())

    def summary(self) -> list[dict]:
        """One row per name (top-level steps only, so nothing is counted twice), slowest first."""
        rows: dict[str, dict] = {}
        for e in self.events:
            if e.depth:
                continue
            row = rows.setdefault(e.name, {"name": e.name, "kind": e.kind, "calls": 0, "compile_ms": 0.0,
                                           "execute_us": 0.0, "hit": 0, "memory": 0, "disk": 0, "compile": 0,
                                           "tape": 0})
            row["calls"] += 1
            row["compile_ms"] += e.compile_ms
            row["execute_us"] += e.execute_us
            if e.cache:
                row[e.cache] += 1
        return sorted(rows.values(), key=lambda r: -(r["compile_ms"] * 1e3 + r["execute_us"]))

    def table(self, top: int = 25) -> str:
        rows = self.summary()
        recorded_us = sum(r["compile_ms"] * 1e3 + r["execute_us"] for r in rows)
        header = (f"{'name':<44} {'kind':<8} {'calls':>6} {'hit':>5} {'mem':>4} {'disk':>4} {'comp':>4} {'tape':>5} "
                  f"{'compile ms':>10} {'execute us':>11} {'mean us':>9} {'time':>6}")
        lines = [f"torchtpu trace: {len(self.events)} steps in {self.wall_us / 1e3:.2f} ms "
                 f"({'synchronized' if self.sync else 'not synchronized: execute = time to enqueue'})",
                 header, "-" * len(header)]
        for r in rows[:top]:
            total = r["compile_ms"] * 1e3 + r["execute_us"]
            lines.append(f"{r['name'][:44]:<44} {r['kind']:<8} {r['calls']:>6} {r['hit']:>5} {r['memory']:>4} "
                         f"{r['disk']:>4} {r['compile']:>4} {r['tape']:>5} {r['compile_ms']:>10.2f} {r['execute_us']:>11.1f} "
                         f"{r['execute_us'] / r['calls']:>9.1f} {100 * total / max(self.wall_us, 1e-9):>5.1f}%")
        if len(rows) > top:
            lines.append(f"... {len(rows) - top} more")
        fallbacks = sum(r["calls"] for r in rows if r["kind"] == "fallback")
        lines.append(f"recorded steps {recorded_us / 1e3:.2f} ms of {self.wall_us / 1e3:.2f} ms; the rest is Python "
                     f"and dispatch around them. CPU fallbacks: {fallbacks} calls"
                     + ("" if not fallbacks else " (add specs for them: see docs/08_debugging.py)"))
        return "\n".join(lines)

    def chrome_trace(self) -> dict:
        """The trace in Chrome's trace event format (Perfetto, chrome://tracing)."""
        pid = os.getpid()
        events: list[dict] = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": "torchtpu"}}]
        for device in sorted({e.device for e in self.events}):
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": device,
                           "args": {"name": f"tpu:{device}"}})
        for e in self.events:
            args = {"shapes": e.shapes, "cache": e.cache, "compile_ms": round(e.compile_ms, 3),
                    "execute_us": round(e.execute_us, 1), "live_bytes": e.live_bytes}
            events.append({"name": e.name, "cat": e.kind, "ph": "X", "ts": e.start_us, "dur": e.total_us,
                           "pid": pid, "tid": e.device, "args": args})
            if e.compile_ms:  # the module is built and compiled before it runs
                events.append({"name": "compile", "cat": "compile", "ph": "X", "ts": e.start_us,
                               "dur": e.compile_ms * 1e3, "pid": pid, "tid": e.device})
            events.append({"name": "device memory", "ph": "C", "ts": e.start_us + e.total_us, "pid": pid,
                           "args": {"live bytes": e.live_bytes}})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def export_chrome_trace(self, path: str) -> str:
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)
        return path


def trace(sync: bool = True, print_table: bool = True) -> Trace:
    """Records every tpu op run inside `with torchtpu.debug.trace() as t:`.

    Each spec kernel call, CPU fallback, copy between devices and compiled-graph run becomes an
    `OpEvent` (name, shapes, cache outcome, compile ms, execute µs, device memory after it) in
    `t.events`; `t.table()` sums them per op (printed on exit unless print_table=False) and
    `t.export_chrome_trace(path)` writes a file Perfetto opens. With sync=True (the default) each
    op waits for its results, so execute times are the device's; sync=False keeps the program's
    asynchrony and measures the time to enqueue.
    """
    return Trace(sync=sync, print_table=print_table)
