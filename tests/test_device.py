"""torch.tpu device module, torch.accelerator, .tpu() helpers, printing and host conversion."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import torchtpu
from conftest import metrics


def test_runtime_started():
    assert torchtpu.init_error() is None
    assert torchtpu.is_available()
    assert torch.tpu.is_available()
    assert torch.tpu.is_initialized()


# The CPU plugin is started with 4 devices (the suite's multi-device cases); a TPU host has its chips.
FOUR_DEVICES = pytest.mark.skipif(torch.tpu.device_count() < 4,
                                  reason=f"needs 4 tpu devices; this host has {torch.tpu.device_count()}")


def test_device_count_and_current_device():
    if torchtpu._C.platform_name() == "cpu":
        assert torch.tpu.device_count() == 4
    else:
        assert torch.tpu.device_count() >= 1
    assert torch.tpu.current_device() == 0
    assert torch._C._get_privateuse1_backend_name() == "tpu"
    d = torch.device("tpu")
    assert d.type == "tpu"
    assert torch.device("tpu:1").index == 1


@FOUR_DEVICES
def test_set_device_and_context_manager():
    assert torch.tpu.current_device() == 0
    try:
        torch.tpu.set_device(1)
        assert torch.tpu.current_device() == 1
        torch.tpu.set_device("tpu:2")
        assert torch.tpu.current_device() == 2
        torch.tpu.set_device(torch.device("tpu", 0))
        assert torch.tpu.current_device() == 0
        with torch.tpu.device(3):
            assert torch.tpu.current_device() == 3
            with torch.tpu.device("tpu:1"):
                assert torch.tpu.current_device() == 1
            assert torch.tpu.current_device() == 3
        assert torch.tpu.current_device() == 0
        with pytest.raises(RuntimeError):
            torch.tpu.set_device(torch.tpu.device_count())
        with pytest.raises(ValueError):
            torch.tpu.set_device("cpu")
    finally:
        torch.tpu.set_device(0)
    assert torch.tpu.current_device() == 0


def test_synchronize():
    x = torch.ones(3, device="tpu")
    y = x + 1
    torch.tpu.synchronize()
    torch.tpu.synchronize(0)
    torch.tpu.synchronize("tpu:0")
    assert y.cpu().tolist() == [2.0, 2.0, 2.0]


def test_seeding_reproduces_device_streams():
    torch.tpu.manual_seed(1234)
    assert torch.tpu.initial_seed() == 1234
    a = torch.randn(5, device="tpu")
    torch.tpu.manual_seed_all(1234)
    assert torch.tpu.initial_seed() == 1234
    b = torch.randn(5, device="tpu")
    # Same seed, same numbers on the device.
    assert torch.equal(a.cpu(), b.cpu())
    torch.tpu.manual_seed(1235)
    c = torch.randn(5, device="tpu")
    assert not torch.equal(a.cpu(), c.cpu())


def test_device_name_and_properties():
    name = torch.tpu.get_device_name()
    assert isinstance(name, str) and name
    assert torch.tpu.get_device_name(0) == name
    props = torch.tpu.get_device_properties(0)
    assert isinstance(props.name, str) and props.name
    assert props.index == 0
    assert props.name in name
    last = torch.tpu.device_count() - 1
    assert torch.tpu.get_device_properties(f"tpu:{last}").index == last


def test_memory_functions_track_allocations():
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    assert isinstance(before, int) and before >= 0
    x = torch.zeros(1024, device="tpu") + 1  # materialize a 4 KiB buffer
    torch.tpu.synchronize()
    during = torch.tpu.memory_allocated()
    assert during >= before + 1024 * 4
    assert torch.tpu.max_memory_allocated() >= during
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"]
    assert stats["active.all.current"] >= 1
    m = metrics()
    assert m["live_bytes"] == torch.tpu.memory_allocated()
    del x
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() <= during - 1024 * 4


def test_accelerator_api():
    acc = torch.accelerator.current_accelerator()
    assert acc is not None
    assert acc.type == "tpu"
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == torch.tpu.device_count()
    x = torch.ones(4, device=acc) * 3
    torch.accelerator.synchronize()
    assert x.cpu().tolist() == [3.0] * 4


def test_accelerator_current_device_index():
    assert torch.accelerator.current_device_index() == torch.tpu.current_device()


def test_tensor_tpu_method():
    cpu = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    t = cpu.tpu()
    assert t.device == torch.device("tpu", 0)
    assert t.is_tpu
    assert not cpu.is_tpu
    assert torch.equal(t.cpu(), cpu)
    t1 = cpu.to("tpu:0")
    assert t1.device.type == "tpu"
    assert torch.equal(t1.cpu(), cpu)
    t2 = cpu.to(torch.device("tpu"))
    assert torch.equal(t2.cpu(), cpu)


def test_tensor_factory_on_tpu():
    z = torch.zeros(2, 3, device="tpu")
    o = torch.ones(2, 3, device="tpu", dtype=torch.int32)
    f = torch.full((2, 2), 7.5, device="tpu")
    assert z.device.type == "tpu" and o.device.type == "tpu" and f.device.type == "tpu"
    assert torch.equal(z.cpu(), torch.zeros(2, 3))
    assert torch.equal(o.cpu(), torch.ones(2, 3, dtype=torch.int32))
    assert torch.equal(f.cpu(), torch.full((2, 2), 7.5))


def test_module_tpu():
    torch.manual_seed(0)
    lin = nn.Linear(4, 3)
    ref = nn.Linear(4, 3)
    ref.load_state_dict(lin.state_dict())
    out_mod = lin.tpu()
    assert out_mod is lin
    for p in lin.parameters():
        assert p.device.type == "tpu"
        assert isinstance(p, nn.Parameter)
    for name, p in lin.named_parameters():
        assert torch.equal(p.detach().cpu(), dict(ref.named_parameters())[name].detach())
    x = torch.randn(2, 4)
    with torch.no_grad():
        y = lin(x.tpu())
        expected = ref(x)
    assert y.device.type == "tpu"
    torch.testing.assert_close(y.cpu(), expected)


def _strip_device(text: str) -> str:
    return text.replace(", device='tpu:0'", "")


@pytest.mark.parametrize("cpu", [
    torch.tensor([[1.5, -2.25, 3.0], [0.125, 1e-3, -7.0]]),
    torch.arange(12, dtype=torch.int64).reshape(3, 4),
    torch.tensor([True, False, True]),
    torch.tensor(3.25),
    torch.tensor([1.0, 2.5], dtype=torch.bfloat16),
    torch.linspace(-3, 3, 20, dtype=torch.float32),
], ids=["float", "int64", "bool", "scalar", "bf16", "linspace"])
def test_repr_matches_cpu(cpu):
    t = cpu.to("tpu")
    text = repr(t)
    assert "device='tpu:0'" in text
    assert _strip_device(text) == repr(cpu)
    assert _strip_device(str(t)) == str(cpu)


def test_print(capsys):
    cpu = torch.tensor([[0.5, 1.0], [2.0, -3.0]])
    print(cpu.to("tpu"))
    out = capsys.readouterr().out
    assert "device='tpu:0'" in out
    assert _strip_device(out).strip() == str(cpu).strip()


def test_tolist_and_item():
    cpu = torch.tensor([[1.5, 2.0], [-3.0, 4.25]])
    t = cpu.to("tpu")
    assert t.tolist() == cpu.tolist()
    assert t[1, 0].item() == cpu[1, 0].item()
    assert t.sum().item() == pytest.approx(cpu.sum().item())
    i = torch.tensor([3, -4, 5], dtype=torch.int64).to("tpu")
    assert i.tolist() == [3, -4, 5]
    assert i[1].item() == -4 and isinstance(i[1].item(), int)
    b = torch.tensor([True, False]).to("tpu")
    assert b.tolist() == [True, False]
    assert torch.tensor(2.5).to("tpu").item() == 2.5
    assert float(torch.tensor(2.5, device="tpu")) == 2.5
    assert int(torch.tensor(7, device="tpu")) == 7


def test_module_transfer_keeps_parameter_objects_and_ties():
    """As for cuda: .to("tpu") / .tpu() / .cpu() keep each Parameter (tied weights stay tied)."""
    embedding = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = embedding.weight
    model = torch.nn.ModuleDict({"embedding": embedding, "head": head})
    shared = embedding.weight
    for move in (lambda m: m.to("tpu"), lambda m: m.cpu(), lambda m: m.tpu(), lambda m: m.to(device="cpu")):
        move(model)
        assert model["embedding"].weight is shared and model["head"].weight is shared
    model.to("tpu")
    assert shared.device.type == "tpu" and list(model.parameters()) == [shared]


def test_pinned_memory_and_non_blocking_copies():
    # tpu's pinned-memory hooks: pin_memory() and pin_memory=True give host memory is_pinned() knows,
    # and a non_blocking copy to the CPU (which stages through it) gives the values.
    x = torch.randn(4, 5)
    pinned = x.pin_memory()
    assert pinned.is_pinned() and not x.is_pinned()
    assert torch.equal(pinned, x)
    assert torch.empty(3, pin_memory=True).is_pinned()
    on_tpu = pinned.to("tpu", non_blocking=True)
    back = on_tpu.to("cpu", non_blocking=True)
    torch.tpu.synchronize()
    assert torch.equal(back, x)
    assert torch.equal(on_tpu.to("cpu", torch.float64, non_blocking=True), x.double())


def test_equal_matches_cpu():
    a = torch.tensor([[1.0, 2.0], [3.0, float("nan")]])
    cases = [(a[:, 0], a[:, 0].clone()), (a[0], a[1]), (a, a), (a[0], a[0, :1]), (a[0], a[0].long()),
             (torch.empty(0), torch.empty(0))]
    for x, y in cases:
        assert torch.equal(x.to("tpu"), y.to("tpu")) == torch.equal(x, y), (x, y)
