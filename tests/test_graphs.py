"""Whole-step graphs: torch.tpu.graph / TPUGraph (torch.cuda.graph's API) against PyTorch eager on CPU.

A block of eager tpu code (forward, loss.backward(), clipping, optimizer step) is captured once into
one module; each replay runs it as one executable on the storages the block read and wrote.
"""

from __future__ import annotations

import copy

import pytest
import torch

import torchtpu

metrics = torchtpu.debug.metrics


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                               torch.nn.Linear(16, 3))


def make_train_step(model, optimizer, x, y, clip: float | None = 1.0):
    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        return loss
    return step


def batches(n: int):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


@pytest.mark.parametrize("optimizer_kind", ["adamw-foreach", "adamw-single", "sgd-momentum"])
def test_a_captured_train_step_replays_like_eager_cpu(optimizer_kind):
    def optimizer_for(model, capturable):
        if optimizer_kind == "sgd-momentum":
            return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
        return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, capturable=capturable,
                                 foreach=optimizer_kind == "adamw-foreach")

    cpu_model = make_model()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    cpu_opt, tpu_opt = optimizer_for(cpu_model, False), optimizer_for(tpu_model, True)
    data = batches(6)
    static_x, static_y = data[0][0].to("tpu"), data[0][1].to("tpu")
    tpu_step = make_train_step(tpu_model, tpu_opt, static_x, static_y)

    def cpu_train(x, y):
        return make_train_step(cpu_model, cpu_opt, x, y)()
    # Two eager steps (the optimizer makes its state), then capture, then replays on new batches.
    for x, y in data[:2]:
        static_x.copy_(x), static_y.copy_(y)
        torch.testing.assert_close(tpu_step().cpu(), cpu_train(x, y), rtol=1e-4, atol=1e-5)
    graph = torch.tpu.TPUGraph()
    before = {k: v.cpu() for k, v in tpu_model.state_dict().items()}
    with torch.tpu.graph(graph):
        static_loss = tpu_step()
    for k, v in tpu_model.state_dict().items():  # capturing runs nothing
        torch.testing.assert_close(v.cpu(), before[k], rtol=0, atol=0)
    for x, y in data[2:]:
        static_x.copy_(x), static_y.copy_(y)
        torch.tpu.synchronize()
        executions = metrics()["executions"]
        graph.replay()
        torch.tpu.synchronize()
        assert metrics()["executions"] - executions == 1  # the whole step is one executable
        torch.testing.assert_close(static_loss.cpu(), cpu_train(x, y), rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(tpu_model.named_parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-4, atol=1e-5, msg=name)
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5, msg=f"{name} grad")
    for (p, state), q in zip(tpu_opt.state.items(), cpu_opt.state.values()):
        for key, value in state.items():
            torch.testing.assert_close(value.cpu().float(), q[key].float(), rtol=1e-4, atol=1e-5, msg=key)


def test_replays_update_parameters_in_place_without_growing_memory():
    model = make_model().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
    x, y = batches(1)[0]
    step = make_train_step(model, opt, x.to("tpu"), y.to("tpu"))
    for _ in range(2):
        step()
    graph = torch.tpu.TPUGraph()
    with torch.tpu.graph(graph):
        step()
    graph.replay()
    torch.tpu.synchronize()
    live = torch.tpu.memory_allocated()
    address = torch.ops.torchtpu.device_address(model[0].weight)
    for _ in range(3):
        graph.replay()
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == live
    # Parameters, gradients and optimizer state are donated: the update lands where they lie.
    assert torch.ops.torchtpu.device_address(model[0].weight) == address


def test_random_ops_draw_new_numbers_on_each_replay_and_follow_the_seed():
    x = torch.ones(64, device="tpu")
    out = torch.empty(64, device="tpu")

    def block():
        out.copy_(torch.nn.functional.dropout(x, 0.5) + torch.rand(64, device="tpu"))

    graph = torch.tpu.TPUGraph()
    with torch.tpu.graph(graph):
        block()

    def draws():
        torch.manual_seed(7)
        values = []
        for _ in range(2):
            graph.replay()
            values.append(out.cpu())
        return values

    first, second = draws()
    assert not torch.equal(first, second)
    again = draws()
    torch.testing.assert_close(again[0], first, rtol=0, atol=0)
    torch.testing.assert_close(again[1], second, rtol=0, atol=0)


def test_inference_output_follows_the_static_input():
    model = make_model().to("tpu").eval()
    static_x = torch.zeros(4, 6, device="tpu")
    graph = torch.tpu.TPUGraph()
    with torch.no_grad(), torch.tpu.graph(graph):
        static_out = model(static_x).softmax(-1)
    cpu_model = copy.deepcopy(model).cpu()
    for x, _ in batches(3):
        static_x.copy_(x[:4])
        graph.replay()
        with torch.no_grad():
            torch.testing.assert_close(static_out.cpu(), cpu_model(x[:4]).softmax(-1), rtol=1e-5, atol=1e-6)


def test_a_host_read_inside_the_block_raises_and_leaves_the_device_usable():
    x = torch.arange(4.0, device="tpu")
    graph = torch.tpu.TPUGraph()
    with pytest.raises(RuntimeError, match="torch.tpu.graph cannot capture a block that reads a value on the host"):
        with torch.tpu.graph(graph):
            (x * 2).sum().item()
    assert not torch.tpu.is_current_stream_capturing()
    torch.testing.assert_close((x * 2).cpu(), torch.arange(4.0) * 2)
    with pytest.raises(RuntimeError, match="has not captured"):
        graph.replay()


def test_an_optimizer_that_is_not_capturable_is_refused():
    model = make_model().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = batches(1)[0]
    step = make_train_step(model, opt, x.to("tpu"), y.to("tpu"))
    step()
    with pytest.raises(RuntimeError, match="capturable is False"):
        with torch.tpu.graph(torch.tpu.TPUGraph()):
            step()
    step()  # eager again afterwards


def test_reset_frees_the_graph_and_allows_a_new_capture():
    x = torch.ones(3, device="tpu")
    graph = torch.tpu.TPUGraph()
    with torch.tpu.graph(graph):
        x.add_(1)
    graph.replay()
    graph.replay()
    torch.testing.assert_close(x.cpu(), torch.full((3,), 3.0))
    with pytest.raises(RuntimeError, match="reset"):
        graph.capture_begin()
    graph.reset()
    with torch.tpu.graph(graph):
        x.mul_(2)
    graph.replay()
    torch.testing.assert_close(x.cpu(), torch.full((3,), 6.0))


def test_an_unmodified_hugging_face_llama_train_step_is_one_replayed_module():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    import common
    import llama

    vocab, *_, batch, length = llama.SIZES[True]
    data = [ids for (ids,), _ in zip(common.token_batches(0, batch, length, vocab), range(5))]
    cpu_model = llama.build(True, 0)
    tpu_model = copy.deepcopy(cpu_model).to("tpu")

    def step_of(model, ids, capturable):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, capturable=capturable)

        def step():
            loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return loss
        return step

    cpu_ids = data[0].clone()
    cpu_step = step_of(cpu_model, cpu_ids, False)
    static_ids = data[0].to("tpu")
    tpu_step = step_of(tpu_model, static_ids, True)
    cpu_losses, tpu_losses = [], []
    for i, ids in enumerate(data):
        cpu_ids.copy_(ids)
        cpu_losses.append(cpu_step().item())
        static_ids.copy_(ids)
        if i < 2:
            tpu_losses.append(tpu_step().item())
            continue
        if i == 2:
            graph = torch.tpu.TPUGraph()
            with torch.tpu.graph(graph):
                static_loss = tpu_step()
        torch.tpu.synchronize()
        executions = metrics()["executions"]
        graph.replay()
        torch.tpu.synchronize()
        assert metrics()["executions"] - executions == 1  # forward, backward, clipping and AdamW
        tpu_losses.append(static_loss.item())
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-4)


def test_a_second_process_loads_the_captured_step_from_the_disk_cache(tmp_path):
    from conftest import last_json, run_python

    program = """
import json, torch, torchtpu
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
x = torch.randn(4, 8).to("tpu")
def step():
    opt.zero_grad(set_to_none=True)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    return loss
step(); step()
torch.tpu.synchronize()
before = torchtpu.debug.metrics()["compiles"]
graph = torch.tpu.TPUGraph()
with torch.tpu.graph(graph):
    loss = step()
graph.replay()
print(json.dumps({"compiles": torchtpu.debug.metrics()["compiles"] - before, "loss": loss.item()}))
"""
    env = {"TORCHTPU_CACHE_DIR": str(tmp_path / "cache")}
    runs = [run_python(program, env, timeout=300) for _ in range(2)]
    first, second = (last_json(r.stdout) if r.returncode == 0 else r.stderr[-3000:] for r in runs)
    assert first["compiles"] == 1, first  # the whole step: one module
    assert second["compiles"] == 0, second
    assert second["loss"] == first["loss"]
