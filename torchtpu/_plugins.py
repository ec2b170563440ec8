"""Finding the PJRT plugin and the compile cache directory (TORCHTPU_PJRT_PLUGIN, TORCHTPU_CACHE_DIR), and
what depends on the platform it serves."""

from __future__ import annotations

import glob
import importlib.util
import os

PLUGIN_ENV = "TORCHTPU_PJRT_PLUGIN"
CACHE_ENV = "TORCHTPU_CACHE_DIR"

# Python packages that ship a PJRT plugin, by the short name users pass in TORCHTPU_PJRT_PLUGIN.
PACKAGES = {
    "tpu": [("libtpu", "libtpu.so")],
    "cuda": [("xla_plugins.xla_cuda12_pjrt", "*.so"), ("xla_plugins.xla_cuda13_pjrt", "*.so"),
             ("jax_plugins.xla_cuda12", "*.so"), ("jax_plugins.xla_cuda13", "*.so")],
    "cpu": [("xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so")],
}


class PluginNotFound(RuntimeError):
    pass


def default_eager_mode(platform: str) -> str:
    """Fused eager mode on a TPU, where launching one op costs more than most ops' work (README,
    "Fused eager mode"); strict elsewhere. TORCHTPU_EAGER_MODE overrides it."""
    return "fused" if platform == "tpu" else "strict"


def _package_dir(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def find_packaged(kind: str) -> tuple[str | None, list[str]]:
    """The plugin file for `kind`, and every place looked at (for the error message)."""
    tried = []
    for module, pattern in PACKAGES[kind]:
        directory = _package_dir(module)
        if directory is None:
            tried.append(f"python package {module} (not installed)")
            continue
        matches = sorted(glob.glob(os.path.join(directory, pattern)))
        if matches:
            return matches[0], tried
        tried.append(os.path.join(directory, pattern))
    return None, tried


def _tpu_hardware_present() -> bool:
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def resolve_plugin() -> str:
    """The path of the PJRT plugin to load. Default: the TPU plugin if a TPU is present, else CPU.
    `none` loads no plugin (torchtpu imports, is_available() is False): for a process that must leave
    the device to its children, since one process at a time may hold a TPU."""
    choice = os.environ.get(PLUGIN_ENV, "").strip()
    if choice == "none":
        raise PluginNotFound(f"torchtpu: {PLUGIN_ENV}=none: no PJRT plugin loaded in this process")
    if choice and (os.sep in choice or choice.endswith(".so")):
        if not os.path.exists(choice):
            raise PluginNotFound(f"torchtpu: {PLUGIN_ENV}={choice!r} does not exist")
        return choice
    if choice and choice not in PACKAGES:
        raise PluginNotFound(f"torchtpu: {PLUGIN_ENV}={choice!r} is not one of {', '.join(PACKAGES)} "
                             f"a path to a PJRT plugin .so, or none")
    kinds = [choice] if choice else (["tpu", "cpu"] if _tpu_hardware_present() else ["cpu"])
    tried_all = []
    for kind in kinds:
        path, tried = find_packaged(kind)
        if path:
            return path
        tried_all += tried
    raise PluginNotFound(f"torchtpu: no PJRT plugin found (tried {'; '.join(tried_all)}). Install one "
                         f"(pip install xla-cpu-pjrt for the CPU) or set {PLUGIN_ENV}=cpu|tpu|cuda|<path>.")


def cache_dir() -> str:
    """The persistent compile cache directory; "" when disabled with TORCHTPU_CACHE_DIR=0."""
    value = os.environ.get(CACHE_ENV)
    if value == "0":
        return ""
    if value:
        return os.path.abspath(value)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torchtpu", "compile")
