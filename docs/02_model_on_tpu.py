"""A model on tpu: an nn.Module moved with .to("tpu"), a few training steps whose losses equal the CPU's,
inference, and getting the weights back."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="2. A model on tpu")


@app.cell
def _():
    import copy

    import marimo as mo
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import torchtpu

    return F, copy, mo, nn, torch, torchtpu


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 2. A model on tpu

    Nothing about a model changes for tpu: build it as usual, call `.to("tpu")` (or `.tpu()`), feed it
    tpu tensors, and the forward pass, the backward pass and the optimizer step all run on the device,
    each op from a spec. Here a small convolutional classifier trains for a few steps on tpu and,
    from the same initial weights and the same batches, on the CPU: the losses agree.
    """)
    return


@app.cell
def _(F, nn):
    class SmallNet(nn.Module):
        """A convolution, batch norm, pooling, dropout-free MLP head: a little of everything."""

        def __init__(self, classes: int = 10):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
            self.bn1 = nn.BatchNorm2d(8)
            self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
            self.head = nn.Sequential(nn.Flatten(), nn.Linear(16 * 4 * 4, 32), nn.GELU(), nn.Linear(32, classes))

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)   # 16x16 -> 8x8
            x = F.avg_pool2d(F.silu(self.conv2(x)), 2)              # 8x8 -> 4x4
            return self.head(x)

    return (SmallNet,)


@app.cell
def _(SmallNet, copy, mo, torch):
    torch.manual_seed(0)
    model_cpu = SmallNet()
    model = copy.deepcopy(model_cpu).to("tpu")      # same initial weights, now on the device
    params = sum(p.numel() for p in model.parameters())
    mo.md(
        f"""
    `model.to("tpu")` moved **{params}** parameters and the batch-norm buffers:
    `next(model.parameters()).device` is `{next(model.parameters()).device}`,
    `model.bn1.running_mean.device` is `{model.bn1.running_mean.device}`.
    """
    )
    return model, model_cpu


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Training: the same steps on tpu and on the CPU

    The batches are made on the CPU once and copied to the device each step (as a data loader's
    output would be). AdamW runs in its default foreach form, so its update is a handful of
    `_foreach_*` kernels over all parameters at once.
    """)
    return


@app.cell
def _(F, model, model_cpu, torch):
    def train(net, device, steps=5):
        g = torch.Generator().manual_seed(1)
        opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
        losses = []
        net.train()
        for _ in range(steps):
            images = torch.randn(16, 1, 16, 16, generator=g)
            labels = torch.randint(0, 10, (16,), generator=g)
            opt.zero_grad()
            loss = F.cross_entropy(net(images.to(device)), labels.to(device))
            loss.backward()
            opt.step()
            losses.append(loss.item())          # .item() waits for the step to finish
        return losses

    losses_tpu = train(model, "tpu")
    losses_cpu = train(model_cpu, "cpu")
    torch.testing.assert_close(torch.tensor(losses_tpu), torch.tensor(losses_cpu), rtol=1e-4, atol=1e-5)
    return losses_cpu, losses_tpu


@app.cell
def _(losses_cpu, losses_tpu, mo):
    rows = "\n".join(
        f"| {i} | {a:.6f} | {b:.6f} | {abs(a - b):.1e} |" for i, (a, b) in enumerate(zip(losses_tpu, losses_cpu))
    )
    mo.md(
        f"""
    | step | loss on tpu | loss on CPU | difference |
    |---|---|---|---|
    {rows}
    """
    )
    return


@app.cell
def _(mo, model, model_cpu):
    worst = max(
        (p.detach().cpu() - q.detach()).abs().max().item()
        for p, q in zip(model.parameters(), model_cpu.parameters())
    )
    stats = (model.bn1.running_mean.cpu() - model_cpu.bn1.running_mean).abs().max().item()
    mo.md(
        f"""
    After training, the largest difference between a tpu weight and its CPU twin is **{worst:.1e}**;
    batch norm's running mean (updated in place on the device) differs by **{stats:.1e}**.
    """
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Inference and getting the weights back

    `eval()` and `torch.no_grad()` work as everywhere. `torch.save(model.state_dict(), f)` writes the
    tpu tensors as they are; `torch.load(f)` brings them back on tpu (`map_location="cpu"` on the
    host), and `load_state_dict` copies them into a model's parameters.
    """)
    return


@app.cell
def _(SmallNet, mo, model, model_cpu, torch):
    import io

    model.eval()
    model_cpu.eval()
    with torch.no_grad():
        probe = torch.randn(4, 1, 16, 16)
        pred_tpu = model(probe.to("tpu")).argmax(dim=1).cpu()
        pred_cpu = model_cpu(probe).argmax(dim=1)

    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    restored = SmallNet().to("tpu")
    loaded = torch.load(buffer)
    assert all(v.device.type == "tpu" for v in loaded.values())
    restored.load_state_dict(loaded)
    restored.eval()
    with torch.no_grad():
        same = torch.equal(restored(probe.to("tpu")).cpu(), model(probe.to("tpu")).cpu())
    mo.md(
        f"""
    predicted classes on tpu `{pred_tpu.tolist()}`, on the CPU `{pred_cpu.tolist()}`;
    a copy restored from the saved state dict gives identical outputs: **{same}**
    ({buffer.getbuffer().nbytes} bytes saved).
    """
    )
    return (same,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Bigger models

    `examples/` trains real models exactly this way (Llama and Qwen from Hugging Face `transformers`
    with small random configurations, ResNet, DLRM, minGPT, a UNet), each with `--device cpu` to compare
    and `--compile` for graph mode: `python examples/llama.py --tiny --steps 20`.
    """)
    return


@app.cell
def _(mo, same, torchtpu):
    assert same
    fallbacks = torchtpu.debug.metrics()["cpu_fallbacks"]
    mo.md(f"Ops that ran on the CPU instead of tpu in this notebook: **{sum(fallbacks.values())}** {dict(fallbacks)}")
    return


if __name__ == "__main__":
    app.run()
