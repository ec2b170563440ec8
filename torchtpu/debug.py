"""Counters for people and tests: ops executed, compiles, cache tiers, bytes moved, CPU fallbacks."""

from __future__ import annotations

import sys

import torchtpu


def metrics() -> dict:
    m = torchtpu._require_runtime().metrics()
    # Graph mode's counters (torch.compile); loading it here would import dynamo, so only if used.
    compile_module = sys.modules.get("torchtpu._compile")
    m["graph"] = compile_module.stats() if compile_module else {
        "graphs": 0, "captures": 0, "recompiles": 0, "executions": 0, "recompile_reasons": [], "splits": {}}
    return m


def metrics_report() -> str:
    m = metrics()
    ops = m["ops"]
    lines = [
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
    fallbacks = m["cpu_fallbacks"]
    lines.append(f"CPU fallbacks:       {sum(fallbacks.values())}")
    for op, count in sorted(fallbacks.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {op}: {count}")
    return "\n".join(lines)
