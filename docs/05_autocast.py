"""Autocast on tpu: torch.autocast("tpu", dtype=torch.bfloat16) casts per op with CUDA's policy; what runs
in which dtype, results against the CPU, and a mixed-precision training loop."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="5. Autocast")


@app.cell
def _():
    import marimo as mo
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import torchtpu

    return F, mo, nn, torch, torchtpu


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 5. Autocast: mixed precision on tpu

    `with torch.autocast("tpu", dtype=torch.bfloat16):` (or `torch.float16`) runs each op in the dtype
    CUDA's autocast policy gives it: matrix multiplies, convolutions and attention in the low
    precision dtype (fast on a TPU's matrix units, half the memory traffic), and ops that need range
    or accuracy (softmax, norms, losses, exponentials, sums) in float32. The model's parameters stay
    float32; only the inputs of an op are cast, inside the op. bfloat16 is the natural choice on TPU:
    it has float32's range, so no loss scaling is needed.
    """)
    return


@app.cell
def _(F, mo, torch):
    torch.manual_seed(0)
    x = torch.randn(8, 16, device="tpu")
    w = torch.randn(32, 16, device="tpu")
    images = torch.randn(2, 3, 8, 8, device="tpu")
    kernel = torch.randn(4, 3, 3, 3, device="tpu")
    labels = torch.randint(0, 32, (8,), device="tpu")
    bias32 = torch.ones(8, 32, device="tpu")

    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("tpu") and torch.get_autocast_dtype("tpu") == torch.bfloat16
        h = F.linear(x, w)
        results = {
            "F.linear(x, w)": h,
            "x @ w.T": x @ w.T,
            "F.conv2d(images, kernel)": F.conv2d(images, kernel),
            "F.relu(h)  (follows its input)": F.relu(h),
            "h + bias32  (bfloat16 + float32 promotes, as always)": h + bias32,
            "torch.softmax(h, -1)": torch.softmax(h, -1),
            "F.layer_norm(h, (32,))": F.layer_norm(h, (32,)),
            "F.cross_entropy(h, labels)": F.cross_entropy(h, labels),
            "h.exp()": h.exp(),
            "h.sum()": h.sum(),
        }
        with torch.autocast("tpu", enabled=False):
            results["F.linear(x, w) with autocast disabled"] = F.linear(x, w)
    _rows = "\n".join(f"| `{name}` | `{str(t.dtype).replace('torch.', '')}` |" for name, t in results.items())
    mo.md(
        f"""
    Inputs are float32. Under `torch.autocast("tpu", dtype=torch.bfloat16)`:

    | op | result dtype on tpu |
    |---|---|
    {_rows}
    """
    )
    return h, labels, results, w, x


@app.cell
def _(F, mo, results, torch, w, x):
    # The values are those of the same op computed on the CPU from bfloat16-cast inputs.
    expected = F.linear(x.cpu().bfloat16(), w.cpu().bfloat16())
    got = results["F.linear(x, w)"].cpu()
    full = F.linear(x.cpu(), w.cpu())
    mo.md(
        f"""
    `F.linear` under autocast equals the CPU's bfloat16 linear: **{torch.allclose(got.float(), expected.float(), rtol=1e-2, atol=1e-2)}**
    (largest difference {(got.float() - expected.float()).abs().max().item():.3g}); against the float32 result
    its error is {(got.float() - full).abs().max().item():.3g}, bfloat16's 8-bit mantissa at work.
    """
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Training with autocast

    Only the forward pass (and the loss) goes inside the autocast block; `backward()` runs each
    gradient in the dtype its forward op used, and the optimizer updates the float32 parameters.
    The same model trains here three ways from the same weights: float32 on the CPU, float32 on tpu
    and bfloat16 autocast on tpu.
    """)
    return


@app.cell
def _(F, nn, torch):
    def make_model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(16, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 4))

    def train(device, autocast_dtype=None, steps=6):
        model = make_model().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(steps):
            inputs, targets = torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)
            opt.zero_grad()
            with torch.autocast(device, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
                logits = model(inputs.to(device))
                loss = F.cross_entropy(logits, targets.to(device))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, logits.dtype, next(model.parameters()).grad.dtype

    cpu_losses, _, _ = train("cpu")
    tpu_losses, _, _ = train("tpu")
    amp_losses, amp_logits_dtype, amp_grad_dtype = train("tpu", torch.bfloat16)
    return amp_grad_dtype, amp_logits_dtype, amp_losses, cpu_losses, tpu_losses


@app.cell
def _(amp_grad_dtype, amp_logits_dtype, amp_losses, cpu_losses, mo, torch, tpu_losses):
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.tensor(amp_losses), torch.tensor(cpu_losses), rtol=5e-2, atol=5e-2)
    _rows = "\n".join(
        f"| {i} | {c:.5f} | {t:.5f} | {a:.5f} |" for i, (c, t, a) in enumerate(zip(cpu_losses, tpu_losses, amp_losses))
    )
    mo.md(
        f"""
    | step | CPU float32 | tpu float32 | tpu bfloat16 autocast |
    |---|---|---|---|
    {_rows}

    Under autocast the logits were `{amp_logits_dtype}` and the gradients `{amp_grad_dtype}` (the
    parameters' dtype). The float32 runs agree to rounding; the autocast run follows them within
    bfloat16's precision.
    """
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## float16 needs a gradient scaler

    float16 has a narrow range, so small gradients underflow unless the loss is scaled up first:
    `torch.amp.GradScaler("tpu")` does that as on CUDA. Two of its bookkeeping ops
    (`_amp_foreach_non_finite_check_and_unscale_`, `_amp_update_scale_`) have no spec yet and run on
    the CPU, which the warnings below name; notebook 8 shows how to find such ops in your own model.
    With bfloat16 none of this is needed.
    """)
    return


@app.cell
def _(F, mo, nn, torch, torchtpu):
    torch.manual_seed(0)
    fp16_model = nn.Linear(16, 4).to("tpu")
    fp16_opt = torch.optim.SGD(fp16_model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("tpu")
    fallbacks_before = dict(torchtpu.debug.metrics()["cpu_fallbacks"])
    fp16_losses = []
    for _step in range(3):
        fp16_opt.zero_grad()
        with torch.autocast("tpu", dtype=torch.float16):
            fp16_loss = F.mse_loss(fp16_model(torch.randn(8, 16, device="tpu")), torch.zeros(8, 4, device="tpu"))
        scaler.scale(fp16_loss).backward()
        scaler.step(fp16_opt)
        scaler.update()
        fp16_losses.append(round(fp16_loss.item(), 4))
    fell_back = torchtpu.debug.fallbacks_since(fallbacks_before)
    mo.md(
        f"""
    float16 losses `{fp16_losses}`, loss scale now `{scaler.get_scale():.0f}`; ops that ran on the CPU
    in these 3 steps: `{fell_back}`.
    """
    )
    return


if __name__ == "__main__":
    app.run()
