"""How much of ATen runs on tpu from specs.

    python -m torchtpu.tools.coverage                  # overloads with specs, core-op coverage
    python -m torchtpu.tools.coverage --parity         # also sweep PyTorch's whole op_db on tpu vs CPU
    python -m torchtpu.tools.coverage --parity --ops acosh,take --jobs 2 --json results.json
    python -m torchtpu.tools.coverage --parity --slice 0:300 --jsonl part1.jsonl   # a TPU call's share
    python -m torchtpu.tools.opdb_sweep --summarize part1.jsonl part2.jsonl          # the slices together
    python -m torchtpu.tools.coverage --workload x.py  # also run a program and list its CPU fallbacks
    python -m torchtpu.tools.coverage --workload x.py -- --steps 5   # ... giving it arguments
"""

from __future__ import annotations

import argparse
import collections
import os
import sys


import torchtpu
from torchtpu.tools import run_as_main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def core_overloads() -> set[str]:
    """ATen overloads tagged `core` (the set torch.export lowers to)."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from codegen.model import native_functions

    by_name, _ = native_functions()
    return {name for name, f in by_name.items() if any(str(t) == "core" for t in f.tags)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parity", action="store_true",
                        help="run every OpInfo of op_db on tpu (float32, forward and backward) against CPU, "
                             "with TORCHTPU_FALLBACK=error; count passing / failing / unsupported")
    parser.add_argument("--ops", help="with --parity: comma-separated OpInfo names instead of all of op_db")
    parser.add_argument("--jobs", type=int, default=1, help="with --parity: worker processes")
    parser.add_argument("--json", help="with --parity: also write every OpInfo's result to this file")
    parser.add_argument("--slice", help="with --parity: START:STOP, the positions of the selection to sweep "
                                        "(a TPU v5e sweeps 1.5-2.4 s per OpInfo: split the 702 over several runs)")
    parser.add_argument("--jsonl", help="with --parity: append each OpInfo's result to this file as it "
                                        "finishes (kept if the run is cut off)")
    parser.add_argument("--resume", action="store_true",
                        help="with --jsonl: skip the OpInfos the file has results for (one that took the "
                             "sweep's process down counts as failing) and summarize the whole file")
    parser.add_argument("--seconds", type=float,
                        help="with --parity: start no OpInfo after this many seconds (fit a device call's "
                             "limit; continue with --resume)")
    parser.add_argument("--workload", help="a Python program to run on tpu; its CPU fallbacks are listed")
    parser.add_argument("workload_args", nargs="*", help="the workload's arguments (after --)")
    args = parser.parse_args(argv)
    if not torchtpu.is_available():
        print(f"torchtpu is not available: {torchtpu.init_error()}")
        return 1

    specs = torchtpu._C.spec_overloads()
    by_variant = collections.Counter(variant for _, variant, _ in specs)
    files = sorted({source.split(":")[0] for _, _, source in specs})
    print(f"ATen overloads with specs: {len(specs)} ({by_variant['functional']} functional, "
          f"{by_variant['inplace']} in-place, {by_variant['out']} out=) from {len(files)} spec files")
    if os.path.isdir(os.path.join(REPO, "codegen")):
        core = core_overloads()
        covered = core & {name for name, _, _ in specs}
        print(f"core ATen overloads covered: {len(covered)} of {len(core)}")
    if args.parity:
        from torchtpu.tools import opdb_sweep

        selection = opdb_sweep.select(args.ops.split(",") if args.ops else None)
        if args.slice:
            start, _, stop = args.slice.partition(":")
            selection = selection[int(start or 0):int(stop) if stop else None]
        progress = started = None
        if args.resume:
            if not args.jsonl:
                parser.error("--resume needs --jsonl")
            done = opdb_sweep.read_jsonl([args.jsonl]) if os.path.exists(args.jsonl) else {}
            selection = [(i, name) for i, name in selection if name not in done]
        if args.jsonl:
            import json

            def append(entry):
                with open(args.jsonl, "a") as f:
                    f.write(json.dumps(entry) + "\n")

            def progress(result, done, total):
                append(result.to_json())

            def started(name):  # read back by --resume: a crash names its OpInfo
                append({"started": name})

        results = opdb_sweep.sweep(selection, jobs=args.jobs, progress=progress, started=started,
                                   seconds=args.seconds)
        if len(results) < len(selection):
            print(f"time limit: {len(selection) - len(results)} of {len(selection)} OpInfos not swept "
                  f"(continue with --resume)")
        if args.resume:
            results = list(opdb_sweep.read_jsonl([args.jsonl]).values())
        print(opdb_sweep.summary(results), flush=True)
        if args.json:
            import json

            with open(args.json, "w") as f:
                json.dump([r.to_json() for r in results], f, indent=1)
    if args.workload:
        before = dict(torchtpu.debug.metrics()["cpu_fallbacks"])
        status, error = run_as_main(args.workload, args.workload_args)
        if error:
            print(f"{args.workload} {error}", file=sys.stderr)
        fell_back = torchtpu.debug.fallbacks_since(before)
        print(f"ops {args.workload} ran on the CPU: {len(fell_back)}")
        for op, n in sorted(fell_back.items(), key=lambda kv: -kv[1]):
            print(f"  {op}: {n} calls")
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
