"""torch.distributed on tpu: two ranks started with torchrun from a cell, the "tpu" c10d backend's
collectives, and DistributedDataParallel training that matches single-process training."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="7. Distributed")


@app.cell
def _():
    import json
    import os
    import pathlib
    import subprocess
    import sys
    import tempfile
    import textwrap

    import marimo as mo

    REPO = pathlib.Path(mo.notebook_dir()).resolve().parent
    return REPO, json, mo, os, subprocess, sys, tempfile, textwrap


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 7. Distributed training: `torch.distributed` on tpu

    `import torchtpu` registers a c10d backend named `"tpu"`, the default for tpu devices (as nccl
    is for cuda), so a process group made with `device_id=torch.device("tpu", local_rank)` needs no
    backend name. DDP, FSDP2 (`fully_shard`) and DTensor tensor parallelism run unmodified on top of it.
    One process drives one device, exactly as with CUDA:

    ```python
    torch.tpu.set_device(local_rank)
    dist.init_process_group(device_id=torch.device("tpu", local_rank))   # backend "tpu"
    model = DistributedDataParallel(model.to("tpu"))
    ```

    A notebook is one process, so the cell below writes a small training program to a temporary
    file and starts **two ranks** of it with `torchrun`, the way you would from a shell
    (`torchrun --standalone --nproc-per-node 2 prog.py`). On this machine each rank gets its own
    device of the CPU plugin; the same program runs one rank per chip on a TPU host.
    """)
    return


@app.cell
def _(tempfile, textwrap):
    PROGRAM = textwrap.dedent(r'''
        import copy, json, os, sys
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel

        import torchtpu  # registers the "tpu" backend

        rank, world, local_rank = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
        torch.set_num_threads(1)
        torch.tpu.set_device(local_rank)
        device = torch.device("tpu", local_rank)
        dist.init_process_group(device_id=device)
        report = {"rank": rank, "backend": dist.get_backend(), "device": str(device)}

        # collectives on tpu tensors
        t = torch.full((3,), float(rank + 1), device=device)
        dist.all_reduce(t)                                   # sum over ranks
        report["all_reduce"] = t.cpu().tolist()
        parts = [torch.empty(2, device=device) for _ in range(world)]
        dist.all_gather(parts, torch.tensor([rank, 10.0 * rank], device=device))
        report["all_gather"] = [p.cpu().tolist() for p in parts]
        b = torch.tensor([42.0 + rank], device=device)
        dist.broadcast(b, src=0)
        report["broadcast"] = b.item()

        # DDP: every rank trains on its shard of each batch; gradients are averaged by all_reduce
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        reference = copy.deepcopy(model)                     # one process, whole batches, on the CPU
        ddp = DistributedDataParallel(model.to(device))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        losses = []
        for step in range(3):
            x, y = torch.randn(4 * world, 8, generator=g), torch.randn(4 * world, 1, generator=g)
            mine = slice(4 * rank, 4 * (rank + 1))
            opt.zero_grad()
            loss = F.mse_loss(ddp(x[mine].to(device)), y[mine].to(device))
            loss.backward()
            opt.step()
            losses.append(round(loss.item(), 6))
            ref_opt.zero_grad()
            F.mse_loss(reference(x), y).backward()
            ref_opt.step()
        report["losses"] = losses
        report["max_weight_difference_vs_single_process"] = max(
            (p.detach().cpu() - q.detach()).abs().max().item()
            for p, q in zip(ddp.module.parameters(), reference.parameters()))
        with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:   # the notebook reads these
            json.dump(report, f)
        dist.destroy_process_group()
    ''')
    program_path = tempfile.NamedTemporaryFile("w", suffix="_ddp.py", delete=False).name
    with open(program_path, "w") as _f:
        _f.write(PROGRAM)
    return (program_path,)


@app.cell
def _(REPO, json, os, program_path, subprocess, sys, tempfile):
    results = tempfile.mkdtemp(prefix="torchtpu-ranks-")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               program_path, results]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    os.remove(program_path)
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    reports = []
    for _rank in range(2):
        with open(os.path.join(results, f"rank{_rank}.json")) as _f:
            reports.append(json.load(_f))
        os.remove(_f.name)
    os.rmdir(results)
    print("$ torchrun --standalone --nproc-per-node 2", os.path.basename(program_path), "<results dir>")
    for _r in reports:
        print(json.dumps(_r))
    return (reports,)


@app.cell
def _(mo, reports):
    def cell(key):
        return " | ".join(f"`{r[key]}`" for r in reports)

    assert all(r["all_reduce"] == [3.0, 3.0, 3.0] for r in reports)
    assert all(r["max_weight_difference_vs_single_process"] < 1e-5 for r in reports)
    mo.md(
        f"""
    | | rank 0 | rank 1 |
    |---|---|---|
    | backend | {cell("backend")} |
    | device | {cell("device")} |
    | `all_reduce` of `[rank + 1] * 3` | {cell("all_reduce")} |
    | `all_gather` of `[rank, 10 * rank]` | {cell("all_gather")} |
    | `broadcast` from rank 0 | {cell("broadcast")} |
    | DDP losses (each rank's shard) | {cell("losses")} |
    | largest weight difference from single-process training | {cell("max_weight_difference_vs_single_process")} |

    After three DDP steps both ranks hold the weights that one process training on the whole
    batches reaches: DDP's gradient all_reduce ran through the `"tpu"` backend.
    """
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## What else runs, and how

    - Every collective: all_reduce (sum, avg, max, min, product), all_gather, reduce_scatter,
      broadcast, reduce, gather, scatter, all_to_all (uneven splits too), send/recv, barrier, and the
      functional collectives that DTensor and compiled graphs call.
    - FSDP2 and tensor parallelism through a device mesh: `init_device_mesh("tpu", (world,))`, then
      `fully_shard(model)` or `parallelize_module(...)`. The examples take `--ddp`, `--fsdp` and `--tp`:
      `torchrun --standalone --nproc-per-node 2 examples/llama.py --tiny --ddp`.
    - The transport in this build is **host**: tpu tensors are copied to host memory, gloo runs the
      collective among the processes, and the results are copied back, so communication does not
      overlap computation. A dead peer or mismatched collectives raise a `RuntimeError` after the
      group's `timeout` instead of hanging.
    - Inside `torch.compile`, a collective splits the graph: it runs eagerly between two captured modules.
    """)
    return


if __name__ == "__main__":
    app.run()
