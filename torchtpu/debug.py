"""Counters for people and tests: ops executed, compiles, cache tiers, bytes moved, CPU fallbacks."""

from __future__ import annotations

import torchtpu


def metrics() -> dict:
    return torchtpu._require_runtime().metrics()


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
    fallbacks = m["cpu_fallbacks"]
    lines.append(f"CPU fallbacks:       {sum(fallbacks.values())}")
    for op, count in sorted(fallbacks.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {op}: {count}")
    return "\n".join(lines)
