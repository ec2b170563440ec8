"""Float32 accuracy on tpu: each function's largest relative error against float64 on the CPU, beside
the CPU's own float32 error, in both math modes (the README's error table).

    python -m torchtpu.tools.accuracy                 # every float unary, the nn functions, a few binaries
    python -m torchtpu.tools.accuracy --cost          # also each function's time in accurate vs fast mode
    python -m torchtpu.tools.accuracy --ops exp,tanh --json errors.json

The inputs are float32 (an even grid over the domain shown plus random points); the reference is the
same function of the same float32 inputs computed in float64 on the CPU. The error of one element is
|got - reference| / max(|reference|, 1e-6 max|reference|) (where a function crosses zero, float32
cannot be relatively exact; non-finite references are left out); the table shows the largest. For a
matmul it is normwise: max |got - reference| / max |reference|. "accurate" is torch.tpu's default math mode, "fast" the backend's approximations
(torch.tpu.set_math_mode). Matmuls run under each torch.set_float32_matmul_precision setting.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

import torchtpu

POINTS = 1 << 18  # inputs per function (a grid and as many random points)


def _unary(fn, lo, hi):
    return fn, (lo, hi)


def _matrix(fn, scale=3.0, shape=(256, 512)):
    """A function of one random normal matrix (softmax, norms, losses of logits)."""
    return fn, ("normal", scale, shape)



def _targets(x):
    return (torch.arange(x.shape[0], device=x.device) * 7) % x.shape[1]


def _probabilities(x):
    return torch.sigmoid(x)


CASES = {
    # name: (function of float32 inputs, domain)
    "abs": _unary(torch.abs, -5, 5), "acos": _unary(torch.acos, -0.999, 0.999),
    "acosh": _unary(torch.acosh, 1, 50), "asin": _unary(torch.asin, -0.999, 0.999),
    "asinh": _unary(torch.asinh, -50, 50), "atan": _unary(torch.atan, -50, 50),
    "atanh": _unary(torch.atanh, -0.999, 0.999), "ceil": _unary(torch.ceil, -5, 5),
    "cos": _unary(torch.cos, -5, 5), "cosh": _unary(torch.cosh, -10, 10),
    "deg2rad": _unary(torch.deg2rad, -360, 360), "digamma": _unary(torch.digamma, 0.01, 20),
    "erf": _unary(torch.erf, -5, 5), "erfc": _unary(torch.erfc, -5, 5),
    "erfinv": _unary(torch.erfinv, -0.999, 0.999), "exp": _unary(torch.exp, -5, 5),
    "exp2": _unary(torch.exp2, -10, 10), "expm1": _unary(torch.expm1, -5, 5),
    "floor": _unary(torch.floor, -5, 5), "frac": _unary(torch.frac, -5, 5),
    "lgamma": _unary(torch.lgamma, 0.01, 20), "log": _unary(torch.log, 0.001, 50),
    "log10": _unary(torch.log10, 0.001, 50), "log1p": _unary(torch.log1p, -0.999, 5),
    "log2": _unary(torch.log2, 0.001, 50), "logit": _unary(torch.logit, 0.001, 0.999),
    "i0": _unary(torch.i0, -5, 5), "neg": _unary(torch.neg, -5, 5),
    "rad2deg": _unary(torch.rad2deg, -5, 5), "reciprocal": _unary(torch.reciprocal, 0.01, 50),
    "round": _unary(torch.round, -5, 5), "rsqrt": _unary(torch.rsqrt, 0.001, 50),
    "sigmoid": _unary(torch.sigmoid, -5, 5), "sign": _unary(torch.sign, -5, 5),
    "sin": _unary(torch.sin, -5, 5), "sinc": _unary(torch.sinc, -5, 5),
    "sinh": _unary(torch.sinh, -10, 10), "sqrt": _unary(torch.sqrt, 0.001, 50),
    "square": _unary(torch.square, -5, 5), "tan": _unary(torch.tan, -1.5, 1.5),
    "tanh": _unary(torch.tanh, -5, 5), "trunc": _unary(torch.trunc, -5, 5),
    "pow(x, 2.5)": _unary(lambda x: torch.pow(x, 2.5), 0.001, 10),
    "pow(x, 3)": _unary(lambda x: torch.pow(x, 3), -5, 5),
    "special.i0e": _unary(torch.special.i0e, -5, 5), "special.i1": _unary(torch.special.i1, -5, 5),
    "special.i1e": _unary(torch.special.i1e, -5, 5), "special.ndtr": _unary(torch.special.ndtr, -5, 5),
    "special.ndtri": _unary(torch.special.ndtri, 0.001, 0.999),
    "special.log_ndtr": _unary(torch.special.log_ndtr, -5, 5),
    "special.erfcx": _unary(torch.special.erfcx, -5, 5), "special.entr": _unary(torch.special.entr, 0.001, 5),
    "special.bessel_j0": _unary(torch.special.bessel_j0, -5, 5),
    "special.bessel_j1": _unary(torch.special.bessel_j1, -5, 5),
    "relu": _unary(F.relu, -5, 5), "gelu": _unary(F.gelu, -5, 5),
    "gelu(tanh)": _unary(lambda x: F.gelu(x, approximate="tanh"), -5, 5),
    "silu": _unary(F.silu, -5, 5), "mish": _unary(F.mish, -5, 5), "softplus": _unary(F.softplus, -5, 5),
    "elu": _unary(F.elu, -5, 5), "selu": _unary(F.selu, -5, 5), "celu": _unary(F.celu, -5, 5),
    "hardswish": _unary(F.hardswish, -5, 5), "hardsigmoid": _unary(F.hardsigmoid, -5, 5),
    "logsigmoid": _unary(F.logsigmoid, -5, 5), "tanhshrink": _unary(F.tanhshrink, -5, 5),
    "softsign": _unary(F.softsign, -5, 5),
    "softmax": _matrix(lambda x: torch.softmax(x, -1)), "log_softmax": _matrix(lambda x: torch.log_softmax(x, -1)),
    "layer_norm": _matrix(lambda x: F.layer_norm(x, x.shape[-1:])),
    "rms_norm": _matrix(lambda x: F.rms_norm(x, x.shape[-1:])),
    "group_norm": _matrix(lambda x: F.group_norm(x.reshape(16, 32, 256), 8).reshape(x.shape)),
    "batch_norm": _matrix(lambda x: F.batch_norm(x, None, None, training=True)),
    "normalize": _matrix(lambda x: F.normalize(x, dim=-1)),
    "vector_norm": _matrix(lambda x: torch.linalg.vector_norm(x, dim=-1)),
    "cross_entropy": _matrix(lambda x: F.cross_entropy(x, _targets(x), reduction="none")),
    "nll_loss": _matrix(lambda x: F.nll_loss(torch.log_softmax(x, -1), _targets(x), reduction="none")),
    "mse_loss": _matrix(lambda x: F.mse_loss(x, x.flip(0), reduction="none")),
    "smooth_l1_loss": _matrix(lambda x: F.smooth_l1_loss(x, x.flip(0), reduction="none")),
    "binary_cross_entropy": _matrix(lambda x: F.binary_cross_entropy(_probabilities(x), _probabilities(x.flip(0)),
                                                                     reduction="none")),
    "binary_cross_entropy_with_logits": _matrix(
        lambda x: F.binary_cross_entropy_with_logits(x, _probabilities(x.flip(0)), reduction="none")),
    "kl_div": _matrix(lambda x: F.kl_div(torch.log_softmax(x, -1), torch.softmax(x.flip(0), -1), reduction="none")),
    "cosine_similarity": _matrix(lambda x: F.cosine_similarity(x, x.flip(0), dim=-1)),
    "atan2": _matrix(lambda x: torch.atan2(x, x.flip(0))),
    "div": _matrix(lambda x: x / x.flip(0)),
    "pow(x, y)": _matrix(lambda x: torch.pow(x.abs() + 0.1, x.flip(0))),
    "hypot": _matrix(lambda x: torch.hypot(x, x.flip(0))),
    "logaddexp": _matrix(lambda x: torch.logaddexp(x, x.flip(0))),
    "xlogy": _matrix(lambda x: torch.xlogy(x, x.flip(0).abs())),
}
MATMUL_SHAPE = (512, 1024, 512)


def inputs(domain) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    if domain[0] == "normal":
        _, scale, shape = domain
        return torch.randn(shape, generator=generator) * scale
    lo, hi = domain
    grid = torch.linspace(lo, hi, POINTS // 2, dtype=torch.float64)
    random = torch.rand(POINTS // 2, generator=generator, dtype=torch.float64) * (hi - lo) + lo
    return torch.cat([grid, random]).float()


def relative_error(got: torch.Tensor, reference: torch.Tensor, floor: float = 1e-6) -> float:
    """max |got - reference| / max(|reference|, floor * max|reference|) over the finite references."""
    got, reference = got.double().flatten(), reference.flatten()
    keep = torch.isfinite(reference)
    if not bool(keep.any()):
        return 0.0
    got, reference = got[keep], reference[keep]
    scale = float(reference.abs().max())
    if scale == 0:
        return float((got - reference).abs().max())
    error = (got - reference).abs() / reference.abs().clamp(min=floor * scale)
    error = torch.where(torch.isnan(error), torch.full_like(error, math.inf), error)
    return float(error.max())


def measure(name: str, cost: bool) -> dict:
    fn, domain = CASES[name]
    x = inputs(domain)
    reference = fn(x.double())
    row = {"domain": "N(0, 9) 256x512" if domain[0] == "normal" else f"[{domain[0]:g}, {domain[1]:g}]",
           "cpu": relative_error(fn(x), reference)}
    on_tpu = x.to("tpu")
    for mode in ("accurate", "fast"):
        torch.tpu.set_math_mode(mode)
        row[mode] = relative_error(fn(on_tpu).cpu(), reference)
        if cost:
            row[f"{mode}_us"] = _time(fn, torch.randn(1 << 24, device="tpu") if domain[0] != "normal" else on_tpu)
    torch.tpu.set_math_mode("accurate")
    return row


def _time(fn, x, repeats: int = 10) -> float:
    fn(x)
    torch.tpu.synchronize()
    start = time.perf_counter()
    results = [fn(x) for _ in range(repeats)]  # kept: synchronize waits for the results alive
    torch.tpu.synchronize()
    elapsed = time.perf_counter() - start
    del results
    return elapsed / repeats * 1e6


def matmul_rows(cost: bool) -> dict:
    m, k, n = MATMUL_SHAPE
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)
    reference = a.double() @ b.double()
    rows = {}
    before = torch.get_float32_matmul_precision()
    try:
        for precision in ("highest", "high", "medium"):
            torch.set_float32_matmul_precision(precision)
            row = {"domain": f"N(0, 1) {m}x{k} @ {k}x{n}", "cpu": relative_error(a @ b, reference, 1.0),
                   "accurate": relative_error((a.to("tpu") @ b.to("tpu")).cpu(), reference, 1.0)}
            if cost:
                big = torch.randn(4096, 4096, device="tpu")
                row["accurate_us"] = _time(lambda v: v @ v, big)
                row["tflops"] = 2 * 4096 ** 3 / (row["accurate_us"] * 1e-6) / 1e12
            rows[f"matmul ({precision})"] = row
    finally:
        torch.set_float32_matmul_precision(before)
    return rows


def table_head(cost: bool) -> list[str]:
    platform = torchtpu._C.platform_name()
    head = f"| function | inputs | CPU float32 | {platform} accurate (default) | {platform} fast |"
    rule = "|---|---|---|---|---|"
    if cost:
        head += " accurate / fast time |"
        rule += "---|"
    return [head, rule]


def table_line(name: str, row: dict, cost: bool) -> str:
    fast = f"{row['fast']:.1e}" if "fast" in row else "(same)"
    line = f"| {name} | {row['domain']} | {row['cpu']:.1e} | {row['accurate']:.1e} | {fast} |"
    if cost:
        if "fast_us" in row:
            line += f" {row['accurate_us']:.0f} / {row['fast_us']:.0f} us |"
        elif "tflops" in row:
            line += f" {row['accurate_us']:.0f} us, {row['tflops']:.1f} TFLOP/s (4096^3) |"
        else:
            line += " |"
    return line


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", help="comma-separated function names (default: all)")
    parser.add_argument("--cost", action="store_true", help="also time each function in both math modes")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    if not torchtpu.is_available():
        print(f"torchtpu is not available: {torchtpu.init_error()}")
        return 1
    names = args.ops.split(",") if args.ops else list(CASES)
    unknown = [n for n in names if n not in CASES and not n.startswith("matmul")]
    if unknown:
        parser.error(f"unknown functions {unknown}; known: {', '.join(CASES)}")
    print(f"float32 max relative error vs float64 ({torchtpu._C.platform_name()}, "
          f"{torch.tpu.get_device_name()})")
    print("\n".join(table_head(args.cost)), flush=True)
    rows = {}

    def add(name: str, row: dict) -> None:  # each row as it is measured: a cut-off run keeps what it had
        rows[name] = row
        print(table_line(name, row, args.cost), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)

    for name in names:
        if name in CASES:
            add(name, measure(name, args.cost))
    if not args.ops or any(n.startswith("matmul") for n in names):
        for name, row in matmul_rows(args.cost).items():
            add(name, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
