"""Runtime behaviour: compile cache tiers (in-process, on disk, corrupt entries), buffer lifetime,
transfer accounting and the emitter composition proof."""

from __future__ import annotations

import gc
import glob
import os
import re

import torch

import torchtpu
from conftest import assert_equal_cpu, last_json, metrics, run_python

ENTRY = re.compile(r"^[0-9a-f]{32}\.pjrtexe$")


def _delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before if isinstance(before[k], (int, float))}


def _entries(cache_dir: str) -> list[str]:
    return sorted(p for p in glob.glob(os.path.join(cache_dir, "*")) if ENTRY.match(os.path.basename(p)))


# A few ops, each with its own kernel; prints the results (and the CPU reference) and the metrics.
WORKLOAD = r"""
import json, warnings
warnings.simplefilter("ignore")
import torch, torchtpu
a = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
b = torch.linspace(-1, 1, 20).reshape(4, 5)
i = torch.arange(6).reshape(2, 3)
def run(dev):
    x, w, n = a.to(dev), b.to(dev), i.to(dev)
    y = (x @ w).relu() + 1.5
    z = torch.exp(x) * 2 - x.sqrt()
    s = y.sum(dim=0)
    m = z.mean(dim=1, keepdim=True)
    c = torch.cat([n.to(torch.float32), x[:2, :3]], dim=1)
    q = torch.where(torch.lt(x, 0.5), x, -x)
    return [t.cpu().tolist() for t in (y, z, s, m, c, q, n + 1)]
tpu_results = run("tpu")
cpu_results = run("cpu")
m = torchtpu.debug.metrics()
m.pop("cpu_fallbacks")
print(json.dumps({"metrics": m, "tpu": tpu_results, "cpu": cpu_results,
                  "cache_dir": torchtpu._C.cache_dir(), "init_error": torchtpu.init_error()}))
"""


def _run_workload(cache_dir, extra_env=None):
    env = {"TORCHTPU_CACHE_DIR": cache_dir}
    env.update(extra_env or {})
    proc = run_python(WORKLOAD, env)
    assert proc.returncode == 0, f"workload exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    out = last_json(proc.stdout)
    assert out["init_error"] is None, out["init_error"]
    for got, want in zip(out["tpu"], out["cpu"]):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want))
    return out


# ----------------------------------------------------------------------------------------------
# (a) in-process cache


COMPILE_ONCE = r"""
import json, warnings
warnings.simplefilter("ignore")
import torch, torchtpu
M = torchtpu.debug.metrics
def delta(f):
    a = M(); r = f(); torch.tpu.synchronize(); b = M()
    return {k: b[k] - a[k] for k in ("compiles", "executions", "disk_cache_hits", "memory_cache_hits")}, r
x = torch.arange(35, dtype=torch.float32).reshape(5, 7).to("tpu")
y = torch.ones(5, 7).to("tpu")
out = {}
out["first"], _ = delta(lambda: x + y)
out["second"], _ = delta(lambda: x + y)
out["other_values"], _ = delta(lambda: (x * 3) + (y * 0))
out["same_again"], _ = delta(lambda: x + y)
x2 = torch.ones(6, 7).to("tpu")
out["new_shape"], _ = delta(lambda: x2 + x2)
out["new_shape_again"], _ = delta(lambda: x2 + x2)
out["scalar_1"], r1 = delta(lambda: x + 1.0)
out["scalar_2"], r2 = delta(lambda: x + 2.0)
out["scalar_3"], r3 = delta(lambda: x + 3.5)
out["alpha_3"], r4 = delta(lambda: x.add(y, alpha=3))
out["alpha_5"], r5 = delta(lambda: x.add(y, alpha=5))
out["mul_2"], _ = delta(lambda: x * 2.0)
out["mul_7"], r6 = delta(lambda: x * 7.0)
xc, yc = x.cpu(), y.cpu()
out["values_ok"] = all(torch.allclose(t.cpu(), e) for t, e in
    [(r1, xc + 1.0), (r2, xc + 2.0), (r3, xc + 3.5), (r4, xc.add(yc, alpha=3)), (r5, xc.add(yc, alpha=5)),
     (r6, xc * 7.0)])
torchtpu._C.clear_in_process_caches()
out["after_clear"], r7 = delta(lambda: x + y)
out["after_clear_again"], _ = delta(lambda: x + y)
out["after_clear_ok"] = torch.equal(r7.cpu(), xc + yc)
print(json.dumps(out))
"""


def test_same_op_compiles_once_and_scalars_do_not_recompile(fresh_cache_dir):
    proc = run_python(COMPILE_ONCE, {"TORCHTPU_CACHE_DIR": fresh_cache_dir})
    assert proc.returncode == 0, proc.stderr
    out = last_json(proc.stdout)
    assert out["first"]["compiles"] <= 1 and out["first"]["executions"] >= 1
    assert out["first"]["compiles"] == 1, "a fresh cache dir must compile the first add"
    assert out["second"]["compiles"] == 0 and out["second"]["executions"] >= 1
    assert out["same_again"]["compiles"] == 0
    assert out["new_shape"]["compiles"] >= 1, "a new shape must compile a new executable"
    assert out["new_shape_again"]["compiles"] == 0
    # The first tensor+python-scalar add may compile (add.Scalar); later values must not.
    assert out["scalar_1"]["compiles"] <= 1
    for key in ("scalar_2", "scalar_3", "alpha_3", "alpha_5", "mul_7"):
        assert out[key]["compiles"] == 0, (key, out[key])
    assert out["values_ok"]
    # After dropping the in-process tiers, the executable comes back from disk, not a recompile.
    assert out["after_clear"]["compiles"] == 0, out["after_clear"]
    assert out["after_clear"]["disk_cache_hits"] >= 1, out["after_clear"]
    assert out["after_clear_again"]["compiles"] == 0
    assert out["after_clear_again"]["disk_cache_hits"] == 0
    assert out["after_clear_ok"]


def test_in_process_repeat_does_not_compile():
    # Uses the suite's own process and cache: the second identical call must be free.
    x = torch.arange(33, dtype=torch.float32).reshape(3, 11).to("tpu")
    y = torch.full((3, 11), 0.25).to("tpu")
    first = x * y - x
    torch.tpu.synchronize()
    before = metrics()
    second = x * y - x
    torch.tpu.synchronize()
    d = _delta(before, metrics())
    assert d["compiles"] == 0 and d["disk_cache_hits"] == 0
    assert d["executions"] >= 1
    assert torch.equal(first.cpu(), second.cpu())
    assert_equal_cpu(second, x.cpu() * y.cpu() - x.cpu())


# ----------------------------------------------------------------------------------------------
# (b) persistence across processes, (c) corrupt entries


def test_cache_persists_across_processes(fresh_cache_dir):
    first = _run_workload(fresh_cache_dir)
    assert first["cache_dir"] == os.path.abspath(fresh_cache_dir)
    assert first["metrics"]["compiles"] > 0
    assert first["metrics"]["disk_cache_writes"] > 0
    entries = _entries(fresh_cache_dir)
    assert len(entries) == first["metrics"]["disk_cache_writes"]
    assert all(os.path.getsize(p) > 0 for p in entries)

    second = _run_workload(fresh_cache_dir)
    assert second["metrics"]["compiles"] == 0, second["metrics"]
    assert second["metrics"]["disk_cache_hits"] > 0
    assert second["metrics"]["disk_cache_hits"] == first["metrics"]["compiles"]
    assert second["metrics"]["disk_cache_writes"] == 0
    assert second["metrics"]["disk_cache_rejected"] == 0
    assert second["tpu"] == first["tpu"]
    assert _entries(fresh_cache_dir) == entries


def test_corrupt_cache_entries_are_rejected_and_replaced(fresh_cache_dir, strict_eager):
    first = _run_workload(fresh_cache_dir)
    entries = _entries(fresh_cache_dir)
    assert len(entries) >= 4, entries
    truncated, garbage, random_bytes, foreign = entries[0], entries[1], entries[2], entries[3]
    # A foreign entry: well formed, checksum intact, but stored under another key (another module,
    # or another plugin version): its key material does not match, so it must not be loaded.
    with open(entries[0], "rb") as f:
        foreign_content = f.read()
    with open(foreign, "wb") as f:
        f.write(foreign_content)
    size = os.path.getsize(truncated)
    with open(truncated, "r+b") as f:
        f.truncate(size // 2)
    with open(garbage, "wb") as f:
        f.write(b"this is not a PJRT executable\n" * 10)
    rnd = os.urandom(os.path.getsize(random_bytes))
    with open(random_bytes, "wb") as f:
        f.write(rnd)
    # An extra stray entry whose name fits the pattern but matches no kernel must be harmless.
    stray = os.path.join(fresh_cache_dir, "0" * 32 + ".pjrtexe")
    with open(stray, "wb") as f:
        f.write(os.urandom(256))
    bad = {truncated: None, garbage: b"this is not a PJRT executable\n" * 10, random_bytes: rnd,
           foreign: foreign_content}

    second = _run_workload(fresh_cache_dir)
    assert second["tpu"] == first["tpu"]
    m = second["metrics"]
    assert m["disk_cache_rejected"] >= 1, m
    assert m["disk_cache_rejected"] == 4, m
    assert m["compiles"] == 4, m  # the four bad entries were recompiled ...
    assert m["disk_cache_writes"] >= 4, m  # ... and written back
    for path, content in bad.items():
        assert os.path.exists(path)
        with open(path, "rb") as f:
            data = f.read()
        assert data != content
    assert os.path.getsize(truncated) == size

    third = _run_workload(fresh_cache_dir)
    assert third["metrics"]["compiles"] == 0, third["metrics"]
    assert third["metrics"]["disk_cache_rejected"] == 0, third["metrics"]
    assert third["tpu"] == first["tpu"]


def test_cache_dir_zero_writes_nothing(tmp_path):
    home = tmp_path / "home"
    xdg = tmp_path / "xdg"
    work = tmp_path / "work"
    for d in (home, xdg, work):
        d.mkdir()
    code = WORKLOAD.replace("import torch, torchtpu",
                           "import os; os.chdir(%r)\nimport torch, torchtpu" % str(work))
    proc = run_python(code, {"TORCHTPU_CACHE_DIR": "0", "HOME": str(home), "XDG_CACHE_HOME": str(xdg)})
    assert proc.returncode == 0, proc.stderr
    out = last_json(proc.stdout)
    assert out["cache_dir"] == ""
    assert out["metrics"]["compiles"] > 0
    assert out["metrics"]["disk_cache_writes"] == 0
    assert out["metrics"]["disk_cache_hits"] == 0
    for got, want in zip(out["tpu"], out["cpu"]):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want))
    written = [p for d in (home, xdg, work) for p in d.rglob("*")]
    assert written == [], written


def test_default_cache_dir_follows_xdg(tmp_path):
    proc = run_python("import torch, torchtpu; print(torchtpu._C.cache_dir())",
                      {"TORCHTPU_CACHE_DIR": None, "XDG_CACHE_HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == os.path.join(str(tmp_path), "torchtpu", "compile")


# ----------------------------------------------------------------------------------------------
# (e) no buffer leak, (f) transfer accounting


def test_no_buffer_leak_over_many_ops():
    x = torch.arange(16, dtype=torch.float32).reshape(4, 4).to("tpu")
    y = torch.full((4, 4), 0.5).to("tpu")

    def step(i):
        z = x + y
        z = z * 2
        z.add_(y, alpha=0.5)
        w = torch.relu(z - 1.5).sum(dim=0)
        v = torch.mm(x, y) if i % 10 == 0 else z[1:, ::2] + 1.0
        del z, w, v

    for i in range(50):  # warm-up: compile everything and create cached scalar buffers
        step(i)
    gc.collect()
    torch.tpu.synchronize()
    buffers = metrics()["live_buffers"]
    allocated = torch.tpu.memory_allocated()
    for i in range(10_000):
        step(i)
    gc.collect()
    torch.tpu.synchronize()
    after = metrics()
    assert after["live_buffers"] <= buffers + 16, (buffers, after["live_buffers"])
    assert torch.tpu.memory_allocated() <= allocated + 16 * 64, (allocated, torch.tpu.memory_allocated())
    # the inputs are untouched and still right
    assert_equal_cpu(x, torch.arange(16, dtype=torch.float32).reshape(4, 4), exact=True)


def test_freeing_tensors_releases_buffers():
    gc.collect()
    torch.tpu.synchronize()
    before = metrics()
    ts = [torch.ones(256).to("tpu") for _ in range(8)]
    mid = metrics()
    assert mid["live_buffers"] - before["live_buffers"] >= 8
    assert mid["live_bytes"] - before["live_bytes"] >= 8 * 256 * 4
    del ts
    gc.collect()
    torch.tpu.synchronize()
    after = metrics()
    assert after["live_buffers"] == before["live_buffers"]
    assert after["live_bytes"] == before["live_bytes"]


def test_transfer_byte_counters():
    n = 1 << 20
    cpu = torch.randn(n)
    before = metrics()
    t = cpu.to("tpu")
    torch.tpu.synchronize()
    mid = metrics()
    assert mid["bytes_to_device"] - before["bytes_to_device"] == n * 4
    assert mid["bytes_to_host"] - before["bytes_to_host"] == 0
    assert mid["live_bytes"] - before["live_bytes"] >= n * 4
    assert mid["peak_live_bytes"] >= mid["live_bytes"]
    back = t.cpu()
    after = metrics()
    assert after["bytes_to_host"] - mid["bytes_to_host"] == n * 4
    assert after["bytes_to_device"] - mid["bytes_to_device"] == 0
    assert torch.equal(back, cpu)


def test_metrics_report_text():
    (torch.ones(3, device="tpu") * 2).sum().item()
    report = torchtpu.debug.metrics_report()
    assert isinstance(report, str)
    m = metrics()
    for key in ("ops executed", "aten::", "executions", "compiles", "disk cache", "live buffers", "CPU fallbacks"):
        assert key in report
    assert m["ops"]["aten::mul.Tensor"] >= 1
    assert set(m) >= {"executions", "compiles", "compile_seconds", "memory_cache_hits", "disk_cache_hits",
                      "disk_cache_writes", "disk_cache_rejected", "bytes_to_device", "bytes_to_host",
                      "live_buffers", "live_bytes", "peak_live_bytes", "kernel_cache_entries",
                      "cpu_fallbacks", "ops", "live_executables"}
    assert isinstance(m["cpu_fallbacks"], dict)
    assert isinstance(torchtpu._C.cache_dir(), str)


def test_clearing_in_process_caches_releases_executables():
    (torch.arange(7, device="tpu") * 5).cpu()
    assert metrics()["live_executables"] > 0
    torchtpu._C.clear_in_process_caches()
    assert metrics()["live_executables"] == 0
    assert torch.equal((torch.arange(7, device="tpu") * 5).cpu(), torch.arange(7) * 5)  # reloaded


def test_dispatch_variants_launch_portable_and_device_assigned_executables():
    # benchmarks/eager_overhead.py --dispatch-variants: both kinds of executable run on the current
    # device, their outputs dropped at once or kept (each variant's launches are all awaited)
    before = metrics()["executions"]
    variants = dict(torchtpu._C._dispatch_variants_ns(5))
    assert set(variants) == {f"{kind}, outputs {fate}" for kind in ("portable", "assigned")
                             for fate in ("dropped", "kept")}
    assert all(ns > 0 for ns in variants.values())
    assert metrics()["executions"] - before == 4 * (20 + 5)  # the warm-up launches, then the timed ones
