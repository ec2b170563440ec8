"""The Llama train step's module as torch.tpu.graph captures it beside jax.jit's, op family by op family
(issue 20's "module quality"): where our StableHLO does more work than jax's for the same step.

    python benchmarks/module_compare.py [--size tiny|110m|500m] [--dtype float32|bfloat16]
                                        [--precision highest|high|medium] [--out DIR] [--compile]
                                        [--from DIR]

Both modules are the programs handed to XLA (ours: the largest module compiled while capturing the
step, read from TORCHTPU_DUMP_DIR; jax's: `jax.jit(train).lower(...).as_text()`), so the counts say
what each asks for, before XLA's passes. It prints, per op family, the count in each and the ratio,
the megabytes each family's results hold (what it moves, before XLA fuses), then the dot_generals by
operand types and precision, and the converts by (from, to). `--out DIR` keeps both texts (ours.mlir,
jax.mlir) for reading; `--from DIR` compares saved ones (a TPU host's) without running anything.
Nothing is timed: compile_step.py measures.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile
from pathlib import Path

DUMP_DIR = tempfile.mkdtemp(prefix="torchtpu-modules-")
os.environ["TORCHTPU_DUMP_DIR"] = DUMP_DIR  # read when the first module compiles

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compile_step as cs  # noqa: E402

OP = re.compile(r'(?:"stablehlo\.([a-z_]+)"|\bstablehlo\.([a-z_]+))')


def element_of(tensor_type: str) -> str:
    return tensor_type.rstrip(">").split("x")[-1].replace("tensor<", "")


def families(text: str) -> collections.Counter:
    counts = collections.Counter()
    for match in OP.finditer(text):
        counts[match.group(1) or match.group(2)] += 1
    return counts


ELEMENT_BYTES = {"i1": 1, "i8": 1, "ui8": 1, "f8E4M3FN": 1, "f8E5M2": 1, "bf16": 2, "f16": 2, "i16": 2,
                 "f32": 4, "i32": 4, "ui32": 4, "f64": 8, "i64": 8, "ui64": 8, "complex<f32>": 8}


def result_megabytes(text: str) -> collections.Counter:
    """MB of the results each op family makes (its result tensors' sizes, before XLA fuses anything):
    which families move the most data, where the op counts weigh a scalar like a whole activation."""
    made = collections.Counter()
    for line in text.splitlines():
        match = OP.search(line)
        if not match or " = " not in line:
            continue
        results = line.rsplit("->", 1)[-1] if "->" in line else line.rsplit(":", 1)[-1]
        for shape in re.findall(r"tensor<([^>]*)>", results):
            *dims, element = shape.split("x") if "x" in shape else ("", shape)
            count = 1
            for d in dims:
                count *= int(d) if d.isdigit() else 1
            made[match.group(1) or match.group(2)] += count * ELEMENT_BYTES.get(element, 4)
    return collections.Counter({k: round(v / 1e6) for k, v in made.items() if v >= 1e6})


def by_types(text: str, op: str, label) -> collections.Counter:
    """Lines of `op`, counted by label(line, its operand and result element types)."""
    counts = collections.Counter()
    for line in text.splitlines():
        if op in line:
            types = [element_of(t) for t in re.findall(r"tensor<[^>]*>", line.split(":")[-1])]
            if len(types) >= 2:
                counts[label(line, types)] += 1
    return counts


def dot_label(line: str, types: list[str]) -> str:
    precision = re.search(r"precision = \[([^\]]*)\]", line)
    shown = precision.group(1).replace("#stablehlo<precision ", "").replace(">", "") if precision else "DEFAULT"
    return f"{' x '.join(types[:2])} -> {types[-1]}  [{shown}]"


def llama_batch(args):
    """The Llama's sizes and the benchmark's token batch for them."""
    sizes = cs.LLAMA_SIZES[args.size]
    vocab, *_, batch, length = sizes
    (ids,) = next(cs.common.token_batches(args.seed, batch, length, vocab))
    return sizes, ids


def our_module(args) -> str:
    sizes, ids = llama_batch(args)
    length = ids.shape[1]
    amp = torch.bfloat16 if args.dtype == "bfloat16" else None
    step = cs.torch_train_step(cs.llama.build(sizes, args.seed), (ids,), "tpu", False, cs.llama_adamw, cs.llama_loss,
                               cs.LLAMA_CLIP, graphed=True, amp=amp, warmup_batch=(ids[:1, :max(8, length // 8)],))
    step()
    torch.tpu.synchronize()
    dumped = sorted(Path(DUMP_DIR).glob("*"), key=lambda p: p.stat().st_size)
    if not dumped:
        raise SystemExit(f"no module was dumped to {DUMP_DIR} (a persistent cache hit compiles nothing: "
                         "set TORCHTPU_CACHE_DIR to an empty directory)")
    return dumped[-1].read_text()


def jax_module(args) -> str:
    import jax
    sizes, ids = llama_batch(args)
    model = cs.llama.build(sizes, args.seed)
    jl = cs.JaxLlama(model.config, jax.numpy.bfloat16 if args.dtype == "bfloat16" else None)
    params = jl.params_from(model)
    with jax.default_matmul_precision(cs.JAX_PRECISION[args.precision]):
        lowered = jax.jit(cs.jax_train_step(jl), donate_argnums=(0, 1)).lower(params, cs.adamw_init(params),
                                                              jax.numpy.asarray(ids.numpy()))
        if args.compile:
            lowered.compile()  # XLA_FLAGS=--xla_dump_to=DIR then holds both optimized modules
        return lowered.as_text()


def table(title: str, ours: collections.Counter, theirs: collections.Counter) -> None:
    print(f"\n{title:<44}{'torchtpu':>10}{'jax.jit':>10}{'ratio':>8}")
    for key in sorted(set(ours) | set(theirs), key=lambda k: -(ours[k] + theirs[k])):
        ratio = f"{ours[key] / theirs[key]:.2f}" if theirs[key] else "-"
        print(f"{key:<44}{ours[key]:>10}{theirs[key]:>10}{ratio:>8}")
    print(f"{'total':<44}{sum(ours.values()):>10}{sum(theirs.values()):>10}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(cs.LLAMA_SIZES), default="tiny")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--precision", choices=sorted(cs.JAX_PRECISION), default="highest")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write ours.mlir and jax.mlir here")
    parser.add_argument("--from", dest="saved", metavar="DIR",
                        help="compare the ours.mlir and jax.mlir an earlier --out wrote (e.g. on a TPU host)")
    parser.add_argument("--compile", action="store_true",
                        help="also compile jax's module (ours always is): with XLA_FLAGS=--xla_dump_to=DIR, XLA's "
                             "optimized modules of both land in DIR, for the platform's own passes")
    args = parser.parse_args(argv)
    torch.set_float32_matmul_precision(args.precision)
    if args.saved:
        ours, theirs = (Path(args.saved, name).read_text() for name in ("ours.mlir", "jax.mlir"))
    else:
        ours, theirs = our_module(args), jax_module(args)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        Path(args.out, "ours.mlir").write_text(ours)
        Path(args.out, "jax.mlir").write_text(theirs)
    print(f"Llama {args.size} train step, {args.dtype}, precision {args.precision}: "
          f"torchtpu {len(ours.splitlines())} lines, jax {len(theirs.splitlines())} lines")
    table("op family", families(ours), families(theirs))
    table("op family, MB of results", result_megabytes(ours), result_megabytes(theirs))
    table("dot_general (operands -> result) [precision]", *(by_types(t, "dot_general", dot_label) for t in (ours, theirs)))
    convert_label = lambda line, types: f"{types[0]} -> {types[-1]}"  # noqa: E731
    table("convert (from -> to)", *(by_types(t, "stablehlo.convert", convert_label) for t in (ours, theirs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
