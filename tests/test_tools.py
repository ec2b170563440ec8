"""The coverage tool and the metrics report speak about the real registrations."""

import torch

import torchtpu
from torchtpu.tools import coverage


def test_spec_overloads_are_registered_kernels():
    specs = torchtpu._C.spec_overloads()
    assert any(name == "add.Tensor" and variant == "functional" for name, variant, _ in specs)
    for name, _, source in specs:
        assert source.startswith("specs/") and ":" in source
        schema_name, _, overload = name.partition(".")
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "PrivateUse1"), name


def test_coverage_counts_specs_and_workload_fallbacks(tmp_path, capsys):
    workload = tmp_path / "workload.py"
    # cummax has no spec: the run must list it among the CPU fallbacks, with its call count.
    workload.write_text("import torch\nx = torch.arange(4.0).to('tpu')\nfor _ in range(3):\n    x.cummax(0)\n")
    before = dict(torchtpu.debug.metrics()["cpu_fallbacks"])
    assert coverage.main(["--workload", str(workload)]) == 0
    after = torchtpu.debug.metrics()["cpu_fallbacks"]
    out = capsys.readouterr().out
    assert f"ATen overloads with specs: {len(torchtpu._C.spec_overloads())} " in out
    assert "core ATen overloads covered: " in out
    fell_back = {op: n - before.get(op, 0) for op, n in after.items() if n > before.get(op, 0)}
    assert fell_back, "the workload ran nothing on the CPU"
    for op, n in fell_back.items():
        assert f"  {op}: {n} calls" in out


def test_coverage_runs_a_workload_as_a_script(tmp_path, capsys):
    # the workload sees its own arguments and imports a module next to it, as `python x.py` would
    (tmp_path / "helper.py").write_text("import torch\ndef run(n):\n    torch.arange(4.0).to('tpu').cummax(0)\n    print('argv', n)\n")
    workload = tmp_path / "workload.py"
    workload.write_text("import sys\nimport helper\nhelper.run(sys.argv[1:])\n")
    assert coverage.main(["--workload", str(workload), "--", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "argv ['--steps', '2']" in out
    assert "ran on the CPU: 1" in out
