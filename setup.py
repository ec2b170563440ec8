"""Builds torchtpu._C (runtime/ + generated/ops/). setuptools takes C++ extensions only from a
setup.py; everything else about the package lives in pyproject.toml."""

import glob
import os

from setuptools import setup

# Building must not load an installed (possibly stale) torchtpu through torch's backend autoload.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def pjrt_include_dir() -> str:
    # The PJRT C API header ships with OpenXLA's CPU plugin package; it is never copied into the tree.
    import xla_plugins.xla_cpu_pjrt as plugin

    path = os.path.join(os.path.dirname(plugin.__file__), "include")
    if not os.path.exists(os.path.join(path, "pjrt_c_api.h")):
        raise RuntimeError(f"pjrt_c_api.h not found in {path}: install xla-cpu-pjrt")
    return path


# runtime/pjrt (torch-free PJRT client and cache), runtime/hlo (the builder), runtime/aten (torch glue).
sources = sorted(f for part in ("pjrt", "hlo", "aten") for f in glob.glob(f"runtime/{part}/*.cc")) + sorted(glob.glob("generated/ops/*.cpp"))

setup(
    ext_modules=[
        CppExtension(
            name="torchtpu._C",
            sources=sources,
            include_dirs=[os.path.join(ROOT, "runtime"), pjrt_include_dir()],
            extra_compile_args=["-O2", "-std=c++17", "-Wno-unused-parameter"],
            libraries=["dl"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
