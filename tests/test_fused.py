"""Fused eager mode: ops are recorded and run as one module when a value is needed, with the
results, random streams and errors of strict mode."""

from __future__ import annotations

import pytest
import torch

import torchtpu
from conftest import TPU, eager_mode, run_python


def fused_metrics() -> dict:
    return torchtpu.debug.metrics()["fused"]


def in_both_modes(fn):
    """fn() in strict mode, then in fused mode (its results on the CPU, read inside the mode)."""
    with eager_mode("strict"):
        strict = fn()
    with eager_mode("fused"):
        fused = fn()
    return strict, fused


def assert_same(strict, fused):
    if isinstance(strict, torch.Tensor):
        assert strict.dtype == fused.dtype and strict.shape == fused.shape
        assert torch.equal(strict, fused), (strict - fused).abs().max()
        return
    assert len(strict) == len(fused)
    for s, f in zip(strict, fused):
        assert_same(s, f)


def test_a_block_runs_once_when_a_value_is_read():
    x = torch.randn(32, 32)
    with eager_mode("fused"):
        assert torch.tpu.get_eager_mode() == "fused"
        assert "eager mode:          fused" in torchtpu.debug.metrics_report()
        before, executions = fused_metrics(), torchtpu.debug.metrics()["executions"]
        t = x.to(TPU)
        y = ((t @ t).relu() * 2 + 1).sum(0)
        assert fused_metrics()["blocks_run"] == before["blocks_run"]  # recorded, nothing ran
        result = y.cpu()  # the host read runs the block: one execution for five ops
        after = fused_metrics()
    assert after["blocks_run"] == before["blocks_run"] + 1
    assert after["ops_recorded"] >= before["ops_recorded"] + 5
    assert torchtpu.debug.metrics()["executions"] == executions + 1
    assert after["flush_reasons"].get("a host read", 0) > before["flush_reasons"].get("a host read", 0)
    torch.testing.assert_close(result, ((x @ x).relu() * 2 + 1).sum(0))


def test_results_equal_strict_mode_through_views_and_in_place_writes():
    base = torch.randn(6, 8)

    def program():
        x = base.to(TPU)
        v = x[1:4, ::2]
        v.mul_(3)  # a write through a strided view
        x.t()[2].add_(1)  # and through a transposed one
        y = x.view(4, 12).sum(1, keepdim=True)
        z = torch.cat([x.flatten()[:5], y.flatten()])
        x.unsqueeze_(0)  # metadata changes in place after the writes were recorded
        w = x.expand(2, 6, 8).contiguous() - 1
        return [t.cpu() for t in (x, v, y, z, w)]

    strict, fused = in_both_modes(program)
    assert_same(strict, fused)


def test_scalars_change_without_recompiling_the_block():
    t = torch.arange(8.0, device=TPU)
    torch.tpu.synchronize()  # t is a buffer before the blocks that read it
    with eager_mode("fused"):
        (t * 0.5 + 2).cpu()  # compiles the block once
        compiled = fused_metrics()["blocks_compiled"]
        outs = [(t * s + s * 2).cpu() for s in (0.25, 3.0, -1.5)]
        assert fused_metrics()["blocks_compiled"] == compiled  # scalars are parameters, as in eager
    for s, out in zip((0.25, 3.0, -1.5), outs):
        assert torch.equal(out, torch.arange(8.0) * s + s * 2)


def test_random_streams_match_strict_mode():
    def program():
        torch.tpu.manual_seed(123)
        a = torch.rand(100, device=TPU)
        b = torch.nn.functional.dropout(torch.ones(64, device=TPU), 0.5, training=True)
        g = torch.Generator(device=TPU)
        g.manual_seed(7)
        c = torch.randn(10, device=TPU, generator=g)
        d = torch.randint(0, 100, (20,), device=TPU)
        state = torch.tpu.get_rng_state()
        return [a.cpu(), b.cpu(), c.cpu(), d.cpu(), state]

    strict, fused = in_both_modes(program)
    assert_same(strict, fused)


def test_errors_raise_at_the_call_and_the_block_goes_on():
    with eager_mode("fused"):
        a = torch.ones(3, 4, device=TPU)
        b = a * 2
        with pytest.raises(RuntimeError, match=r"size of tensor a \(4\) must match the size of tensor b \(5\)"):
            b + torch.ones(5, device=TPU)
        with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
            b @ torch.ones(5, 2, device=TPU)
        assert torch.equal((b + 1).cpu(), torch.full((3, 4), 3.0))


def test_host_reads_fallbacks_and_data_dependent_ops_run_the_block_first():
    def program():
        x = torch.arange(-6.0, 6.0, device=TPU).reshape(3, 4)
        y = x * 2
        kept = y[y > 0]  # a data-dependent shape
        z = torch._VF._add_relu(y, x)  # no spec: the CPU fallback reads y and x
        flag = bool((z > 10).any())  # a host read inside the program
        total = (kept.sum() + z.sum()).item()
        return [kept.cpu(), z.cpu(), torch.tensor([flag, total])]

    strict, fused = in_both_modes(program)
    assert_same(strict, fused)
    reasons = fused_metrics()["flush_reasons"]
    assert any("has no spec" in reason for reason in reasons), reasons


def test_intermediates_get_no_device_buffer():
    x = torch.randn(256, 256, device=TPU)
    torch.tpu.synchronize()
    with eager_mode("fused"):
        peak_before = torchtpu.debug.metrics()["live_bytes"]
        y = x
        for _ in range(10):
            y = (y * 1.01).tanh()  # twenty intermediates of 256 KiB that die inside the block
        torch.tpu.synchronize()
        held = torchtpu.debug.metrics()["live_bytes"] - peak_before
    assert held <= 256 * 256 * 4 + 64  # only y, the one result still alive, got a buffer (and a scalar)
    expected = x.cpu()
    for _ in range(10):
        expected = (expected * 1.01).tanh()
    torch.testing.assert_close(y.cpu(), expected)


def test_a_storage_python_saw_gets_a_buffer_only_while_python_holds_it():
    # x.untyped_storage() makes a Python wrapper that PyTorch keeps alive (holding the storage) for as
    # long as C++ holds the storage; dynamo's tracing calls it on a compiled function's inputs, so
    # torch.compile's first call wrote back every gradient that died inside the block.
    x = torch.randn(256, 256, device=TPU)
    torch.tpu.synchronize()
    with eager_mode("fused"):
        torch.tpu.reset_peak_memory_stats()
        before = torch.tpu.memory_allocated()
        dead = [x * k for k in range(4)]
        for t in dead:
            t.untyped_storage()
        del dead, t
        held = (x * 5).untyped_storage()
        torch.tpu.synchronize()
        assert torch.tpu.max_memory_allocated() - before <= 256 * 256 * 4 + 64  # only the held one
    assert torch.equal(torch.empty(0, device=TPU).set_(held).view(256, 256).cpu(), x.cpu() * 5)


def test_out_of_memory_raises_when_the_block_runs_and_the_process_goes_on():
    held = torch.ones(1024, device=TPU)
    torch.tpu.synchronize()  # what a failed block was to compute is lost: held is not part of it
    with eager_mode("fused"):
        huge = torch.zeros(1 << 48, dtype=torch.uint8, device=TPU)
        huge.add_(1)  # recorded: the allocation is the block's
        with pytest.raises(torch.OutOfMemoryError, match="TPU out of memory on tpu:0"):
            torch.tpu.synchronize()
        del huge
        assert torch.equal((held + 1).cpu(), torch.full((1024,), 2.0))


def test_mixed_devices_raise_pytorchs_error():
    with eager_mode("fused"):
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            torch.ones(3, device=TPU) + torch.ones(3)


def test_a_size_bound_splits_long_blocks():
    torchtpu._C._set_fused_max_ops(4)
    try:
        with eager_mode("fused"):
            before = fused_metrics()
            t = torch.ones(4).to(TPU).neg()  # the upload is written at once: the block begins at neg
            for _ in range(13):
                t = t + 1
            runs = fused_metrics()["blocks_run"] - before["blocks_run"]
            # neg and five adds (its first op never comes again: cut at one and a half bounds), then
            # four adds (cut where the block's first op, an add, comes again past the bound)
            assert runs == 2
            assert torch.equal(t.cpu(), torch.full((4,), 12.0))
    finally:
        torchtpu._C._set_fused_max_ops(10000)


def test_a_training_loop_with_no_optimizer_step_repeats_its_blocks():
    # A hand-written update ends no block, and the loop reads nothing: cut at the bound exactly, its
    # blocks would start at every offset of its steps and each compile; past the bound a block ends
    # where its first op comes again, so the blocks are whole steps and repeat.
    def train(mode: str, device: str) -> torch.Tensor:
        w = torch.linspace(-1, 1, 8, device=device).requires_grad_()
        x = torch.linspace(0, 2, 8, device=device)
        with eager_mode(mode):
            for _ in range(30):
                loss = ((x * w).sin() * 3 + w).square().sum()
                loss.backward()
                with torch.no_grad():
                    w -= 0.01 * w.grad
                w.grad = None
            return w.detach().cpu()

    torchtpu._C._set_fused_max_ops(40)
    try:
        strict = train("strict", TPU)
        before = fused_metrics()
        fused = train("fused", TPU)
        after = fused_metrics()
    finally:
        torchtpu._C._set_fused_max_ops(10000)
    runs = after["blocks_run"] - before["blocks_run"]
    compiled = after["blocks_compiled"] - before["blocks_compiled"]
    assert compiled <= 3 < runs, (compiled, runs)  # the first block, the steady one, the tail
    torch.testing.assert_close(fused, strict)
    torch.testing.assert_close(fused, train("strict", "cpu"))


def test_an_inference_loop_that_reads_nothing_replays_one_block():
    # Cut at the size bound, the blocks of a 3-op loop would start at every offset of its period and
    # each compile; an inference block ends before its first op comes again (past a quarter of the bound).
    torchtpu._C._set_fused_max_ops(40)
    try:
        def loop():
            x, outs = torch.ones(8, device=TPU), []
            with torch.no_grad():
                for _ in range(60):
                    x = (x * 1.01 + 0.5).sin()
                    outs.append(x)
            return torch.stack(outs).cpu()
        with eager_mode("strict"):
            strict = loop()
        with eager_mode("fused"):
            before = fused_metrics()
            fused = loop()
            after = fused_metrics()
        assert torch.equal(strict, fused)
        runs = after["blocks_run"] - before["blocks_run"]
        assert after["flush_reasons"].get("a repeat of the block's first op", 0) >= 10
        assert after["blocks_compiled"] - before["blocks_compiled"] <= 3 < runs  # the loop's block, the tail, the stack
    finally:
        torchtpu._C._set_fused_max_ops(10000)


def test_a_training_block_is_never_cut_where_its_first_op_repeats():
    torchtpu._C._set_fused_max_ops(40)
    try:
        with eager_mode("fused"):
            before = fused_metrics()["flush_reasons"].get("a repeat of the block's first op", 0)
            w = torch.ones(8, device=TPU, requires_grad=True)
            x = w
            for _ in range(20):
                x = (x * 1.01 + 0.5).sin()
            x.sum().backward()
            torch.tpu.synchronize()
            assert fused_metrics()["flush_reasons"].get("a repeat of the block's first op", 0) == before
        expected = torch.ones(8, requires_grad=True)
        y = expected
        for _ in range(20):
            y = (y * 1.01 + 0.5).sin()
        y.sum().backward()
        torch.testing.assert_close(w.grad.cpu(), expected.grad)
    finally:
        torchtpu._C._set_fused_max_ops(10000)


def train(mode: str, steps: int = 4):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)).to(TPU)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(steps)]
    torch.tpu.manual_seed(0)
    losses, compiled = [], []
    with eager_mode(mode):
        for x, y in data:
            loss = torch.nn.functional.cross_entropy(model(x.to(TPU)), y.to(TPU))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            compiled.append(fused_metrics()["blocks_compiled"])
        params = [p.detach().cpu() for p in model.parameters()]
    return losses, params, compiled


def test_training_matches_strict_mode_and_iterations_reuse_their_module():
    strict_losses, strict_params, _ = train("strict")
    losses, params, compiled = train("fused")
    # XLA fuses a block's elementwise ops and reductions into other kernels than one op's module
    # makes: float32 results may differ in the last bit (seen: one ulp of the third loss).
    torch.testing.assert_close(losses, strict_losses, rtol=1e-6, atol=0)
    torch.testing.assert_close(params, strict_params, rtol=1e-5, atol=1e-6)
    # The first two steps compile (the first has no optimizer state yet); later ones reuse them.
    assert compiled[2:] == [compiled[1]] * (len(compiled) - 2)


def compiled_train(mode: str, steps: int = 5):
    """A train step whose forward, backward and AdamW step are torch.compile graphs, in `mode`."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 4)).to(TPU)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    forward = torch.compile(model, backend="tpu")
    opt_step = torch.compile(opt.step, backend="tpu")
    data = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(steps)]
    losses, per_step = [], []
    with eager_mode(mode):
        for x, y in data:
            before = fused_metrics()
            loss = torch.nn.functional.cross_entropy(forward(x.to(TPU)), y.to(TPU))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt_step()
            losses.append(loss.item())
            after = fused_metrics()
            per_step.append({k: after[k] - before[k] for k in ("graphs_recorded", "blocks_run", "blocks_compiled")})
        params = [p.detach().cpu() for p in model.parameters()]
    torch._dynamo.reset()
    return losses, params, per_step


def test_compiled_graphs_join_the_block_so_a_compiled_train_step_runs_as_one_module():
    # In fused mode a torch.compile graph's call is a call in the pending block (XLA inlines it): the
    # forward, backward and optimizer graphs and the eager loss between them run as one module a step.
    strict_losses, strict_params, _ = compiled_train("strict")
    losses, params, per_step = compiled_train("fused")
    torch.testing.assert_close(losses, strict_losses, rtol=1e-6, atol=0)
    torch.testing.assert_close(params, strict_params, rtol=1e-5, atol=1e-6)
    # Capturing a graph does not end the block. The first step's block (no optimizer state yet) and the
    # second's (the optimizer's graph captured again) compile; from the third on each step runs the second's.
    assert all(counts["blocks_run"] == 1 and counts["graphs_recorded"] == 3 for counts in per_step), per_step
    assert [counts["blocks_compiled"] for counts in per_step] == [1, 1, 0, 0, 0], per_step


def test_an_optimizer_step_ends_the_block_at_the_next_op_so_dropped_gradients_are_never_written():
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256).to(TPU)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(4, 256).to(TPU)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with eager_mode("fused"):
        for _ in range(3):
            torch.tpu.synchronize()
            torch.tpu.reset_peak_memory_stats()
            steps_before = fused_metrics()["flush_reasons"].get("an optimizer step", 0)
            model(x).square().mean().backward()
            opt.step()
            assert fused_metrics()["flush_reasons"].get("an optimizer step", 0) == steps_before  # not yet
            opt.zero_grad(set_to_none=True)
            (x * 2).sum()  # the next op runs the step's block first
            assert fused_metrics()["flush_reasons"]["an optimizer step"] == steps_before + 1
            torch.tpu.synchronize()
            # parameters and AdamW's two moments (and a few small tensors); the gradients never had buffers
            assert torch.tpu.max_memory_allocated() < 3.5 * param_bytes


def test_a_training_loop_replays_its_blocks_without_emitting_them_again():
    # From the third step on (the first has no optimizer state, the second makes the tape) every op is
    # replayed from the tape, and every block runs the executable the tape kept for it.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(32, 4)).to(TPU)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    per_step = []
    with eager_mode("fused"):
        for step in range(5):
            before = fused_metrics()
            x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
            loss = torch.nn.functional.cross_entropy(model(x.to(TPU)), y.to(TPU))
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
            after = fused_metrics()
            per_step.append({k: after[k] - before[k] for k in ("ops_recorded", "ops_replayed", "blocks_run",
                                                                "blocks_reused", "blocks_compiled")})
    for counts in per_step[2:]:
        assert counts["ops_replayed"] == counts["ops_recorded"] > 0, per_step
        assert counts["blocks_reused"] == counts["blocks_run"] > 0 and counts["blocks_compiled"] == 0, per_step
    assert per_step[0]["ops_replayed"] < per_step[0]["ops_recorded"]
    assert fused_metrics()["tape_nodes"] > 0


def test_a_block_that_leaves_the_tape_or_keeps_other_results_is_right():
    x = torch.randn(16)
    t = x.to(TPU)
    torch.tpu.synchronize()
    outs, kept = [], None
    with eager_mode("fused"):
        for i in range(4):
            before = fused_metrics()["ops_replayed"]
            y = t * 2
            z = (y + 1).relu()
            if i == 2:
                z = z - 3  # leaves the tape after a replayed prefix
            if i == 3:
                kept = y  # the same ops, but y outlives the block: another set of results
            outs.append(z.cpu())
            if i >= 2:
                assert fused_metrics()["ops_replayed"] >= before + 2
        kept_value = kept.cpu()
    expected = (x * 2 + 1).relu()
    assert torch.equal(outs[0], expected) and torch.equal(outs[1], expected) and torch.equal(outs[3], expected)
    assert torch.equal(outs[2], expected - 3)
    assert torch.equal(kept_value, x * 2)


def test_a_call_after_a_deferred_flush_is_not_replayed_as_a_never_written_read():
    # The op after an optimizer step is keyed before the step's block runs, when what it reads holds
    # no buffer yet: as a read of a never-written storage (zeros the module makes). Once that block
    # ran, it reads a buffer: the tape must not replay a zeros read for it (that redefined the
    # parameter's SSA name: a fused AdamW step under torch.compile failed to compile).
    with eager_mode("fused"):
        never_written = [(torch.empty(3, device=TPU) + 1).cpu() for _ in range(3)]  # on the tape
        after_step = []
        for _ in range(3):
            pending = torch.full((3,), 5.0, device=TPU)  # a value of the block, no buffer yet
            torchtpu._C._fused_flush_before_next_op("a test's step")
            after_step.append((pending + 1).cpu())
    assert all(torch.equal(v, torch.ones(3)) for v in never_written)
    assert all(torch.equal(v, torch.full((3,), 6.0)) for v in after_step)


def test_blocks_keep_within_the_executable_budget_and_the_tape_starts_again():
    # Each executable holds memory mappings of JIT code; past the process's budget the CPU plugin's JIT
    # fails and the next C++ throw crashes the process (seen: 300 _foreach parity tests in fused mode).
    # Fused blocks compile under the same budget as eager kernels: the caches (the tape too) are dropped.
    budget = 6
    before = torchtpu._C._set_max_live_executables(budget)
    try:
        live = []
        with eager_mode("fused"):
            for n in range(3, 3 + 3 * budget):  # a block per shape, each compiled
                x = torch.arange(float(n))
                assert torch.equal((x.to(TPU) * 2 + 1).cpu(), x * 2 + 1)
                live.append(torchtpu.debug.metrics()["live_executables"])
            reused = fused_metrics()["blocks_reused"]
            t = torch.ones(5, device=TPU)
            for _ in range(3):  # a loop still finds its block on the tape
                assert torch.equal((t * 3).cpu(), torch.full((5,), 3.0))
            assert fused_metrics()["blocks_reused"] >= reused + 1
        assert max(live) <= budget + 1, live
    finally:
        torchtpu._C._set_max_live_executables(before)


def test_random_streams_match_strict_mode_when_blocks_are_replayed():
    def program():
        torch.tpu.manual_seed(5)
        g = torch.Generator(device=TPU)
        g.manual_seed(9)
        ones = torch.ones(64, device=TPU)
        values = []
        for _ in range(3):  # the same block three times: the tape replays its draws
            a = torch.rand(50, device=TPU)
            b = torch.nn.functional.dropout(ones, 0.5, training=True) * 3
            c = torch.randn(10, device=TPU, generator=g)
            values += [a.cpu(), b.cpu(), c.cpu()]
        return values + [torch.tpu.get_rng_state()]

    strict, fused = in_both_modes(program)
    assert_same(strict, fused)


def test_fused_mode_from_the_environment_runs_the_block_at_exit():
    code = ("import torch, torchtpu\n"
            "print(torch.tpu.get_eager_mode())\n"
            "x = torch.ones(1000, device='tpu')\n"
            "y = (x + 1).sum()\n")  # never read: runs at exit
    proc = run_python(code, {"TORCHTPU_EAGER_MODE": "fused"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "fused"
    proc = run_python("import torch, torchtpu; print(torch.tpu.get_eager_mode())", {"TORCHTPU_EAGER_MODE": "lazy"})
    assert "TORCHTPU_EAGER_MODE must be 'strict', 'blocking' or 'fused', not 'lazy'" in proc.stdout + proc.stderr
