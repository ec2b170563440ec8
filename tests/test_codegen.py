"""Codegen: specs validate with file:line errors, and adding an op is one spec entry."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from codegen import gen
from codegen.model import SpecError, load_spec_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_spec(tmp_path, text):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("- op: add.Tensor\n  lowering: add(self, other\n", 1, "lowering is not an expression"),
        ("- op: add.Tensor\n  lowering: frobnicate(self)\n", 1, "unknown builder primitive 'frobnicate'"),
        ("- op: add.Tensor\n  lowering: add(self, nothing)\n", 1, "'nothing' is not an argument of the schema"),
        ("- op: add.Tensor\n  lowering: add(self)\n", 1, "add() takes 2 arguments"),
        ("# a comment\n- op: nosuchop\n  lowering: neg(self)\n", 2, "no ATen overload named 'nosuchop'"),
        ("- op: add.Tensor\n  lowering: add(self, other)\n- op: neg\n  lowering: neg(self)\n  dtypes: [float99]\n", 3,
         "unknown dtype or group 'float99'"),
        ("- op: add_.Tensor\n  lowering: add(self, other)\n", 1, "not a functional overload"),
        ("- op: where.self\n  lowering: where(condition, self, other)\n  variants: [inplace]\n", 1,
         "has no inplace variant"),
        ("- op: neg\n  lowering: neg(self)\n  colour: blue\n", 1, "unknown key(s) colour"),
        ("- op: sum.dim_IntList\n  lowering: sum(dim, self, keepdim)\n", 1, "is used where value is needed"),
        ("- op: neg\n  lowering: neg(self)\n  compute: fastest\n", 1, "compute must be one of"),
        ("- op: neg\n", 1, "missing required key 'lowering'"),
        ("- op: silu_backward\n  lowering: mul(grad_output, self)\n", 1, "is CompositeImplicitAutograd"),
        ("- op: gather\n  lowering: take_along(self, dim, index)\n  index_check: {index: dim, into: self, raises: "
         "IndexError, message: m}\n", 3, "index names 'dim', which is not a Tensor"),
        ("- op: gather\n  lowering: take_along(self, dim, index)\n  index_check: {index: index, into: self, raises: "
         "KeyError, message: m}\n", 3, "raises is IndexError or RuntimeError"),
        ("- op: gather\n  lowering: take_along(self, dim, index)\n  index_check: {index: index, into: self, raises: "
         "IndexError, message: \"{colour}\"}\n", 3, "message may name only"),
        ("- op: _unique\n  lowering: (unique_sorted(self, 0), unique_sorted(self, 1), unique_sorted(self, 3))\n"
         "  compute: common\n  variants: []\n  data_dependent: [0, 2]\n", 1, "data_dependent lists positions of"),
        ("- op: neg\n  lowering: neg(self)\n  dtypes: [float32]\n  dtypes: [int64]\n", 4,
         "key 'dtypes' appears twice in one entry (first at line 3)"),
        ("- op: neg\n  lowering: neg(self)\n  test: {opinfo: neg, atol: 1e-5, atol: 1e-3}\n", 3,
         "key 'atol' appears twice"),
        ("- op: neg\n  lowering: neg(self)\n  test: {opinfo: neg,\n    tpu: {rtol: 1e-3}}\n", 4,
         "test.tpu needs `measured`"),
        ("- op: neg\n  lowering: neg(self)\n  test: {opinfo: neg, tpu: {measured: \"1e-4 on a v5e\"}}\n", 3,
         "test.tpu names no tolerance"),
        ("- op: neg\n  lowering: neg(self)\n  test: {opinfo: neg, tpu: {rtol: loose, measured: x}}\n", 3,
         "test.tpu.rtol must be a non-negative number"),
        ("- op: neg\n  lowering: neg(self)\n  test: {opinfo: neg, tpu: {tolerance: 1, measured: x}}\n", 3,
         "test.tpu takes"),
        ("- op: neg\n  lowering: neg(self)\n  test: {opinfo: neg, random_when: \"dropout p\"}\n", 3,
         "test.random_when names a sample's keyword argument"),
        ("- op: _foreach_norm.Scalar\n  foreach: lists\n  lowering: vector_norm(self, ord, [], False)\n", 1,
         "a foreach: lists lowering is one call of a list primitive (foreach_vector_norm"),
        ("- op: _foreach_norm.Scalar\n  foreach: true\n  lowering: foreach_vector_norm(self, ord)\n", 1,
         "foreach_vector_norm() gives a list of results: it is the whole lowering of a foreach: lists spec"),
    ],
)
def test_bad_spec_names_file_and_line(tmp_path, text, line, message):
    path = write_spec(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec_file(path, "specs/bad.yaml", ROOT)
    assert str(info.value).startswith(f"specs/bad.yaml:{line}: "), str(info.value)
    assert message in str(info.value)


def copy_tree(tmp_path):
    root = tmp_path / "repo"
    for part in ("specs", "codegen", "generated", "runtime"):
        shutil.copytree(os.path.join(ROOT, part), root / part, ignore=shutil.ignore_patterns("__pycache__", "bazel"))
    return root


def run_gen(root, *args):
    env = dict(os.environ, BUILD_WORKSPACE_DIRECTORY=str(root), TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    return subprocess.run([sys.executable, "-m", "codegen.gen", *args], cwd=str(root), env=env,
                          capture_output=True, text=True, timeout=300)


# The generator reads torch's C++ headers (which ops have a Meta kernel): a TPU host's packed torch
# leaves them out (../shared/tpu/pack.sh).
TORCH_HEADERS = os.path.isdir(os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "ops"))


@pytest.mark.skipif(not TORCH_HEADERS, reason="torch's C++ headers are not installed here (the generator reads them)")
def test_checked_in_generated_code_matches_specs(capsys):
    assert gen.main(["--check"]) == 0, capsys.readouterr().err


def test_adding_an_op_is_one_spec_entry(tmp_path):
    root = copy_tree(tmp_path)
    with open(root / "specs" / "elementwise.yaml", "a") as f:
        f.write("\n- op: deg2rad\n  lowering: mul(self, 0.017453292519943295)\n"
                "  compute: common_float\n  dtypes: floating\n  test: {opinfo: deg2rad}\n")
    assert run_gen(root, "--check").returncode == 1  # generated/ is now stale
    result = run_gen(root)
    assert result.returncode == 0, result.stderr
    register = (root / "generated" / "ops" / "register.cpp").read_text()
    for overload in ("deg2rad", "deg2rad_", "deg2rad.out"):
        assert f'm.impl("{overload}", ' in register
    emitters = (root / "generated" / "ops" / "emitters.cpp").read_text()
    assert "emit_deg2rad(" in emitters and "b.mul(anchor, b.scalar_like(0.017453292519943295, anchor))" in emitters
    assert "def test_deg2rad(dtype):" in (root / "generated" / "tests" / "test_parity.py").read_text()
    assert run_gen(root, "--check").returncode == 0


def test_bad_spec_stops_codegen(tmp_path):
    root = copy_tree(tmp_path)
    with open(root / "specs" / "elementwise.yaml", "a") as f:
        f.write("\n- op: sigmoid\n  lowering: sigmoidish(self)\n")
    before = (root / "generated" / "ops" / "emitters.cpp").read_text()
    result = run_gen(root)
    assert result.returncode == 1
    assert "specs/elementwise.yaml:" in result.stderr and "unknown builder primitive 'sigmoidish'" in result.stderr
    assert (root / "generated" / "ops" / "emitters.cpp").read_text() == before


def test_optional_argument_forms(tmp_path):
    # default(arg, literal) reads arg, or the literal where it is None; is_none(arg) is a compile-time bool.
    path = write_spec(tmp_path, "- op: var.correction\n  lowering: var(self, dim, default(correction, 1), keepdim)\n"
                                "  compile_time: [correction]\n  variants: []\n"
                                "- op: any.dims\n  lowering: any(self, dim, keepdim, is_none(dim))\n  variants: []\n")
    var, any_dims = load_spec_file(path, "specs/bad.yaml", ROOT)
    assert "(a.is_none(2) ? 1.0 : a.real(2))" in var.overloads[0].emit_expression
    assert "a.is_none(1))" in any_dims.overloads[0].emit_expression
    runtime = write_spec(tmp_path, "- op: var.correction\n  lowering: var(self, dim, default(correction, 1), keepdim)\n")
    with pytest.raises(SpecError, match="needs a compile-time argument"):
        load_spec_file(runtime, "specs/bad.yaml", ROOT)


def test_string_attributes_reach_str_primitive_parameters(tmp_path):
    from codegen.model import builder_primitives

    assert builder_primitives(ROOT)["div_rounded"] == ("value", "value", "str")
    # A `str?` argument: None reads as "".
    path = write_spec(tmp_path, "- op: div.Tensor_mode\n  lowering: div_rounded(self, other, rounding_mode)\n"
                                "  compute: output\n")
    (spec,) = load_spec_file(path, "specs/bad.yaml", ROOT)
    assert spec.overloads[0].emit_expression == \
        "{b.div_rounded(a.value(0), a.value(1), (a.is_none(2) ? std::string() : a.string(2)))}"
    # A string literal.
    path = write_spec(tmp_path, '- op: floor_divide\n  lowering: div_rounded(self, other, "floor")\n')
    (spec,) = load_spec_file(path, "specs/bad.yaml", ROOT)
    assert spec.overloads[0].emit_expression == '{b.div_rounded(a.value(0), a.value(1), std::string("floor"))}'
    for lowering, message in (('div_rounded(self, other, "x;y")', "may hold only letters"),
                              ("div_rounded(self, other, 3)", "cannot stand where str is needed"),
                              ("div_rounded(self, rounding_mode, other)", "is used where value is needed")):
        path = write_spec(tmp_path, f"- op: div.Tensor_mode\n  lowering: '{lowering}'\n")
        with pytest.raises(SpecError) as info:
            load_spec_file(path, "specs/bad.yaml", ROOT)
        assert message in str(info.value), str(info.value)


def test_a_spec_tolerance_for_the_tpu_applies_there_only(tmp_path, monkeypatch):
    """`test.tpu` tolerances reach the parity check for their dtypes, and replace the others only on a TPU."""
    import torchtpu
    from torchtpu import testing

    spec = load_spec_file(write_spec(tmp_path,
        "- op: neg\n  lowering: neg(self)\n  test: {opinfo: neg, atol: 1e-5, rtol: 1e-5,\n"
        "    tpu: {dtypes: [float32], grad_rtol: 3e-4, measured: \"1.5e-4 on a v5e\"}}\n"), "specs/x.yaml", ROOT)[0]
    assert spec.test["tpu"] == {"dtypes": ["float32"], "grad_rtol": 3e-4}
    tpu = spec.test["tpu"]
    here = torchtpu._C.platform_name()
    assert testing._tolerances_here(tpu, "float32", 1e-5, 1e-5) == (
        (1e-5, 1e-5, None, 3e-4) if here == "tpu" else (1e-5, 1e-5, None, None))
    monkeypatch.setattr(torchtpu._C, "platform_name", lambda: "tpu")
    assert testing._tolerances_here(tpu, "float32", 1e-5, 1e-5, 2e-5, 2e-5) == (1e-5, 1e-5, 2e-5, 3e-4)
    assert testing._tolerances_here(tpu, "float64", 1e-5, 1e-5, 2e-5, 2e-5) == (1e-5, 1e-5, 2e-5, 2e-5)
    monkeypatch.setattr(torchtpu._C, "platform_name", lambda: "cpu")
    assert testing._tolerances_here(tpu, "float32", 1e-5, 1e-5, 2e-5, 2e-5) == (1e-5, 1e-5, 2e-5, 2e-5)
