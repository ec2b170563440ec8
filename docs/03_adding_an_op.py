"""Adding an op by a YAML spec: a real entry from specs/, the generator run into a scratch copy, the
emitter it writes for a new op, and what a bad spec gets."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="3. Adding an op by a YAML spec")


@app.cell
def _():
    import os
    import pathlib
    import re
    import shutil
    import subprocess
    import sys
    import tempfile
    import textwrap

    import marimo as mo
    import torch

    import torchtpu

    # the repository: docs/ is one level below it
    REPO = pathlib.Path(mo.notebook_dir()).resolve().parent
    return REPO, mo, os, re, shutil, subprocess, sys, tempfile, textwrap, torch, torchtpu


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 3. Adding an op by a YAML spec

    No ATen kernel in torchtpu is written by hand. Each op is one entry in a YAML file under `specs/`:
    the ATen overload it implements, a *lowering* (an expression over the StableHLO builder's
    primitives), the dtypes it supports and how to test it. `python -m codegen.gen` turns the specs
    into C++ (`generated/ops/`: the PrivateUse1 registrations, one StableHLO *emitter* per overload,
    the Meta functions) and the parity tests (`generated/tests/test_parity.py`).

    This notebook reads a real spec, shows the code generated from it, then adds a new op in a
    scratch copy of `specs/` and runs the generator there, so the checkout's `generated/` is never
    touched.
    """)
    return


@app.cell
def _(REPO, mo, re):
    # A real entry: hypot, from specs/binary.yaml.
    binary = (REPO / "specs" / "binary.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(binary) if line.startswith("- op: hypot"))
    end = next((i for i in range(start + 1, len(binary)) if binary[i].startswith("- op:")), len(binary))
    hypot_spec = "\n".join(binary[start:end]).strip()

    # What the generator made of it: one emitter per overload it derived (functional, in-place, out=).
    emitters = (REPO / "generated" / "ops" / "emitters.cpp").read_text()
    hypot_emitters = "\n".join(
        line for line in emitters.splitlines() if re.match(r"(// hypot[_.a-z]* =|std::vector<Value> emit_hypot)", line)
    )
    mo.vstack([
        mo.md(f"**`specs/binary.yaml`, line {start + 1}:**"),
        mo.md(f"```yaml\n{hypot_spec}\n```"),
        mo.md("**`generated/ops/emitters.cpp`, its emitters:**"),
        mo.md(f"```cpp\n{hypot_emitters}\n```"),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Each emitter appends the lowering to a builder and returns the values; `nominal(...)` reads an
    argument as the compute dtype the spec asked for. The same emitter serves eager mode (wrapped in a
    one-op module and compiled once per shape) and `torch.compile` (called into a whole graph's
    module). The overload knows where it came from:
    """)
    return


@app.cell
def _(mo, torch, torchtpu):
    where = {name: source for name, variant, source in torchtpu._C.spec_overloads() if name.startswith("hypot")}
    a, b = torch.randn(5), torch.randn(5)
    on_tpu = torch.hypot(a.to("tpu"), b.to("tpu"))
    mo.md(
        f"""
    registered from: `{where}`

    `torch.hypot` on tpu `{[round(v, 4) for v in on_tpu.cpu().tolist()]}`,
    on the CPU `{[round(v, 4) for v in torch.hypot(a, b).tolist()]}`: equal **{torch.allclose(on_tpu.cpu(), torch.hypot(a, b))}**
    """
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## A new op: `logaddexp`

    `aten::logaddexp` computes `log(exp(a) + exp(b))` without overflowing. Its lowering is the
    numerically safe form `max(a, b) + log1p(exp(-|a - b|))`, written with the builder's primitives.
    `compute: common_float` makes integer inputs compute in the default float dtype, as PyTorch does;
    `test: {opinfo: logaddexp}` asks for a parity test over PyTorch's OpInfo samples.

    In the repository you would append the entry to `specs/binary.yaml`, run
    `python -m codegen.gen` (CI runs `python -m codegen.gen --check`, which fails when `generated/`
    is out of date) and rebuild the extension with `pip install --no-build-isolation -e .`.
    Here the generator runs on a scratch copy: it reads `specs/` and the builder header from the
    directory named by `BUILD_WORKSPACE_DIRECTORY` (the variable `bazel run //codegen:gen` sets) and
    writes that directory's `generated/`.
    """)
    return


@app.cell
def _(REPO, os, shutil, subprocess, sys, tempfile, textwrap):
    NEW_SPEC = """
    - op: logaddexp
      lowering: add(maximum(self, other), log1p(exp(neg(abs(sub(self, other))))))
      compute: common_float
      dtypes: floating
      test: {opinfo: logaddexp}
    """

    def scratch_checkout(extra_spec: str) -> str:
        """specs/ and the builder header copied to a temporary directory, plus `extra_spec`."""
        root = tempfile.mkdtemp(prefix="torchtpu-spec-")
        shutil.copytree(REPO / "specs", os.path.join(root, "specs"))
        os.makedirs(os.path.join(root, "runtime", "hlo"))
        shutil.copy(REPO / "runtime" / "hlo" / "hlo_builder.h", os.path.join(root, "runtime", "hlo"))
        spec_file = os.path.join(root, "specs", "binary.yaml")
        spec_dir = os.path.join(root, "specs")
        already = any("\n- op: logaddexp\n" in open(os.path.join(spec_dir, name)).read()
                      for name in os.listdir(spec_dir))   # once the repository has it
        if extra_spec and not (already and "- op: logaddexp\n" in extra_spec):
            with open(spec_file, "a") as f:
                f.write("\n" + textwrap.dedent(extra_spec).strip("\n") + "\n")
        return root

    def run_codegen(root: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, BUILD_WORKSPACE_DIRECTORY=root)
        return subprocess.run([sys.executable, "-m", "codegen.gen"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)

    scratch = scratch_checkout(NEW_SPEC)
    generated = run_codegen(scratch)
    print("$ BUILD_WORKSPACE_DIRECTORY=<scratch> python -m codegen.gen")
    print(generated.stdout + generated.stderr)
    assert generated.returncode == 0, generated.stderr
    return NEW_SPEC, run_codegen, scratch, scratch_checkout


@app.cell
def _(mo, os, scratch):
    new_emitters = open(os.path.join(scratch, "generated", "ops", "emitters.cpp")).read().splitlines()
    logaddexp_lines = [
        line for line in new_emitters
        if line.startswith("// logaddexp") or line.startswith("std::vector<Value> emit_logaddexp")
    ]
    registrations = [
        line.strip() for line in open(os.path.join(scratch, "generated", "ops", "register.cpp"))
        if '"logaddexp' in line
    ]
    parity = open(os.path.join(scratch, "generated", "tests", "test_parity.py")).read()
    tests = [line for line in parity.splitlines() if line.startswith("def test_logaddexp")]
    assert logaddexp_lines and registrations and tests
    mo.vstack([
        mo.md("**The emitters generated for `logaddexp` (`generated/ops/emitters.cpp`):**"),
        mo.md("```cpp\n" + "\n".join(logaddexp_lines) + "\n```"),
        mo.md("**Their registrations (`generated/ops/register.cpp`):**"),
        mo.md("```cpp\n" + "\n".join(registrations) + "\n```"),
        mo.md("**And the parity tests (`generated/tests/test_parity.py`):**"),
        mo.md("```python\n" + "\n".join(tests) + "\n```"),
        mo.md(
            "ATen has no in-place `logaddexp_`, so the generator derived the functional overload and `out=`. "
            "After a rebuild, `torch.logaddexp` on tpu runs the emitter above instead of falling back to the CPU."
        ),
    ])
    return (logaddexp_lines,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## A bad spec

    Mistakes stop the generator with the spec's `file:line` and what is wrong, before any C++ is
    written. Here the lowering names a primitive the builder does not have:
    """)
    return


@app.cell
def _(mo, run_codegen, scratch_checkout, shutil):
    broken = scratch_checkout("""
    - op: deg2rad
      lowering: mul(self, degrees_to_radians(1.0))
      dtypes: floating
    """)
    failed = run_codegen(broken)
    shutil.rmtree(broken, ignore_errors=True)
    assert failed.returncode != 0
    message = failed.stderr.strip()
    known = message.find("; known: ")
    if known > 0:  # the list of every primitive the builder has is long: its start is enough here
        message = message[: known + 120] + " ..."
    mo.md(f"exit status **{failed.returncode}**:\n\n```\n{message}\n```")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The spec fields

    | field | meaning |
    |---|---|
    | `op` | the functional ATen overload; its schema comes from torchgen, never retyped |
    | `lowering` | an expression over builder primitives and the schema's argument names (or `name = expr` lines) |
    | `compute` | the dtype the lowering runs in: `common` (default), `common_float`, `output` |
    | `dtypes` | `all`, `floating`, `integral`, `numeric` or a list |
    | `variants` | which in-place / `out=` overloads to derive (default: all ATen has) |
    | `compile_time` / `runtime` | Scalars baked into the module / floats passed at run time |
    | `test` | `opinfo`, `dtypes`, tolerances for the generated parity test |

    The README lists every field. The primitives a lowering may name are the methods in the
    "Primitives that spec lowerings name" section of `runtime/hlo/hlo_builder.h`.
    """)
    return


@app.cell
def _(logaddexp_lines, scratch, shutil):
    # the scratch copy is not needed once its emitters were read
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"removed the scratch copy ({len(logaddexp_lines)} logaddexp lines were read from it)")
    return


if __name__ == "__main__":
    app.run()
