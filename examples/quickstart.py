"""The first program on device "tpu": a small computation, checked against the same program on CPU."""

import torch

import torchtpu

if not torchtpu.is_available():
    raise SystemExit(f"torchtpu could not start: {torchtpu.init_error()}")

torch.manual_seed(0)
x_cpu, w_cpu = torch.randn(4, 8), torch.randn(8, 3)

x = x_cpu.to("tpu")
w = w_cpu.to("tpu")
y = (x @ w).relu() + 1.5
print(y)                      # a real tpu tensor, printed like a CUDA one
y[:, 0] = 0                   # in-place on a view; y sees it
print(y.sum(dim=0).cpu())     # equals the same program on CPU
print(torch.tpu.device_count(), torch.tpu.get_device_name())

y_cpu = (x_cpu @ w_cpu).relu() + 1.5
y_cpu[:, 0] = 0
torch.testing.assert_close(y.sum(dim=0).cpu(), y_cpu.sum(dim=0))
print("matches CPU:", torch.equal(y.cpu(), y_cpu))
print(torchtpu.debug.metrics_report())
