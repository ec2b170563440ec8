"""Eager overhead: median microseconds per cached op on small tensors, side by side in one run:

  tpu eager   the op through PyTorch's dispatcher and the spec kernel (cache hit) on device "tpu"
  tpu fused   the op in fused eager mode (torch.tpu.set_eager_mode("fused")): recorded, in blocks of
              --block-ops calls whose results are kept, each block then run as one module (cached
              after its first run): the recording's cost per op plus a share of the block's run
  cpu native  the same op with PyTorch's own CPU kernel
  bare PJRT   the very executable and input buffers of that kernel call, re-executed in a C++ loop
  jax.jit     (when jax is installed) the same op as a jitted jax function on arrays already on the
              device, on the platform torchtpu runs on (on a TPU host, the same chip): jax's dispatch

--dispatch-variants also times the bare launch of a 64x64 add four ways (a portable executable named
a device at each launch, or one compiled for the device as every kernel is; outputs dropped at once
or kept until the loop ends): where a plugin spends a launch.

Targets: tpu eager within 3x of bare PJRT (a cache hit skips Meta, emission and module hashing), and
no slower than jax.jit's one-op dispatch.
Usage: python benchmarks/eager_overhead.py [--size N] [--iterations N] [--repeats N] [--dispatch-variants]
                                          [--plot out.png]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import torchtpu


def per_op_us(fn, iterations: int, repeats: int, sync) -> float:
    for _ in range(50):
        fn()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / iterations * 1e6)
    return statistics.median(samples)


def fused_per_op_us(fn, block_ops: int, blocks: int, repeats: int) -> float:
    """Microseconds per op in fused eager mode: blocks of `block_ops` calls (results kept), each run by a sync."""
    def block() -> None:
        results = [fn() for _ in range(block_ops)]
        torch.tpu.synchronize()
        del results

    torch.tpu.set_eager_mode("fused")
    try:
        block()  # compiles the block's module once
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(blocks):
                block()
            samples.append((time.perf_counter() - start) / (blocks * block_ops) * 1e6)
        return statistics.median(samples)
    finally:
        torch.tpu.set_eager_mode("strict")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=64, help="elements per side of the small tensors")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--block-ops", type=int, default=100, help="ops per fused block (tpu fused column)")
    parser.add_argument("--dispatch-variants", action="store_true",
                        help="also time the bare launch: portable vs device-assigned executable, outputs dropped vs kept")
    parser.add_argument("--plot", metavar="OUT.png", help="also draw the timings and eager/bare ratios as bar charts")
    args = parser.parse_args()
    if not torchtpu.is_available():
        raise SystemExit(f"no tpu runtime: {torchtpu.init_error()}")

    n = args.size
    cpu = {"x": torch.randn(n, n), "y": torch.randn(n, n), "v": torch.randn(n)}
    tpu = {k: v.to("tpu") for k, v in cpu.items()}
    ops = {
        "add (x + y)": lambda t: t["x"] + t["y"],
        "mul (x * 2.0)": lambda t: t["x"] * 2.0,
        "relu": lambda t: torch.relu(t["x"]),
        "mm (x @ y)": lambda t: t["x"] @ t["y"],
        "sum(dim=0)": lambda t: t["x"].sum(dim=0),
        "add_ (in place)": lambda t: t["v"].add_(1.0),
    }
    no_sync = lambda: None  # noqa: E731
    jax_ops = jax_versions(cpu, args.iterations, args.repeats)
    print(f"torchtpu eager overhead: {n}x{n} float32, {torchtpu._C.platform_name()} PJRT plugin, "
          f"median of {args.repeats} x {args.iterations}")
    header = (f"{'op':<18}{'tpu eager us':>14}{'tpu fused us':>14}{'cpu native us':>15}{'bare PJRT us':>14}"
              f"{'jax.jit us':>12}{'eager/bare':>12}{'eager/cpu':>11}{'eager/jax':>11}")
    print(header)
    print("-" * len(header))
    ratios, jax_ratios = [], []
    rows = []  # (op, eager us, native us, bare us)
    for name, op in ops.items():
        eager = per_op_us(lambda: op(tpu), args.iterations, args.repeats, torch.tpu.synchronize)
        fused = fused_per_op_us(lambda: op(tpu), args.block_ops, max(1, args.iterations // args.block_ops),
                                args.repeats)
        native = per_op_us(lambda: op(cpu), args.iterations, args.repeats, no_sync)
        torchtpu._C._capture_next_execution()
        op(tpu)
        torch.tpu.synchronize()
        bare = statistics.median(
            torchtpu._C._repeat_captured_execution_ns(args.iterations) / 1e3 for _ in range(args.repeats))
        jax_us = jax_ops[name]() if jax_ops else None
        ratios.append(eager / bare)
        if jax_us:
            jax_ratios.append(eager / jax_us)
        rows.append((name, eager, native, bare))
        jax_cells = (f"{jax_us:>12.2f}", f"{eager / jax_us:>10.2f}x") if jax_us else (f"{'-':>12}", f"{'-':>11}")
        print(f"{name:<18}{eager:>14.2f}{fused:>14.2f}{native:>15.2f}{bare:>14.2f}{jax_cells[0]}{eager / bare:>11.2f}x"
              f"{eager / native:>10.2f}x{jax_cells[1]}")
    print("-" * len(header))
    geo = statistics.geometric_mean(ratios)
    print(f"geometric mean eager/bare: {geo:.2f}x (target <= 3x: {'met' if geo <= 3 else 'NOT met'})")
    if jax_ratios:
        geo_jax = statistics.geometric_mean(jax_ratios)
        print(f"geometric mean eager/jax.jit: {geo_jax:.2f}x (target <= 1x: {'met' if geo_jax <= 1 else 'NOT met'})")
    else:
        print("jax.jit: not installed (pip install -e .[bench]); no jax column")
    if args.dispatch_variants:
        print("\nbare launch of a 64x64 float32 add (median of the repeats):")
        samples: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            for name, ns in torchtpu._C._dispatch_variants_ns(args.iterations):
                samples.setdefault(name, []).append(ns / 1e3)
        for name, us in samples.items():
            print(f"  {name:<28}{statistics.median(us):>10.2f} us")
    if args.plot:
        plot(args.plot, rows, geo, f"{n}x{n} float32, {torchtpu._C.platform_name()} PJRT plugin")


def jax_versions(cpu: dict, iterations: int, repeats: int) -> dict | None:
    """Each op as a jax.jit function on device arrays, as a callable that returns its median us per call
    (the same loop and synchronization as the other columns), or None without jax. The in-place add
    becomes a donated jitted add, the way jax updates a buffer in place."""
    # jax where torchtpu runs: the TPU when the plugin is libtpu's (they share the chip in one process).
    os.environ.setdefault("JAX_PLATFORMS", "tpu" if torchtpu._C.platform_name() == "tpu" else "cpu")
    try:
        import jax
    except ImportError:
        return None
    arrays = {k: jax.device_put(v.numpy()) for k, v in cpu.items()}
    functions = {
        "add (x + y)": (jax.jit(lambda x, y: x + y), ("x", "y")),
        "mul (x * 2.0)": (jax.jit(lambda x: x * 2.0), ("x",)),
        "relu": (jax.jit(jax.nn.relu), ("x",)),
        "mm (x @ y)": (jax.jit(lambda x, y: x @ y), ("x", "y")),
        "sum(dim=0)": (jax.jit(lambda x: x.sum(axis=0)), ("x",)),
    }
    add_in_place = jax.jit(lambda v: v + 1.0, donate_argnums=0)

    def timer(fn, names):
        def run() -> float:
            outputs = []
            call = lambda: outputs.append(fn(*(arrays[k] for k in names)))  # noqa: E731
            sync = lambda: (jax.block_until_ready(outputs[-1]), outputs.clear())  # noqa: E731
            return per_op_us(call, iterations, repeats, sync)
        return run

    def in_place() -> float:
        def call():
            arrays["v"] = add_in_place(arrays["v"])
        return per_op_us(call, iterations, repeats, lambda: jax.block_until_ready(arrays["v"]))

    timers = {name: timer(fn, names) for name, (fn, names) in functions.items()}
    timers["add_ (in place)"] = in_place
    return timers


def plot(path: str, rows: list[tuple[str, float, float, float]], geo: float, setup: str) -> None:
    """Microseconds per op in the three columns, and eager/bare and eager/cpu per op against the 3x target."""
    from torchtpu.tools import plots

    names = [r[0] for r in rows]
    try:
        plots.draw(path,
                   plots.Bars("µs per cached op (lower is faster)", names,
                              {"tpu eager": [r[1] for r in rows], "cpu native": [r[2] for r in rows],
                               "bare PJRT": [r[3] for r in rows]}, "µs", log=True),
                   plots.Bars(f"overhead ratios (geometric mean eager/bare {geo:.2f}x)", names,
                              {"eager / bare": [r[1] / r[3] for r in rows],
                               "eager / cpu": [r[1] / r[2] for r in rows]}, "x",
                              reference=3.0, reference_label="target eager/bare <= 3x"),
                   title=f"torchtpu eager overhead: {setup}")
    except plots.PlotsUnavailable as missing:
        print(f"--plot {path}: {missing}; no plot written")
        return
    print(f"plot written to {path}")


if __name__ == "__main__":
    main()
