"""Repository rule exposing <workspace>/.venv/bin/python as a py_runtime.

py_runtime.interpreter_path must be absolute, so resolve it at fetch time
from the workspace root; this keeps the build independent of clone location.
"""

def _venv_python_impl(rctx):
    root = rctx.path(Label("@//:WORKSPACE")).dirname
    python = root.get_child(".venv").get_child("bin").get_child("python")
    if not python.exists:
        fail("%s not found: create the venv first (python -m venv .venv && pip install ...)" % python)
    rctx.file("BUILD.bazel", """\
package(default_visibility = ["//visibility:public"])

py_runtime(
    name = "py3_runtime",
    interpreter_path = "{python}",
    python_version = "PY3",
    # The launcher stub must run under the same interpreter, not /usr/bin/python3.
    stub_shebang = "#!{python}",
)
""".format(python = python))

venv_python = repository_rule(
    implementation = _venv_python_impl,
    local = True,
)
