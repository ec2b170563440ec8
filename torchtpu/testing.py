"""Parity checks against PyTorch on CPU, used by the generated tests (generated/tests/)."""

from __future__ import annotations

import functools
import itertools
import socket

import torch

import torchtpu


# torch.testing.assert_close's defaults (rtol, atol) for half-precision dtypes.
LOW_PRECISION_TOLERANCES = {torch.bfloat16: (1.6e-2, 1e-5), torch.float16: (1e-3, 1e-5)}


def device_is_exclusive() -> bool:
    """Whether only one process at a time may open the device (a TPU: a second process fails on
    libtpu's lock file). Tests and tools that would start processes opening it run here instead, or
    are skipped."""
    return torchtpu.is_available() and torchtpu._C.platform_name() == "tpu"


def free_port() -> int:
    """A TCP port free on this machine now, for a torch.distributed rendezvous (MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def map_tensors(fn, value):
    """`value` with `fn` applied to every tensor inside (lists, tuples, dicts)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(fn, v) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(fn, v) for k, v in value.items()}
    return value


def _tensors(value) -> list:
    """Every tensor inside `value`, in order."""
    found = []
    map_tensors(found.append, value)
    return found


def to_device(value, device):
    """`value` with every tensor inside moved to `device`."""
    return map_tensors(lambda t: t.to(device), value)


def clone_tree(value):
    return map_tensors(torch.Tensor.clone, value)


def _leaf_to(value, device):
    """`value` with every tensor a fresh leaf on `device` that requires grad where the original does."""
    return map_tensors(lambda t: t.detach().to(device).requires_grad_(t.requires_grad), value)






@functools.lru_cache(maxsize=None)
def find_opinfo(name: str):
    from torch.testing._internal import common_methods_invocations as opinfos

    op_db = opinfos.op_db + [info for name in dir(opinfos) if name.startswith("foreach_") and name.endswith("_op_db")
                             for info in getattr(opinfos, name)]
    for info in op_db:
        if info.name == name and info.variant_test_name == "":
            return info
    for info in op_db:  # "div.no_rounding_mode": an OpInfo's name and variant
        if f"{info.name}.{info.variant_test_name}" == name:
            return info
    raise LookupError(f"no OpInfo named {name!r} in op_db")


def _opinfo_for_dtype(name: str, torch_dtype):
    """The OpInfo `name`, or where it lacks `torch_dtype` on CPU, a variant of the same op that has it
    (nn.functional.silu's complex dtypes live in its "complex" variant); None if no variant has it."""
    info = find_opinfo(name)
    if torch_dtype in info.supported_dtypes("cpu"):
        return info
    from torch.testing._internal import common_methods_invocations as opinfos

    return next((other for other in opinfos.op_db
                 if other.name == info.name and torch_dtype in other.supported_dtypes("cpu")), None)




def _fallbacks() -> dict:
    return dict(torchtpu.debug.metrics()["cpu_fallbacks"])


def _assert_no_fallback(name: str, overloads: list[str], before: dict) -> None:
    after = _fallbacks()
    fell_back = [op for op in overloads if after.get("aten::" + op, 0) > before.get("aten::" + op, 0)]
    assert not fell_back, f"{name}: {fell_back} ran on the CPU instead of their specs"


def _on_tpu(sample) -> tuple:
    """An OpInfo sample's input, args and kwargs on tpu; creation ops (arange, eye, ...) get device="tpu"."""
    tpu_input, tpu_args, tpu_kwargs = to_device((sample.input, sample.args, sample.kwargs), "tpu")
    if "device" in tpu_kwargs or not _tensors((sample.input, sample.args, sample.kwargs)):
        tpu_kwargs = {**tpu_kwargs, "device": "tpu"}
    return tpu_input, tpu_args, tpu_kwargs


def assert_same(actual, expected, atol=None, rtol=None, context=""):
    """tpu results equal CPU results: values, dtype, shape (and strides of fresh outputs)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{context}: expected a tensor, got {type(actual)}"
        assert actual.device.type == "tpu", f"{context}: result is on {actual.device}, not tpu"
        host = actual.cpu()
        assert host.dtype == expected.dtype, f"{context}: dtype {host.dtype} != {expected.dtype}"
        assert host.shape == expected.shape, f"{context}: shape {tuple(host.shape)} != {tuple(expected.shape)}"
        if atol is None:
            torch.testing.assert_close(host, expected, equal_nan=True, msg=lambda m: f"{context}: {m}")
        else:
            # A spec's tolerances are floors: half-precision results keep PyTorch's own, looser ones.
            default_rtol, default_atol = LOW_PRECISION_TOLERANCES.get(expected.dtype, (0.0, 0.0))
            torch.testing.assert_close(host, expected, atol=max(atol, default_atol), rtol=max(rtol, default_rtol),
                                       equal_nan=True, msg=lambda m: f"{context}: {m}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{context}: {len(actual)} results, expected {len(expected)}"
        for a, e in zip(actual, expected):
            assert_same(a, e, atol, rtol, context)
    else:
        assert actual == expected, f"{context}: {actual!r} != {expected!r}"






def _samples(info, torch_dtype, requires_grad, max_samples=None, random_when=None):
    """(index, sample) of the OpInfo's first max_samples samples, but those whose keyword argument
    `random_when` is nonzero: they draw random numbers (sdpa's dropout_p), so no two runs agree."""
    samples = itertools.islice(info.sample_inputs("cpu", torch_dtype, requires_grad=requires_grad), max_samples)
    return ((i, s) for i, s in enumerate(samples) if not (random_when and s.kwargs.get(random_when)))


def _check_gradients(info, name, torch_dtype, atol, rtol, max_samples=None, random_when=None):
    """Backward parity: for each sample, the gradients of its differentiable outputs (weighted by
    the same random cotangents on both devices) with respect to its inputs match CPU's."""
    cotangents = torch.Generator().manual_seed(0)
    for index, sample in _samples(info, torch_dtype, True, max_samples, random_when):
        context = f"{name} {torch_dtype} sample {index} (gradients): {sample}"
        weights = None

        def gradients(device):
            """The sample's gradients on `device`, or None where it has none to compare."""
            nonlocal weights
            inputs = _leaf_to((sample.input, sample.args, sample.kwargs), device)
            leaves = [t for t in _tensors(inputs) if t.requires_grad]
            outputs = [t for t in _tensors(info.op(inputs[0], *inputs[1], **inputs[2])) if t.requires_grad]
            if weights is None:
                weights = [torch.randn(o.shape, generator=cotangents, dtype=o.dtype) if o.is_floating_point()
                           else None for o in outputs]
            pairs = [(o, w.to(device)) for o, w in zip(outputs, weights) if w is not None]
            if not leaves or not pairs:
                return None
            return torch.autograd.grad([o for o, _ in pairs], leaves, [w for _, w in pairs], allow_unused=True)

        try:
            expected = gradients("cpu")
        except Exception:
            continue  # CPU itself rejects this sample (or its backward)
        if expected is None:
            continue
        for i, (actual, wanted) in enumerate(zip(gradients("tpu"), expected)):
            assert (actual is None) == (wanted is None), f"{context}: gradient {i} defined on one side only"
            if wanted is not None:
                assert_same(actual, wanted, atol, rtol, f"{context} gradient {i}")


def _empty_outs(result, device):
    """Empty out= tensors shaped like `result` (a tensor, or a tuple of them) on `device`, in the
    same structure, or None where the result has no out= form to compare (a list, a non-tensor)."""
    if isinstance(result, torch.Tensor):
        return torch.empty_like(result, device=device)
    if isinstance(result, tuple) and result and all(isinstance(r, torch.Tensor) for r in result):
        return tuple(torch.empty_like(r, device=device) for r in result)
    return None


def _tolerances_here(tpu, dtype: str, atol, rtol, grad_atol=None, grad_rtol=None) -> tuple:
    """(atol, rtol, grad_atol, grad_rtol) on this platform: a spec's `tpu` ones replace the others on a
    TPU, for the dtypes it names."""
    if tpu and dtype in tpu["dtypes"] and torchtpu._C.platform_name() == "tpu":
        return (tpu.get("atol", atol), tpu.get("rtol", rtol), tpu.get("grad_atol", grad_atol),
                tpu.get("grad_rtol", grad_rtol))
    return atol, rtol, grad_atol, grad_rtol


def check_opinfo(name: str, dtype: str, overloads: list[str], variants: list[str], atol=None, rtol=None,
                 grad_atol=None, grad_rtol=None, max_samples=None, tpu=None, random_when=None):
    """Runs every OpInfo sample of `name` on tpu and CPU, for each variant (Functional / Inplace /
    Out) the spec derives, and compares; in float32/float64 also the gradients. A sample CPU
    rejects is skipped; everything else must match, and none of `overloads` may fall back to the CPU.
    `tpu`: the spec's tolerances for a TPU ({"dtypes": [...], "grad_rtol": ...}), which replace the
    others there for those dtypes. `random_when`: samples with that keyword argument nonzero are left out."""
    atol, rtol, grad_atol, grad_rtol = _tolerances_here(tpu, dtype, atol, rtol, grad_atol, grad_rtol)
    torch_dtype = getattr(torch, dtype)
    info = _opinfo_for_dtype(name, torch_dtype)
    if info is None:
        import pytest

        pytest.skip(f"OpInfo {name} does not support {dtype} on CPU")
    before = _fallbacks()
    checked = 0
    touches_complex128 = False
    for index, sample in _samples(info, torch_dtype, False, max_samples, random_when):
        for variant in dict.fromkeys(variants):
            context = f"{name} {dtype} sample {index} ({variant}): {sample}"
            if variant == "Functional":
                fn = info.op
            elif variant == "Inplace":
                fn = info.inplace_variant
                if fn is None:
                    continue
            else:
                if not info.supports_out:
                    continue
                fn = info.op
            cpu_input, cpu_args, cpu_kwargs = clone_tree((sample.input, sample.args, sample.kwargs))
            try:
                expected = fn(cpu_input, *cpu_args, **cpu_kwargs)
                if variant == "Out":
                    out = _empty_outs(expected, "cpu")
                    if out is None:
                        continue
                    expected = fn(cpu_input, *cpu_args, **cpu_kwargs, out=out)
            except Exception:
                continue  # CPU itself rejects this sample
            tpu_input, tpu_args, tpu_kwargs = _on_tpu(sample)
            if variant == "Out":
                tpu_out = _empty_outs(expected, "tpu")
                actual = fn(tpu_input, *tpu_args, **tpu_kwargs, out=tpu_out)
                returned = actual if isinstance(tpu_out, tuple) else (actual,)
                given = tpu_out if isinstance(tpu_out, tuple) else (tpu_out,)
                assert len(returned) == len(given) and all(r is g for r, g in zip(returned, given)), \
                    f"{context}: out= did not return its out tensors"
            else:
                actual = fn(tpu_input, *tpu_args, **tpu_kwargs)
            if variant == "Inplace":
                if actual is None:  # _foreach_*_ return nothing: compare what they wrote
                    actual, expected = tpu_input, cpu_input
                else:
                    assert actual is tpu_input, f"{context}: the in-place variant did not return self"
            assert_same(actual, expected, atol, rtol, context)
            checked += 1
            touches_complex128 |= any(t.dtype == torch.complex128
                                      for t in _tensors((cpu_input, cpu_args, cpu_kwargs, expected)))
    assert checked > 0, f"{name} {dtype}: no sample ran"
    # Gradients in float32/float64: in half precision CPU rounds every backward intermediate, so
    # its gradients are no reference for a float32-accumulating lowering.
    if torch_dtype in (torch.float32, torch.float64) and info.supports_autograd:
        _check_gradients(info, name, torch_dtype, atol if grad_atol is None else grad_atol,
                         rtol if grad_rtol is None else grad_rtol, max_samples, random_when)
    if not (touches_complex128 and torchtpu._C.platform_name() == "tpu"):
        _assert_no_fallback(name, overloads, before)  # a TPU runs complex128 on the CPU (spec_plan.cc)


def check_compiled(name: str, overloads: list[str], atol=None, rtol=None, splits=False, tpu=None, random_when=None):
    """The first float32 OpInfo sample CPU accepts, forward, through torch.compile(backend="tpu")
    on tpu vs eager on CPU: graph mode emits the same spec lowering inside one captured module.
    None of `overloads` may fall back to the CPU, and unless `splits` (a data-dependent op, which
    runs eagerly between captured parts) the graph must not split."""
    import pytest

    from torchtpu import _compile

    info = find_opinfo(name)
    if torch.float32 not in info.supported_dtypes("cpu"):
        pytest.skip(f"OpInfo {name} does not support float32 on CPU")
    for _, sample in _samples(info, torch.float32, False, random_when=random_when):
        cpu_input, cpu_args, cpu_kwargs = clone_tree((sample.input, sample.args, sample.kwargs))
        try:
            expected = info.op(cpu_input, *cpu_args, **cpu_kwargs)
        except Exception:
            continue  # CPU itself rejects this sample
        break
    else:
        pytest.skip(f"{name}: CPU rejects every float32 sample")
    tpu_input, tpu_args, tpu_kwargs = _on_tpu(sample)
    torch._dynamo.reset()  # a fresh cache: every test compiles the same `run` code
    before_fallbacks, before_splits = _fallbacks(), dict(_compile.stats()["splits"])

    # A random OpInfo's op reseeds around the call (wrapper_set_seed, under no_dispatch: dynamo cannot
    # trace it); the sample compared draws nothing, so the function itself is compiled.
    op = functools.reduce(getattr, name.split("."), torch) if random_when else info.op

    @torch.compile(backend="tpu")
    def run(x, args, kwargs):
        return op(x, *args, **kwargs)

    actual = run(tpu_input, tpu_args, tpu_kwargs)
    context = f"{name} float32 sample 0 compiled: {sample}"
    atol, rtol, _, _ = _tolerances_here(tpu, "float32", atol, rtol)
    assert_same(actual, expected, atol, rtol, context)
    _assert_no_fallback(name, overloads, before_fallbacks)
    split = {op: n for op, n in _compile.stats()["splits"].items() if n > before_splits.get(op, 0)}
    assert splits or not split, f"{name}: the compiled graph split around {split}"
