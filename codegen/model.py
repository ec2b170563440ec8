"""The spec model: reads specs/*.yaml, validates every entry against torchgen's schemas,
and resolves each lowering expression into the builder calls the templates print.

A spec entry (see README "Adding an op"):

    - op: add.Tensor                  # functional overload; its schema comes from native_functions.yaml
      lowering: add(self, mul(other, alpha))
      compute: common                 # output | common | common_float   (the dtype the lowering runs in)
      promote: [self, other, alpha]   # converted to the compute dtype (default: every Tensor/Scalar argument)
      compile_time: []                # Scalars baked into the module instead of passed at run time
      dtypes: all                     # a group (all, floating, integral, numeric) or a list of torch dtype names
      variants: [inplace, out]        # which of ATen's in-place / out= / mutable overloads to derive (default: all)
      writes: [running_mean]          # arguments the op updates though its schema does not say so
      divisor: other                  # must hold no zero where the op computes in integers (ZeroDivisionError)
      index_check: {index: index, into: self, dim: dim, negative: false, raises: RuntimeError,
                    message: "index {value} is out of bounds for dimension {dim} with size {size}"}
                                      # positions checked under TORCHTPU_CHECK_INDICES=1 (see _index_check)
      runtime: [lr]                   # float arguments passed at run time (default: compile-time)
      foreach: true                   # the lowering is per element of the list arguments (_foreach_*);
                                      # elementwise: also element by element within each tensor, so lists
                                      # of 0-d tensors run it once over one vector of their values;
                                      # lists: the lowering is one call of a list primitive (declared
                                      # `std::vector<Value> name(...)`), given the whole lists, giving
                                      # every result
      generator: implicit             # draws from the default generator, named `generator` in the lowering
      test: {opinfo: add, dtypes: [float32, int64], atol: 1e-5, rtol: 1e-5}
                                      # grad_atol / grad_rtol: for the gradient comparison (default: atol / rtol)
                                      # tpu: {dtypes: [float32], grad_rtol: 3e-4, measured: "..."}: tolerances
                                      # that replace these on a TPU only, with the measured error that needs them
                                      # random_when: dropout_p: samples whose keyword argument of that name is
                                      # nonzero draw random numbers, and are not compared

Errors name the spec file and line and what is wrong; codegen stops on the first file with errors.
"""

from __future__ import annotations

import ast
import dataclasses
import keyword
import re
import functools
import json
import os
from typing import Any

import yaml

DTYPE_GROUPS = {
    "floating": ["float16", "bfloat16", "float32", "float64"],
    "integral": ["uint8", "int8", "int16", "int32", "int64"],
}
DTYPE_GROUPS["numeric"] = DTYPE_GROUPS["integral"] + DTYPE_GROUPS["floating"]
DTYPE_GROUPS["all"] = ["bool"] + DTYPE_GROUPS["numeric"]
# Not in `all`: a spec claims these by name, and each claim gets generated tests.
DTYPE_GROUPS["complex"] = ["complex64", "complex128"]
DTYPE_GROUPS["float8"] = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"]
DTYPE_ORDER = DTYPE_GROUPS["all"] + DTYPE_GROUPS["complex"] + DTYPE_GROUPS["float8"]
ALL_DTYPES = set(DTYPE_ORDER)

# What parity tests run by default: one of each kind, to keep the suite fast on 2 cores. Every other
# dtype a spec supports runs too, over the first SWEEP_SAMPLES samples of its OpInfo.
DEFAULT_TEST_DTYPES = ("bool", "int64", "bfloat16", "float32")
SWEEP_SAMPLES = 3

COMPUTE = {"output": "Output", "common": "Common", "common_float": "CommonFloat"}
VARIANTS = {"inplace": "Inplace", "out": "Out", "mutable": "Inplace"}  # mutable variants write args, as in-place ones do
KEYS = {"op", "lowering", "compute", "promote", "compile_time", "dtypes", "variants", "writes", "runtime", "foreach",
        "generator", "data_dependent", "divisor", "index_check", "test", "__line__"}
INDEX_CHECK_KEYS = {"index", "into", "dim", "negative", "ignore", "raises", "message", "__line__"}
TEST_KEYS = {"opinfo", "dtypes", "atol", "rtol", "grad_atol", "grad_rtol", "tpu", "random_when", "__line__"}
TOLERANCE_KEYS = ("atol", "rtol", "grad_atol", "grad_rtol")
PLATFORM_TEST_KEYS = {"dtypes", "measured", *TOLERANCE_KEYS, "__line__"}

# The builder primitives a lowering may name are the methods declared, one per line, in the
# "Primitives that spec lowerings name" section of runtime/hlo/hlo_builder.h. Each parameter's kind:
# value = a tensor/scalar Value, values = a list of Values, ints/int/bool/bools/float/floats = compile-time attributes;
# optional_value / optional_float take an optional schema argument (Tensor?, Scalar?, float?) that may be None.
BUILDER_HEADER = os.path.join("runtime", "hlo", "hlo_builder.h")
_SECTION_START = "// --- Primitives that spec lowerings name"
_PARAMETER_KINDS = {"const Value&": "value", "const std::vector<Value>&": "values",
                    "const std::vector<int64_t>&": "ints", "int64_t": "int", "bool": "bool", "double": "float",
                    "const std::string&": "str", "const std::optional<Value>&": "optional_value",
                    "std::optional<double>": "optional_float", "const std::vector<bool>&": "bools",
                    "const std::vector<double>&": "floats"}


def builder_primitives(repo_root: str) -> dict[str, tuple[str, ...]]:
    """The primitives giving one Value: name -> the kinds of its parameters."""
    return _declared_primitives(repo_root)[0]


def list_primitives(repo_root: str) -> dict[str, tuple[str, ...]]:
    """The primitives giving a std::vector<Value> (a `foreach: lists` lowering's every result)."""
    return _declared_primitives(repo_root)[1]


@functools.lru_cache(maxsize=None)
def _declared_primitives(repo_root: str) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    path = os.path.join(repo_root, BUILDER_HEADER)
    primitives: dict[str, tuple[str, ...]] = {}
    lists: dict[str, tuple[str, ...]] = {}
    in_section = False
    for number, line in enumerate(open(path), 1):
        stripped = line.strip()
        if stripped.startswith(_SECTION_START):
            in_section = True
            continue
        if in_section and stripped.startswith("// ---"):
            break
        match = re.match(r"(std::vector<Value>|Value) (\w+)\((.*?)\)\s*(?:const\s*)?[;{]", stripped) if in_section else None
        if not match:
            continue
        returns, name, parameters = match.groups()
        kinds = []
        declared_types = [p.rsplit(" ", 1)[0].strip() for p in filter(None, (p.strip() for p in parameters.split(",")))]
        if returns != "Value" and not set(declared_types) <= set(_PARAMETER_KINDS):
            continue  # a builder helper giving several values (while_loop), not a list primitive
        for declared_type in declared_types:
            if declared_type not in _PARAMETER_KINDS:
                raise SpecError(BUILDER_HEADER, number, f"primitive {name}: parameter type "
                                                        f"{declared_type!r} is not one specs can pass")
            kinds.append(_PARAMETER_KINDS[declared_type])
        (primitives if returns == "Value" else lists)[name] = tuple(kinds)
    if not primitives:
        raise SpecError(BUILDER_HEADER, 1, f"no primitives found after {_SECTION_START!r}")
    return primitives, lists


# How a schema argument reaches the kernel and the emitter, by its torchgen type.
ATTR_TYPES = {"int": "int", "SymInt": "int", "bool": "bool", "float": "float", "str": "str", "int[]": "ints",
              "SymInt[]": "ints", "bool[]": "bools", "float[]": "floats", "ScalarType": "int", "MemoryFormat": "none", "Device": "none", "Layout": "none"}
IGNORED_NAMES = {"layout", "pin_memory", "non_blocking"}


class SpecError(Exception):
    """A problem in a spec file, located at file:line."""

    def __init__(self, path: str, line: int, message: str):
        super().__init__(f"{path}:{line}: {message}")


class _DuplicateKey(Exception):
    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


class _LineLoader(yaml.SafeLoader):
    """Records the line of every mapping so that errors can point at it."""

    def construct_mapping(self, node, deep=False):
        # YAML lets a repeated key silently replace the first; in a spec that hides a mistake.
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise _DuplicateKey(key_node.start_mark.line + 1,
                                    f"key {key!r} appears twice in one entry (first at line {seen[key]})")
            seen[key] = key_node.start_mark.line + 1
        mapping = super().construct_mapping(node, deep=deep)
        mapping["__line__"] = node.start_mark.line + 1
        return mapping


@dataclasses.dataclass
class Argument:
    name: str
    type: str  # torchgen's spelling, e.g. "Tensor", "Scalar", "int[1]?"
    kind: str  # Tensor | TensorList | Scalar | ScalarList | Attr | Generator | Ignored
    access: str  # how the emitter reads it: value | values | ints | int | bool | bools | float | floats | str | none


@dataclasses.dataclass
class Overload:
    """One registered ATen overload derived from a spec entry."""

    name: str  # "add_.Tensor"
    variant: str  # Functional | Inplace | Out
    arguments: list[Argument]
    promoted: list[int]
    written: list[int]  # arguments the op writes (see OpSpec::written in runtime/aten/op_spec.h)
    returns: list[int]  # per return: the argument it aliases, or -1 for a fresh result
    foreach: bool
    implicit_generator: bool
    emit_expression: str  # C++ returning std::vector<rt::Value>
    function: str  # the emitter's C++ name
    meta: "MetaCall | None" = None  # the direct call of its C++ Meta kernel, where ATen has one
    divisor: int = -1  # the argument that must hold no zero where the op computes in integers
    index_check: str = "{}"  # the C++ IndexCheck initializer (runtime/aten/op_spec.h); "{}": none


@dataclasses.dataclass
class MetaCall:
    """Calls ATen's C++ Meta kernel directly (at::meta::<name>), bypassing the Python meta
    registrations that shadow it in the dispatcher, so errors read exactly as on CPU/CUDA."""

    header: str  # "ATen/ops/add_meta_dispatch.h"
    locals: list[str]  # C++ statements converting the stack's IValues
    call: str  # the call expression


@dataclasses.dataclass
class Spec:
    path: str
    line: int
    op: str
    lowering: str
    compute: str
    dtypes: list[str]
    overloads: list[Overload]
    test: dict[str, Any]
    data_dependent: bool = False  # output shapes from the data: padded outputs + a count (no Meta pass)
    cut_returns: list[int] = dataclasses.field(default_factory=list)  # data_dependent: returns cut (empty: all)

    @property
    def source(self) -> str:
        return f"{self.path}:{self.line}"


@functools.lru_cache(maxsize=1)
def native_functions():
    """torchgen's parse of the installed torch's native_functions.yaml, by overload name."""
    import torchgen
    from torchgen.gen import get_grouped_native_functions, parse_native_yaml
    from torchgen.model import NativeFunctionsGroup

    root = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native")
    parsed = parse_native_yaml(os.path.join(root, "native_functions.yaml"), os.path.join(root, "tags.yaml"))
    by_name = {str(f.func.name): f for f in parsed.native_functions}
    groups = {}
    for g in get_grouped_native_functions(parsed.native_functions):
        if isinstance(g, NativeFunctionsGroup):
            groups[str(g.functional.func.name)] = g
    return by_name, groups


# How an IValue on the stack becomes each C++ argument type of an at::meta:: function.
# `{v}` is the IValue, `{n}` a local name; each entry is (statements, expression).
_IVALUE_TO_CPP = {
    "const at::Tensor &": ("", "{v}.toTensor()"),
    "at::Tensor &": ("at::Tensor {n} = {v}.toTensor();", "{n}"),
    "const ::std::optional<at::Tensor> &": ("", "{v}.toOptional<at::Tensor>()"),
    "const at::Scalar &": ("", "{v}.toScalar()"),
    "const ::std::optional<at::Scalar> &": ("", "{v}.toOptional<at::Scalar>()"),
    "int64_t": ("", "{v}.toInt()"),
    "bool": ("", "{v}.toBool()"),
    "double": ("", "{v}.toDouble()"),
    "at::IntArrayRef": ("const auto {n} = {v}.toDimVector();", "{n}"),
    "at::OptionalIntArrayRef": ("const auto {n} = {v}.isNone() ? c10::DimVector() : {v}.toDimVector();",
                                "{v}.isNone() ? at::OptionalIntArrayRef() : at::OptionalIntArrayRef({n})"),
    "const at::ITensorListRef &": ("const auto {n} = {v}.toTensorList();", "at::ITensorListRef({n})"),
    "at::TensorList": ("const auto {n} = {v}.toTensorVector();", "{n}"),
    "::std::optional<at::ScalarType>": ("", "{v}.toOptional<at::ScalarType>()"),
    "::std::optional<at::MemoryFormat>": ("", "{v}.toOptional<at::MemoryFormat>()"),
    "::std::optional<at::Layout>": ("", "{v}.toOptional<at::Layout>()"),
    "::std::optional<at::Device>": ("", "{v}.toOptional<at::Device>()"),
    "::std::optional<bool>": ("", "{v}.toOptional<bool>()"),
    "::std::optional<c10::string_view>": ("", "{v}.toOptional<c10::string_view>()"),
}


def _split_params(text: str) -> list[str]:
    params, depth, current = [], 0, ""
    for ch in text:
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        if ch == "," and depth == 0:
            params.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        params.append(current.strip())
    return params


@functools.lru_cache(maxsize=None)
def _meta_declarations(root_name: str) -> dict[str, list[list[str]]]:
    """The functions an installed ATen/ops/<op>_meta_dispatch.h declares: name -> parameter type lists."""
    import torch.utils.cpp_extension as ext

    found: dict[str, list[list[str]]] = {}
    for include in ext.include_paths():
        path = os.path.join(include, "ATen", "ops", f"{root_name}_meta_dispatch.h")
        if not os.path.exists(path):
            continue
        for line in open(path):
            line = line.strip()
            if not line.startswith("TORCH_API ") or "(" not in line:
                continue
            head, params = line[len("TORCH_API "):].split("(", 1)
            name = head.split()[-1]
            types = []
            for p in _split_params(params.rsplit(")", 1)[0]):
                p = p.split("=")[0].strip()
                types.append(p.rsplit(" ", 1)[0].strip())
            found.setdefault(name, []).append(types)
        break
    return found


# How torchgen's C++ argument types read in libtorch's demangled symbols.
_DEMANGLED = {
    "at::Tensor": "at::Tensor", "at::Scalar": "c10::Scalar", "int64_t": "long", "bool": "bool", "double": "double",
    "at::IntArrayRef": "c10::ArrayRef<long>", "at::OptionalIntArrayRef": "c10::OptionalArrayRef<long>",
    "at::ITensorListRef": "c10::IListRef<at::Tensor>", "at::TensorList": "c10::ArrayRef<at::Tensor>",
    "at::ScalarType": "c10::ScalarType", "at::MemoryFormat": "c10::MemoryFormat", "at::Layout": "c10::Layout",
    "at::Device": "c10::Device", "c10::string_view": "std::basic_string_view<char, std::char_traits<char> >",
}


def _demangled(cpp_type: str) -> str | None:
    t = cpp_type.strip()
    suffix = ""
    if t.endswith("&"):
        t = t[:-1].strip()
        suffix = "&"
        if t.startswith("const "):
            t = t[len("const "):]
            suffix = " const&"
    t = t.lstrip(":")
    if t.startswith("std::optional<") and t.endswith(">"):
        inner = _demangled(t[len("std::optional<"):-1])
        if inner is None:
            return None
        return f"std::optional<{inner}{' ' if inner.endswith('>') else ''}>{suffix}"  # nm prints "> >"
    base = _DEMANGLED.get(t)
    return None if base is None else base + suffix


@functools.lru_cache(maxsize=1)
def _exported_meta_functions() -> frozenset[str]:
    """The at::meta:: functions libtorch_cpu exports (a header may declare more than is linked)."""
    import subprocess

    import torch

    library = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    out = subprocess.run(["nm", "-DC", "--defined-only", library], capture_output=True, text=True, check=True).stdout
    return frozenset(line.split(" ", 2)[2] for line in out.splitlines() if " at::meta::" in line)


# C++ Meta kernels that set a placeholder shape their CPU kernels resize away (isin of a Scalar:
# [0], then 0-d): the dispatcher's Meta path, where PyTorch's Python registration is right, runs instead.
_PLACEHOLDER_META = {"isin.Scalar_Tensor", "isin.Scalar_Tensor_out"}


def _meta_call(f) -> "MetaCall | None":
    from torchgen.api.types import CppSignatureGroup
    from torchgen.context import native_function_manager

    if str(f.func.name) in _PLACEHOLDER_META:
        return None
    with native_function_manager(f):
        sig = CppSignatureGroup.from_native_function(f, method=False, fallback_binding=False).most_faithful_signature()
        name = sig.name()
        types = [b.type for b in sig.arguments()]
    if types not in _meta_declarations(f.root_name).get(name, []):
        return None  # no C++ Meta kernel: the dispatcher's Meta path (composite or Python) runs instead
    demangled = [_demangled(t) for t in types]
    if None in demangled or f"at::meta::{name}({', '.join(demangled)})" not in _exported_meta_functions():
        return None  # declared but not exported by libtorch
    statements, args = [], []
    for i, t in enumerate(types):
        if t not in _IVALUE_TO_CPP:
            return None
        setup, expr = _IVALUE_TO_CPP[t]
        fill = {"v": f"s[{i}]", "n": f"a{i}"}
        if setup:
            statements.append(setup.format(**fill))
        args.append(expr.format(**fill))
    return MetaCall(f"ATen/ops/{f.root_name}_meta_dispatch.h", statements, f"at::meta::{name}({', '.join(args)})")


def _classify(arg, promote: set[str], compile_time: set[str], runtime: set[str]) -> Argument:
    t = str(arg.type)
    base = t.rstrip("?")
    if base.startswith("int[") or base.startswith("SymInt["):
        base = "int[]"
    if base.startswith("bool["):  # bool[3] output_mask
        base = "bool[]"
    if base == "Tensor":
        return Argument(arg.name, t, "Tensor", "value")
    if base == "Tensor[]":
        return Argument(arg.name, t, "TensorList", "values")
    if base == "Tensor?[]":  # indexing's indices: None elements reach the emitter as Values with id -1
        return Argument(arg.name, t, "OptionalTensorList", "values")
    if base == "Scalar":
        kind = "Attr" if arg.name in compile_time else "Scalar"
        return Argument(arg.name, t, kind, "float" if kind == "Attr" else "value")
    if base == "Scalar[]":
        return Argument(arg.name, t, "ScalarList", "values")
    if base == "float" and arg.name in runtime:
        return Argument(arg.name, t, "Scalar", "value")
    if base == "Generator":
        return Argument(arg.name, t, "Generator", "value")
    if arg.name in IGNORED_NAMES:
        return Argument(arg.name, t, "Ignored", "none")
    if base in ATTR_TYPES:
        return Argument(arg.name, t, "Attr", ATTR_TYPES[base])
    return Argument(arg.name, t, "Unsupported", "none")


class _FoldNegativeNumbers(ast.NodeTransformer):
    """-3 in a lowering is the literal -3 (Python parses it as negation of 3)."""

    def visit_UnaryOp(self, node):
        node = self.generic_visit(node)
        if isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
                and isinstance(node.operand.value, (int, float)) and not isinstance(node.operand.value, bool):
            return ast.copy_location(ast.Constant(-node.operand.value), node)
        return node


class _LoweringCompiler:
    """Turns a lowering expression into C++ over the builder, checking names and arity."""

    def __init__(self, spec_path: str, line: int, arguments: list[Argument], primitives: dict[str, tuple[str, ...]],
                 foreach: bool | str = False, lists: dict[str, tuple[str, ...]] | None = None):
        self.path, self.line = spec_path, line
        self.primitives = primitives
        self.lists = lists or {}
        self.whole_lists = foreach == "lists"
        if foreach and not self.whole_lists:  # a per-element foreach lowering names one element of each list
            arguments = [dataclasses.replace(a, access="value") if a.kind in ("TensorList", "ScalarList") else a
                         for a in arguments]
        self.args = {a.name: (i, a) for i, a in enumerate(arguments)}
        # An argument named after a Python keyword (`from`) is written with a trailing underscore.
        self.args.update({f"{a.name}_": (i, a) for i, a in enumerate(arguments) if keyword.iskeyword(a.name)})

    def fail(self, message: str):
        raise SpecError(self.path, self.line, message)

    def compile(self, text: str) -> str:
        """An expression, or `name = expression` lines followed by the result expression."""
        try:
            statements = _FoldNegativeNumbers().visit(ast.parse(text.strip(), mode="exec")).body
        except SyntaxError as e:
            self.fail(f"lowering is not an expression: {e.msg} in {text!r}")
        if not statements or not isinstance(statements[-1], ast.Expr):
            self.fail("a lowering ends with the result expression")
        if self.whole_lists:
            return self.list_call(statements)
        self.locals: dict[str, str] = {}
        lines = []
        for statement in statements[:-1]:
            if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                    and isinstance(statement.targets[0], ast.Name)):
                self.fail(f"a lowering line before the result is `name = expression`, not {ast.unparse(statement)!r}")
            name = statement.targets[0].id
            if name in self.args or name in self.locals or name in self.primitives:
                self.fail(f"local {name!r} shadows an argument, another local or a primitive")
            lines.append(f"const Value l_{name} = {self.expr(statement.value, 'value')};")
            self.locals[name] = f"l_{name}"
        body = statements[-1].value
        results = body.elts if isinstance(body, ast.Tuple) else [body]
        returned = "{" + ", ".join(self.expr(r, "value") for r in results) + "}"
        if not lines:
            return returned
        return "[&]() -> std::vector<Value> { " + " ".join(lines) + f" return {returned}; }}()"

    def list_call(self, statements: list) -> str:
        """A `foreach: lists` lowering: one call of a list primitive, which gives every result."""
        call = statements[0].value
        if len(statements) != 1 or not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                                        and call.func.id in self.lists):
            self.fail(f"a foreach: lists lowering is one call of a list primitive ({', '.join(sorted(self.lists))})")
        params = self.lists[call.func.id]
        if call.keywords or len(call.args) != len(params):
            self.fail(f"{call.func.id}() takes {len(params)} arguments ({', '.join(params)}), got {len(call.args)}")
        return f"b.{call.func.id}({', '.join(self.expr(a, p) for a, p in zip(call.args, params))})"

    # Forms over optional schema arguments (not builder primitives):
    #   default(arg, literal)  arg, or literal where arg is None (e.g. default(correction, 1))
    #   is_none(arg)           a compile-time bool: whether arg is None
    SPECIAL_FORMS = {"default": 2, "is_none": 1}

    def special_form(self, node, want: str) -> str:
        name = node.func.id
        if node.keywords or len(node.args) != self.SPECIAL_FORMS[name] or not isinstance(node.args[0], ast.Name):
            self.fail(f"{name}() takes an argument name{' and a literal' if name == 'default' else ''}")
        arg = node.args[0].id
        if arg not in self.args:
            self.fail(f"{arg!r} is not an argument of the schema ({', '.join(self.args)})")
        index = self.args[arg][0]
        if name == "is_none":
            if want != "bool":
                self.fail(f"is_none({arg}) gives a bool where {want} is needed")
            return f"a.is_none({index})"
        if want == "value" or self.args[arg][1].access == "value":
            self.fail(f"default({arg}, ...) needs a compile-time argument (list {arg} in compile_time)")
        return f"(a.is_none({index}) ? {self.expr(node.args[1], want)} : {self.expr(node.args[0], want)})"

    def expr(self, node, want: str) -> str:
        if isinstance(node, ast.IfExp):  # `a if flag else b`: chosen at emission time
            return f"({self.expr(node.test, 'bool')} ? {self.expr(node.body, want)} : {self.expr(node.orelse, want)})"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and want == "bool":
            return f"!{self.expr(node.operand, 'bool')}"
        if isinstance(node, ast.BoolOp) and want == "bool":
            joiner = " && " if isinstance(node.op, ast.And) else " || "
            return "(" + joiner.join(self.expr(v, "bool") for v in node.values) + ")"
        if isinstance(node, ast.Name) and node.id in getattr(self, "locals", {}):
            if want != "value":
                self.fail(f"local {node.id!r} is a value, used where {want} is needed")
            return self.locals[node.id]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.SPECIAL_FORMS \
                and node.func.id not in self.primitives:
            return self.special_form(node, want)
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in self.lists:
                self.fail(f"{node.func.id}() gives a list of results: it is the whole lowering of a "
                          f"foreach: lists spec")
            if not isinstance(node.func, ast.Name) or node.func.id not in self.primitives:
                name = ast.unparse(node.func)
                self.fail(f"unknown builder primitive {name!r}; known: {', '.join(sorted(self.primitives))}")
            params = self.primitives[node.func.id]
            if node.keywords or len(node.args) != len(params):
                self.fail(f"{node.func.id}() takes {len(params)} arguments ({', '.join(params)}), "
                          f"got {len(node.args)}")
            if want not in ("value",):
                self.fail(f"{node.func.id}(...) gives a value where {want} is needed")
            literals = [isinstance(a, ast.Constant) and p == "value" for a, p in zip(node.args, params)]
            if not any(literals):
                return f"b.{node.func.id}({', '.join(self.expr(a, p) for a, p in zip(node.args, params))})"
            # A number operand takes the dtype of the call's first tensor operand, which is
            # evaluated once into a local so that it is not emitted twice.
            anchor = next((i for i, (a, p) in enumerate(zip(node.args, params)) if p == "value" and not literals[i]),
                          None)
            if anchor is None:
                self.fail(f"{node.func.id}() needs at least one tensor operand")
            parts = []
            for i, (a, p) in enumerate(zip(node.args, params)):
                if literals[i]:
                    if not isinstance(a.value, (int, float)) or isinstance(a.value, bool):
                        self.fail(f"literal {a.value!r} is not a number")
                    parts.append(f"b.scalar_like({float(a.value)!r}, anchor)")
                else:
                    parts.append("anchor" if i == anchor else self.expr(a, p))
            anchor_expr = self.expr(node.args[anchor], "value")
            return f"[&] {{ const Value anchor = {anchor_expr}; return b.{node.func.id}({', '.join(parts)}); }}()"
        if isinstance(node, ast.Name):
            if node.id not in self.args:
                self.fail(f"{node.id!r} is not an argument of the schema ({', '.join(self.args)})")
            index, arg = self.args[node.id]
            optional = {"optional_value": "value", "optional_float": "float"}
            if arg.access != want and not (want == "ints" and arg.access == "int") and \
                    not (want in optional and arg.access == optional[want]):
                self.fail(f"argument {node.id!r} ({arg.type}) is used where {want} is needed")
            accessor = {"value": "value", "values": "values", "ints": "ints", "int": "integer", "bool": "boolean",
                        "bools": "bools", "floats": "reals",
                        "float": "real", "str": "string", "optional_value": "optional_value",
                        "optional_float": "optional_real"}[want]
            if want == "str" and arg.type.endswith("?"):  # str? None reads as ""
                return f"(a.is_none({index}) ? std::string() : a.string({index}))"
            return f"a.{accessor}({index})"
        if isinstance(node, ast.Constant):
            if want == "bool" and isinstance(node.value, bool):
                return "true" if node.value else "false"
            if want == "float" and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
                return repr(float(node.value))
            if want == "int" and isinstance(node.value, int):
                return str(node.value)
            if want in ("optional_value", "optional_float") and node.value is None:
                return "std::nullopt"
            if want == "ints" and isinstance(node.value, int):
                return "std::vector<int64_t>{" + str(node.value) + "}"
            if want == "str" and isinstance(node.value, str):
                if not re.fullmatch(r"[\w .-]*", node.value):
                    self.fail(f"string literal {node.value!r} may hold only letters, digits, '_', '.', '-', ' '")
                return f'std::string("{node.value}")'

            self.fail(f"literal {node.value!r} cannot stand where {want} is needed")
        if isinstance(node, ast.List) and want == "ints":
            return "std::vector<int64_t>{" + ", ".join(self.expr(e, "int") for e in node.elts) + "}"
        self.fail(f"unsupported expression {ast.unparse(node)!r}")


def _written_and_returns(f, fargs, writes: list[str]) -> tuple[list[int], list[int]]:
    """The arguments an overload writes, in the order its lowering produces their new values (those
    its returns alias, in return order; then other mutated ones; then the spec's `writes`), and
    per return the argument it aliases or -1."""
    def alias(a):
        return a.annotation.alias_set if a.annotation is not None else None

    returns = []
    for r in f.func.returns:
        aliased = [i for i, a in enumerate(fargs) if alias(r) is not None and alias(a) == alias(r)]
        returns.append(aliased[0] if aliased else -1)
    written = [i for i in returns if i >= 0]
    written += [i for i, a in enumerate(fargs) if a.annotation is not None and a.annotation.is_write and i not in written]
    written += [i for i, a in enumerate(fargs) if a.name in writes and i not in written]
    return written, returns


def _platform_tolerances(value, dtypes: list[str], path, line) -> dict:
    """A test's `tpu:` entry: the tolerances that replace the test's on that platform, for its dtypes
    (default: all the op's), and `measured`, the error on the chip that needs them (required: a
    tolerance is never loosened without its reason)."""
    if isinstance(value, dict):
        line = value.pop("__line__", line)
    if not isinstance(value, dict) or set(value) - PLATFORM_TEST_KEYS:
        raise SpecError(path, line, f"test.tpu takes {', '.join(sorted(PLATFORM_TEST_KEYS - {'__line__'}))}")
    if not str(value.get("measured", "")).strip():
        raise SpecError(path, line, "test.tpu needs `measured`: the error seen on the chip that the tolerances allow")
    tolerances = {k: value[k] for k in TOLERANCE_KEYS if k in value}
    if not tolerances:
        raise SpecError(path, line, f"test.tpu names no tolerance ({', '.join(TOLERANCE_KEYS)})")
    for key, tolerance in tolerances.items():
        try:  # YAML reads 1e-4 (no dot) as a string, as the test's own tolerances, which print as they are
            number = None if isinstance(tolerance, bool) else float(tolerance)
        except (TypeError, ValueError):
            number = None
        if number is None or not number >= 0:
            raise SpecError(path, line, f"test.tpu.{key} must be a non-negative number, not {tolerance!r}")
        tolerances[key] = number
    chosen = _expand_dtypes(value["dtypes"], path, line) if "dtypes" in value else list(dtypes)
    return {"dtypes": chosen, **tolerances}


def _expand_dtypes(value, path, line) -> list[str]:
    names = [value] if isinstance(value, str) else list(value or [])
    out: list[str] = []
    for name in names:
        if name in DTYPE_GROUPS:
            out += DTYPE_GROUPS[name]
        elif name in ALL_DTYPES:
            out.append(name)
        else:
            raise SpecError(path, line, f"unknown dtype or group {name!r}; groups: {', '.join(DTYPE_GROUPS)}")
    return sorted(set(out), key=DTYPE_ORDER.index)


def _index_check(check, schema_args, path, line) -> dict | None:
    """Validates a spec's index_check: which argument holds positions (`index`: a Tensor, or a Tensor?[]
    whose entry k indexes dimension k), the Tensor they index (`into`), the dimension (`dim`: an int
    argument's name or an int; omitted: the flattened tensor, or per entry for a list), whether
    -size..-1 count from the end (`negative`), an int argument whose value is exempt (`ignore`), and
    CPU's error: `raises` (IndexError | RuntimeError) with `message`, in which {value}, {dim}, {size}
    and {position} (the first bad element's, flattened) are filled in."""
    if check is None:
        return None
    if not isinstance(check, dict) or set(check) - INDEX_CHECK_KEYS:
        raise SpecError(path, line, f"index_check is a mapping of {', '.join(sorted(INDEX_CHECK_KEYS - {'__line__'}))}")
    line = check.get("__line__", line)
    types = {a.name: str(a.type) for a in schema_args}
    for key in ("index", "into", "raises", "message"):
        if key not in check:
            raise SpecError(path, line, f"index_check needs {key!r}")
    if types.get(check["index"]) not in ("Tensor", "Tensor?[]"):
        raise SpecError(path, line, f"index_check: index names {check['index']!r}, which is not a Tensor or "
                                    f"Tensor?[] argument")
    if types.get(check["into"]) != "Tensor":
        raise SpecError(path, line, f"index_check: into names {check['into']!r}, which is not a Tensor argument")
    dim = check.get("dim")
    if dim is not None and not isinstance(dim, int) and types.get(dim) not in ("int", "SymInt"):
        raise SpecError(path, line, f"index_check: dim is an int or the name of an int argument, not {dim!r}")
    if check.get("ignore") is not None and types.get(check["ignore"]) not in ("int", "SymInt"):
        raise SpecError(path, line, f"index_check: ignore names {check['ignore']!r}, which is not an int argument")
    if check.get("negative", False) not in (True, False):
        raise SpecError(path, line, "index_check: negative is true or false")
    if check["raises"] not in ("IndexError", "RuntimeError"):
        raise SpecError(path, line, "index_check: raises is IndexError or RuntimeError")
    try:
        str(check["message"]).format(value=0, dim=0, size=0, position=0)
    except (KeyError, IndexError, ValueError) as e:
        raise SpecError(path, line, f"index_check: message may name only {{value}}, {{dim}}, {{size}}, "
                                    f"{{position}} ({e})") from None
    return check


def _index_check_initializer(check: dict | None, fargs) -> str:
    """The C++ IndexCheck for one overload (its argument positions)."""
    if check is None:
        return "{}"
    position = {a.name: i for i, a in enumerate(fargs)}
    dim = check.get("dim")
    dim_arg, dim_value = (position[dim], 0) if isinstance(dim, str) else (-1, "IndexCheck::kFlattened" if dim is None else dim)
    ignore = position[check["ignore"]] if check.get("ignore") else -1
    negative = "true" if check.get("negative", False) else "false"
    index_error = "true" if check["raises"] == "IndexError" else "false"
    return (f"{{{position[check['index']]}, {position[check['into']]}, {dim_arg}, {dim_value}, {negative}, {ignore}, "
            f"{index_error}, {json.dumps(str(check['message']))}}}")


def _cpp_name(overload: str) -> str:
    return "emit_" + overload.replace(".", "__")


def load_spec_file(path: str, display_path: str, repo_root: str) -> list[Spec]:
    with open(path) as f:
        try:
            entries = yaml.load(f, Loader=_LineLoader)
        except _DuplicateKey as e:
            raise SpecError(display_path, e.line, str(e)) from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            raise SpecError(display_path, mark.line + 1 if mark else 1, f"invalid YAML: {e}") from None
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise SpecError(display_path, 1, "a spec file is a list of entries (- op: ...)")
    by_name, groups = native_functions()
    specs = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise SpecError(display_path, 1, f"entry {entry!r} is not a mapping")
        line = entry["__line__"]
        unknown = set(entry) - KEYS
        if unknown:
            raise SpecError(display_path, line, f"unknown key(s) {', '.join(sorted(unknown))}; "
                                                f"known: {', '.join(sorted(KEYS - {'__line__'}))}")
        for required in ("op", "lowering"):
            if required not in entry:
                raise SpecError(display_path, line, f"missing required key {required!r}")
        op = str(entry["op"])
        if op not in by_name:
            close = [n for n in by_name if n.split(".")[0] == op.split(".")[0]][:6]
            raise SpecError(display_path, line, f"no ATen overload named {op!r}"
                            + (f"; did you mean one of {', '.join(close)}?" if close else ""))
        func = by_name[op]
        if func.func.kind().name != "functional":
            raise SpecError(display_path, line, f"{op} is not a functional overload; name the functional one "
                                                f"and list variants: [inplace, out]")
        if func.has_composite_implicit_autograd_kernel:
            # The tpu kernel would replace the decomposition at AutogradPrivateUse1 too, and the op has no
            # derivative formula of its own: its gradient (double backward, for *_backward ops) would be lost.
            raise SpecError(display_path, line, f"{op} is CompositeImplicitAutograd: it decomposes into ops that "
                                                f"run on tpu and get its gradient from them; a spec would lose it. "
                                                f"Spec the ops it calls instead")
        compute = entry.get("compute", "common")
        if compute not in COMPUTE:
            raise SpecError(display_path, line, f"compute must be one of {', '.join(COMPUTE)}, not {compute!r}")
        dtypes = _expand_dtypes(entry.get("dtypes", "all"), display_path, line)
        schema_args = list(func.func.schema_order_arguments())
        names = [a.name for a in schema_args]
        runtime = entry.get("runtime", [])
        default_promote = [a.name for a in schema_args
                           if str(a.type).rstrip("?") in ("Tensor", "Scalar", "Tensor[]", "Scalar[]") or a.name in runtime]
        promote = entry.get("promote", default_promote)
        compile_time = entry.get("compile_time", [])
        writes = entry.get("writes", [])
        foreach = entry.get("foreach", False)
        generator = entry.get("generator")
        if foreach not in (True, False, "elementwise", "lists"):
            raise SpecError(display_path, line, "foreach is true, elementwise, lists or false")
        if generator not in (None, "implicit"):
            raise SpecError(display_path, line, "generator: implicit is the only form (the op's schema has no generator)")
        for listed, what in ((promote, "promote"), (compile_time, "compile_time"), (runtime, "runtime"),
                             (writes, "writes")):
            for name in listed:
                if name not in names:
                    raise SpecError(display_path, line, f"{what} names {name!r}, which is not an argument of "
                                                        f"{op} ({', '.join(names)})")
        # data_dependent: true cuts every return to the count; a list of return positions cuts those
        # (the others keep their padded shape: _unique2's inverse indices have the input's shape).
        data_dependent = entry.get("data_dependent", False)
        cut_returns: list[int] = []
        if isinstance(data_dependent, list):
            return_count = len(func.func.returns)
            if not data_dependent or not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < return_count
                                             for r in data_dependent):
                raise SpecError(display_path, line, f"data_dependent lists positions of {op}'s returns "
                                                    f"(0 to {return_count - 1})")
            cut_returns, data_dependent = sorted(set(data_dependent)), True
        if not isinstance(data_dependent, bool):
            raise SpecError(display_path, line, "data_dependent is true, false or a list of return positions")
        if data_dependent and (compute == "output" or entry.get("variants") != []):
            raise SpecError(display_path, line, "a data_dependent spec has no Meta output dtype and no variants: "
                                                "use compute common/common_float and variants: []")
        divisor = entry.get("divisor")
        if divisor is not None and (divisor not in names or
                                    str(schema_args[names.index(divisor)].type) not in ("Tensor", "Scalar")):
            raise SpecError(display_path, line, f"divisor names {divisor!r}, which is not a Tensor or Scalar argument "
                                                f"of {op}")
        index_check = _index_check(entry.get("index_check"), schema_args, display_path, line)
        group = groups.get(op)
        variants = entry.get("variants", [v for v in VARIANTS if group is not None and getattr(group, v, None)])
        for v in variants:
            if v not in VARIANTS:
                raise SpecError(display_path, line, f"unknown variant {v!r}; known: {', '.join(VARIANTS)}")
        for name in runtime:
            if str(schema_args[names.index(name)].type) != "float":
                raise SpecError(display_path, line, f"runtime names {name!r}, which is not a float argument")
        for name in writes:
            if str(schema_args[names.index(name)].type).rstrip("?") != "Tensor":
                raise SpecError(display_path, line, f"writes names {name!r}, which is not a Tensor argument")
        lists = [i for i, a in enumerate(schema_args) if str(a.type).rstrip("?") in ("Tensor[]", "Scalar[]")]
        if foreach and not lists:
            raise SpecError(display_path, line, f"foreach: {op} has no list argument")
        targets = [("Functional", func)]
        for v in variants:
            f = getattr(group, v, None) if group else None
            if f is None:
                raise SpecError(display_path, line, f"{op} has no {v} variant in ATen; drop it from variants")
            targets.append((VARIANTS[v], f))

        overloads = []
        for variant, f in targets:
            fargs = list(f.func.schema_order_arguments())
            arguments = [_classify(a, set(promote), set(compile_time), set(runtime)) for a in fargs]
            for a in arguments:
                if a.kind == "Unsupported":
                    raise SpecError(display_path, line, f"argument {a.name!r} of {f.func.name} has type {a.type}, "
                                                        f"which specs cannot take yet")
            written, returns = _written_and_returns(f, fargs, writes)
            outs = [i for i, a in enumerate(fargs) if a in f.func.arguments.out]
            promoted = [i for i, a in enumerate(arguments) if a.name in promote and i not in outs]
            compiler_args = arguments + ([Argument("generator", "Generator", "Generator", "value")] if generator else [])
            compiler = _LoweringCompiler(display_path, line, compiler_args, builder_primitives(repo_root), foreach,
                                         list_primitives(repo_root))
            expression = compiler.compile(str(entry["lowering"]))
            if foreach in (True, "elementwise"):
                list_args = [i for i, a in enumerate(arguments) if a.kind in ("TensorList", "ScalarList")]
                elementwise = "true" if foreach == "elementwise" else "false"
                expression = (f"foreach_results(b, a, {{{', '.join(map(str, list_args))}}}, {elementwise}, "
                              f"[&b](const EmitArgs& a) -> std::vector<Value> {{ return {expression}; }})")
            divisor_index = next((i for i, a in enumerate(fargs) if a.name == divisor), -1) if divisor else -1
            overloads.append(Overload(str(f.func.name), variant, arguments, promoted, written, returns, bool(foreach),
                                      bool(generator), expression, _cpp_name(str(f.func.name)), _meta_call(f),
                                      divisor_index, _index_check_initializer(index_check, fargs)))

        test = entry.get("test", {}) or {}
        if not isinstance(test, dict) or set(test) - TEST_KEYS:
            raise SpecError(display_path, line, f"test takes {', '.join(sorted(TEST_KEYS - {'__line__'}))}")
        if "tpu" in test:
            test["tpu"] = _platform_tolerances(test["tpu"], dtypes, display_path, test.get("__line__", line))
        if "random_when" in test and not str(test["random_when"]).isidentifier():
            raise SpecError(display_path, test.get("__line__", line),
                            f"test.random_when names a sample's keyword argument, not {test['random_when']!r}")
        if "dtypes" in test:
            test["dtypes"] = _expand_dtypes(test["dtypes"], display_path, line)
            test["sweep_dtypes"] = []  # the spec chose its dtypes
        else:
            test["dtypes"] = [d for d in dtypes if d in DEFAULT_TEST_DTYPES]
            test["sweep_dtypes"] = [d for d in dtypes if d not in DEFAULT_TEST_DTYPES]
        test.pop("__line__", None)
        specs.append(Spec(display_path, line, op, str(entry["lowering"]), COMPUTE[compute], dtypes, overloads, test,
                          data_dependent, cut_returns))
    return specs


def load_specs(spec_dir: str, repo_root: str) -> list[Spec]:
    specs: list[Spec] = []
    seen: dict[str, str] = {}
    for name in sorted(os.listdir(spec_dir)):
        if not name.endswith(".yaml"):
            continue
        path = os.path.join(spec_dir, name)
        display = os.path.relpath(path, repo_root)
        for spec in load_spec_file(path, display, repo_root):
            for o in spec.overloads:
                if o.name in seen:
                    raise SpecError(spec.path, spec.line, f"{o.name} is already specified at {seen[o.name]}")
                seen[o.name] = spec.source
            specs.append(spec)
    return specs
