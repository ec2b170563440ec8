"""The coverage tool and the metrics report speak about the real registrations."""

import json

import pytest
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
    # unique_consecutive has no spec (its sizes depend on the data): the run must list it among the CPU fallbacks,
    # with its call count.
    workload.write_text("import torch\nx = torch.arange(4.0).to('tpu')\nfor _ in range(3):\n    x.unique_consecutive()\n")
    before = dict(torchtpu.debug.metrics()["cpu_fallbacks"])
    assert coverage.main(["--workload", str(workload)]) == 0
    fell_back = torchtpu.debug.fallbacks_since(before)
    out = capsys.readouterr().out
    assert f"ATen overloads with specs: {len(torchtpu._C.spec_overloads())} " in out
    assert "core ATen overloads covered: " in out
    assert fell_back, "the workload ran nothing on the CPU"
    for op, n in fell_back.items():
        assert f"  {op}: {n} calls" in out


def test_coverage_runs_a_workload_as_a_script(tmp_path, capsys):
    # the workload sees its own arguments and imports a module next to it, as `python x.py` would
    (tmp_path / "helper.py").write_text("import torch\ndef run(n):\n    torch.arange(4.0).to('tpu').unique_consecutive()\n    print('argv', n)\n")
    workload = tmp_path / "workload.py"
    workload.write_text("import sys\nimport helper\nhelper.run(sys.argv[1:])\n")
    assert coverage.main(["--workload", str(workload), "--", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "argv ['--steps', '2']" in out
    assert "ran on the CPU: 1" in out


def test_parity_sweeps_opinfos_on_tpu_and_groups_what_has_no_spec(capsys):
    # A handful of op_db entries, each in a worker process under TORCHTPU_FALLBACK=error: add runs
    # from specs both ways; unique_consecutive has no spec (its overload is named); dropout's random results
    # compare by dtype and shape; bitwise_not, which CPU does not run in float32, is swept in int64
    # (and has no gradients there); tensor_split's indices tensor stays on the CPU, as its sample keeps it.
    ops = "add,unique_consecutive,nn.functional.dropout,bitwise_not,tensor_split"
    assert coverage.main(["--parity", "--ops", ops]) == 0
    out = capsys.readouterr().out
    assert "op_db sweep on tpu: 5 OpInfos" in out
    assert "swept in another dtype (no float32 on CPU): 1  bitwise_not (int64)" in out
    assert "forward: 4 passing, 0 failing, 1 unsupported, 0 skipped" in out
    assert "backward: 3 passing, 0 failing, 0 unsupported, 0 skipped (of 3 with autograd)" in out
    assert "  aten::unique_consecutive: 1  unique_consecutive" in out


def test_parity_sweep_in_slices_written_as_lines(tmp_path, capsys):
    # A TPU run has minutes per call: a slice of the selection, each result appended as it finishes,
    # and the summary of every slice's lines together.
    from torchtpu.tools import opdb_sweep

    lines = tmp_path / "sweep.jsonl"
    for part in ("0:1", "1:"):
        assert coverage.main(["--parity", "--ops", "add,neg,abs", "--slice", part, "--jsonl", str(lines)]) == 0
    assert sum('"name"' in line for line in lines.read_text().splitlines()) == 3  # results; a TPU adds "started"
    capsys.readouterr()
    assert opdb_sweep.main(["--summarize", str(lines)]) == 0
    out = capsys.readouterr().out
    assert "op_db sweep on tpu: 3 OpInfos" in out and "forward: 3 passing" in out


@pytest.mark.parametrize("in_process", [False, True], ids=["workers", "in_process"])
def test_parity_sweep_resumes_past_a_crash_and_stops_at_its_time_limit(tmp_path, capsys, monkeypatch, in_process):
    # One command per device call: --seconds ends the run inside the call's limit, --resume goes on
    # from the file; an OpInfo that took the process down (a "started" line with no result) fails.
    # In process is how a TPU sweeps (one process at a time may hold it).
    import json

    import torchtpu.testing

    if in_process:
        monkeypatch.setattr(torchtpu.testing, "device_is_exclusive", lambda: True)

    lines = tmp_path / "sweep.jsonl"
    assert coverage.main(["--parity", "--ops", "add,neg,abs", "--jsonl", str(lines), "--seconds", "0"]) == 0
    assert "time limit: 3 of 3 OpInfos not swept" in capsys.readouterr().out
    lines.write_text(json.dumps({"started": "neg"}) + "\n")
    assert coverage.main(["--parity", "--ops", "add,neg,abs", "--jsonl", str(lines), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "op_db sweep on tpu: 3 OpInfos" in out and "forward: 2 passing, 1 failing" in out
    assert "neg (forward): the sweep's process died while it ran" in out
    swept = [json.loads(line).get("name") for line in lines.read_text().splitlines()]
    assert sorted(name for name in swept if name) == ["abs", "add"]  # neg was not run again


def test_sweep_classifies_errors():
    from torchtpu.tools import opdb_sweep

    no_spec = NotImplementedError("torchtpu: acosh.out has no spec, and TORCHTPU_FALLBACK=error forbids it")
    assert opdb_sweep._classify(no_spec) == opdb_sweep.Outcome("unsupported", "aten::acosh.out")
    no_dtype = NotImplementedError("torchtpu: aten::abs does not support dtype ComplexFloat on tpu (supported: ...)")
    assert opdb_sweep._classify(no_dtype) == opdb_sweep.Outcome("unsupported", "aten::abs (ComplexFloat)")
    wrong = AssertionError("sample 0: Tensor-likes are not close!\n\nMismatched elements: 1 / 4")
    assert opdb_sweep._classify(wrong) == opdb_sweep.Outcome("failing", "AssertionError: sample 0: Tensor-likes are not close!")


def test_accuracy_tool_prints_each_function_beside_cpu(tmp_path, capsys):
    import json

    from torchtpu.tools import accuracy

    path = tmp_path / "errors.json"
    assert accuracy.main(["--ops", "exp,sigmoid,matmul", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| exp | [-5, 5] |" in out and "| matmul (highest) |" in out
    rows = json.loads(path.read_text())
    for name in ("exp", "sigmoid"):
        assert rows[name]["accurate"] < 5e-7 and rows[name]["cpu"] < 5e-7, rows[name]
    assert rows["matmul (highest)"]["accurate"] < 1e-6, rows
    assert torch.tpu.get_math_mode() == "accurate"  # the tool puts the mode back


def test_pytest_resume_splits_a_suite_over_runs(tmp_path):
    """`-p torchtpu.tools.pytest_resume`: a run starts no test after --seconds, the next goes on from the
    log, a test that ran out of --test-seconds ends the process and counts as failed (not run again)."""
    import subprocess
    import sys

    from conftest import skip_if_device_is_exclusive

    skip_if_device_is_exclusive()  # the child imports torchtpu, which opens the device
    (tmp_path / "test_three.py").write_text(
        "import time\n"
        "def test_a():\n    time.sleep(0.3)\n"
        "def test_b():\n    time.sleep(30)\n"
        "def test_c():\n    assert 1 == 2\n")
    log = tmp_path / "log.jsonl"

    def run(*extra):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                               "torchtpu.tools.pytest_resume", "--resume-log", str(log), *extra, "test_three.py"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)

    first = run("--seconds", "0")
    assert "1 passed" in first.stdout and "2 tests left for the next run" in first.stdout, first.stdout
    second = run("--test-seconds", "2")
    assert second.returncode != 0
    assert "test_three.py::test_b" in (tmp_path / "log.jsonl.stacks").read_text()
    third = run()
    assert "whole log: 2 failed, 1 passed; 0 left" in third.stdout, third.stdout
    assert "CRASHED test_three.py::test_b" in third.stdout and "FAILED test_three.py::test_c" in third.stdout
    outcomes = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["nodeid"].split("::")[1] for r in outcomes if r["outcome"] != "started"] == ["test_a", "test_c"]
    assert "assert 1 == 2" in outcomes[-1]["message"]


def test_pytest_resume_as_a_program_goes_on_after_a_test_that_ended_its_process(tmp_path):
    """`python torchtpu/tools/pytest_resume.py`: one command runs the whole selection even when a test runs
    out of --test-seconds (the process it ends is followed by another that skips what the log holds)."""
    import subprocess
    import sys

    import torchtpu.tools.pytest_resume as program

    from conftest import skip_if_device_is_exclusive

    skip_if_device_is_exclusive()
    (tmp_path / "test_three.py").write_text(
        "import time\n"
        "def test_a():\n    pass\n"
        "def test_b():\n    time.sleep(30)\n"
        "def test_c():\n    pass\n")
    log = tmp_path / "log.jsonl"
    done = subprocess.run([sys.executable, program.__file__, "--resume-log", str(log),
                           "--seconds", "100", "--test-seconds", "2", "--", "-q", "-p", "no:cacheprovider",
                           "test_three.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "a test ended the process" in done.stdout
    assert "whole log: 1 failed, 2 passed; 0 left" in done.stdout, done.stdout


def test_sample_times_names_each_step_with_its_compiles(tmp_path, capsys):
    from torchtpu.tools import sample_times

    log = tmp_path / "times.txt"
    assert sample_times.main(["nn.functional.relu:float32", "--log", str(log)]) == 0
    lines = log.read_text().splitlines()
    assert lines == capsys.readouterr().out.splitlines()
    assert lines[0].startswith("nn.functional.relu float32 sample 0: input ")
    steps = [line.strip() for line in lines if ": " in line and " s, " in line]
    assert any(s.startswith("forward: ") for s in steps) and any(s.startswith("backward: ") for s in steps)
    assert all(s.endswith(" s)") and " compiles (" in s for s in steps), steps
