"""Where an OpInfo's time goes on tpu, sample by sample: for a test that runs too long on a device
(a compile that takes a minute, an execution that never returns), which sample, which variant, and
whether the time is compiling.

    python -m torchtpu.tools.sample_times remainder:int64 nn.functional.conv3d:float32 [--log F]

Each sample's Functional and out= variants run forward (and, in a floating dtype, the gradient of the
sum of the result), one line per step as it finishes: seconds, modules compiled and their compile
seconds (torchtpu.debug.metrics()). A line is printed before each step too, so the last line of a run
that was killed names the step that did not finish.
"""

from __future__ import annotations

import argparse
import time

import torch

import torchtpu
from torchtpu.testing import find_opinfo, to_device


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="+", metavar="OPINFO:DTYPE")
    parser.add_argument("--log", help="also append the lines to this file")
    args = parser.parse_args(argv)
    log = open(args.log, "a", buffering=1) if args.log else None

    def say(text: str):
        print(text, flush=True)
        if log:
            log.write(text + "\n")

    def compiles():
        m = torchtpu.debug.metrics()
        return m["compiles"], m["compile_seconds"]

    def timed(label: str, fn):
        say(f"  {label} ...")
        (n0, s0), start = compiles(), time.monotonic()
        result = fn()
        torch.tpu.synchronize()
        (n1, s1) = compiles()
        say(f"  {label}: {time.monotonic() - start:.2f} s, {n1 - n0} compiles ({s1 - s0:.2f} s)")
        return result

    for case in args.cases:
        name, dtype_name = case.split(":")
        dtype = getattr(torch, dtype_name)
        info = find_opinfo(name)
        grads = dtype.is_floating_point and info.supports_autograd
        for index, sample in enumerate(info.sample_inputs("cpu", dtype, requires_grad=grads)):
            shape = ([tuple(t.shape) for t in sample.input] if isinstance(sample.input, (list, tuple))  # _foreach_*
                     else tuple(sample.input.shape))
            say(f"{name} {dtype_name} sample {index}: input {shape} kwargs {sample.kwargs}")
            tpu_args = to_device((sample.input, *sample.args), "tpu")
            kwargs = to_device(sample.kwargs, "tpu")
            try:
                result = timed("forward", lambda: info.op(*tpu_args, **kwargs))
                first = result if isinstance(result, torch.Tensor) else result[0]
                if info.supports_out:
                    timed("out=", lambda: info.op(*tpu_args, **kwargs, out=torch.empty_like(first)))
                flat = [t for a in tpu_args for t in (a if isinstance(a, (list, tuple)) else [a])]
                inputs = [a for a in flat if isinstance(a, torch.Tensor) and a.requires_grad]
                if grads and inputs and first.requires_grad:
                    timed("backward", lambda: torch.autograd.grad(first.sum(), inputs, allow_unused=True))
            except Exception as error:  # noqa: BLE001 - CPU may reject the sample too; go on
                say(f"  raised {type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
