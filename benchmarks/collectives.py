"""torch.distributed on "tpu" against plain gloo: all_reduce bus bandwidth and DDP step scaling, side by side
in one run, several processes on this machine.

Two transports are compared, in the same processes:

  tpu (host via gloo)  tpu tensors through the c10d backend "tpu" (torchtpu/distributed.py): each
                       collective copies the tpu tensors to host memory, runs gloo on the copies and
                       copies the results back (the only transport this build has)
  gloo (cpu)           CPU tensors through a second group, dist.new_group(backend="cpu:gloo,tpu:tpu"), whose
                       CPU tensors go to its own gloo backend: the floor the host transport is measured
                       against (the same gloo, minus the two copies). backend="gloo" alone raises once the
                       default group is bound to a tpu device (see Rank.__init__).

1. all_reduce (SUM, float32) for every message size in --sizes (default 4 KiB .. 16 MiB, powers of 4), on
   every world size > 1 in --world-sizes. Each size is first checked (rank r sends r + 1 everywhere, every
   element must come back as n(n+1)/2), then run --warmup times untimed and --iters times timed. A timed
   iteration starts after a barrier on the gloo group (and torch.tpu.synchronize() for tpu tensors), so
   every rank enters the collective together, and stops after torch.tpu.synchronize() once the call has
   returned, i.e. when the result is back in the tpu tensor. An iteration's time is the slowest rank's;
   the table shows the median over iterations. Bandwidth as nccl-tests defines it for all_reduce:

       algbw = bytes / time        busbw = algbw * 2(n-1)/n        (GB/s, 1 GB = 1e9 bytes)

   busbw is what each rank's link carries in a ring all_reduce, comparable across world sizes.

2. DDP weak scaling over --world-sizes (default 1, 2, 4): an MLP (--features -> --hidden x --layers ->
   10, GELU, cross-entropy, SGD with momentum) wrapped in DistributedDataParallel, a fixed batch of
   --batch samples per rank (so the global batch grows with the world), once on tpu tensors (default
   group, backend "tpu") and once on CPU tensors (the gloo group), from the same initial weights and the
   same data. Each rank's batch is on its device before the clock starts. A step (forward, backward with
   DDP's gradient all_reduce, optimizer step) is timed up to torch.tpu.synchronize() (tpu) or its return
   (cpu), --warmup untimed steps first; a step's time is the slowest rank's, the table shows the median
   over --steps steps, samples/s = world * batch / median, and scaling efficiency = samples/s at n ranks
   / (n * samples/s at 1 rank). After training, every rank's parameters are checked against rank 0's (DDP
   must keep them identical) and the tpu parameters against the CPU ones.

The script spawns the ranks itself: one set of processes per world size (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT in their environment, a free port), each rank on its own tpu device (torch.tpu.set_device(rank):
the CPU plugin exposes 4 devices per process, so at most 4 ranks); rank 0 gathers the timings over the
gloo group and the launching process prints the tables.

What the numbers mean on this machine: the "tpu" devices are the XLA CPU plugin's, so a tpu tensor lives in
host memory already and the "copies" are host-to-host memcpys through PJRT; on a real accelerator they
would be PCIe transfers. Every rank is a process on the same 2 CPU cores: 2 ranks have a core each, 4 ranks
share them, so at 4 ranks (and partly at 2, with gloo's and PJRT's own threads) the numbers mostly measure
contention for the cores, not the transports. Each process runs --cpu-threads torch threads (default 1)
and OMP_NUM_THREADS=1: with torch's OpenMP pool and the PJRT CPU client's thread pool each sized to every
core, in up to 4 processes, the 2 cores are oversubscribed many times over and the medians become noise.

Usage: python benchmarks/collectives.py [--world-sizes 1,2,4] [--sizes 4K,16K,...,16M] [--iters N]
                                        [--steps N] [--warmup N] [--batch N] [--hidden N] [--layers N]
                                        [--skip-allreduce] [--skip-ddp] [--timeout S] [--plot out.png]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch

import torchtpu
from torchtpu.testing import free_port

TRANSPORTS = ("tpu (host via gloo)", "gloo (cpu)")
DEFAULT_SIZES = [4096 * 4 ** k for k in range(7)]  # 4 KiB .. 16 MiB
FLOAT_BYTES = 4
NUM_CLASSES = 10


# Arguments.

def parse_size(text: str) -> int:
    """'4K', '16M', '1G' (binary multiples) or a plain number of bytes; a multiple of 4 (float32)."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    size = int(float(text[:-1] if scale > 1 else text) * scale)
    if size < FLOAT_BYTES or size % FLOAT_BYTES:
        raise argparse.ArgumentTypeError(f"{text}: a message size must be a positive multiple of 4 bytes")
    return size


def fmt_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-sizes", default="1,2,4",
                        help="comma-separated world sizes, one launch each (default 1,2,4; at most the tpu "
                             "device count, 4 on the CPU plugin)")
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES),
                        help="comma-separated all_reduce message sizes in bytes, K/M/G suffixes allowed "
                             "(default 4K,16K,64K,256K,1M,4M,16M)")
    parser.add_argument("--iters", type=int, default=20, help="timed all_reduce iterations per size (default 20)")
    parser.add_argument("--steps", type=int, default=20, help="timed DDP steps per world size (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations / steps first (default 3)")
    parser.add_argument("--batch", type=int, default=64, help="DDP samples per rank per step (default 64)")
    parser.add_argument("--features", type=int, default=256, help="MLP input width (default 256)")
    parser.add_argument("--hidden", type=int, default=512, help="MLP hidden width (default 512)")
    parser.add_argument("--layers", type=int, default=3, help="MLP hidden layers (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu-threads", type=int, default=1,
                        help="torch CPU threads per rank (default 1; 0 keeps torch's default)")
    parser.add_argument("--skip-allreduce", action="store_true", help="only the DDP scaling")
    parser.add_argument("--skip-ddp", action="store_true", help="only the all_reduce bandwidth")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds one world size may take before its ranks are killed (default 300); "
                             "a collective waits at most a third of it")
    parser.add_argument("--plot", metavar="OUT.png", help="also draw busbw vs size and DDP samples/s vs ranks")
    parser.add_argument("--worker", metavar="RESULT.json", help=argparse.SUPPRESS)  # internal: run as one rank
    return parser


# One rank.

def slowest_rank_median(per_rank: list[list[float]]) -> float:
    """Per iteration the slowest rank's time (the collective or step is done when every rank is), then the
    median over iterations."""
    return statistics.median(max(times) for times in zip(*per_rank))


class Rank:
    def __init__(self, args: argparse.Namespace):
        import torch.distributed as dist

        self.args, self.dist = args, dist
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.tpu = torch.device("tpu", self.rank)
        torch.tpu.set_device(self.rank)
        timeout = timedelta(seconds=max(30.0, args.timeout / 3))
        dist.init_process_group(device_id=self.tpu, timeout=timeout)
        if dist.get_backend() != "tpu":
            raise RuntimeError(f'the default group\'s backend is {dist.get_backend()!r}, not "tpu"')
        # The reference group: gloo on CPU tensors. Plain new_group(backend="gloo") raises here ("No backend
        # type associated with device type tpu"): the new group inherits the default group's bound device
        # (tpu:rank, from device_id) and torch asks the new group for that device's backend, which a gloo-only
        # group (cpu and cuda) lacks. Naming a tpu backend too satisfies it; CPU tensors on this group still
        # go to its own gloo backend, which is all this benchmark sends it.
        self.gloo = dist.new_group(backend="cpu:gloo,tpu:tpu", timeout=timeout)
        self.result: dict[str, Any] = {"world": self.world, "allreduce": {}, "ddp": {}, "errors": []}

    def log(self, message: str) -> None:
        if self.rank == 0:
            print(f"  [{self.world} rank{'s' if self.world > 1 else ''}] {message}", flush=True)

    def gather(self, value: Any) -> list[Any] | None:
        """Every rank's `value` on rank 0 (None elsewhere), over the gloo group."""
        out = [None] * self.world if self.rank == 0 else None
        self.dist.gather_object(value, out, dst=0, group=self.gloo)
        return out

    def barrier(self) -> None:
        self.dist.barrier(group=self.gloo)

    def save(self) -> None:
        if self.rank == 0:
            Path(self.args.worker).write_text(json.dumps(self.result))

    def transport(self, name: str) -> tuple[torch.device, Any, Callable[[], None]]:
        """(device, group, sync) of a transport."""
        if name == TRANSPORTS[0]:
            return self.tpu, None, torch.tpu.synchronize
        return torch.device("cpu"), self.gloo, lambda: None

    # 1. all_reduce bandwidth

    def allreduce(self, sizes: list[int]) -> None:
        dist, n = self.dist, self.world
        expected = n * (n + 1) / 2
        # Size by size, the two transports back to back: a change in the machine's load hits both columns.
        for size in sizes:
            for name in TRANSPORTS:
                device, group, sync = self.transport(name)
                rows = self.result["allreduce"].setdefault(name, {})
                numel = size // FLOAT_BYTES
                t = torch.full((numel,), float(self.rank + 1), device=device)
                dist.all_reduce(t, group=group)  # the check: every element n(n+1)/2
                sync()
                host = t.cpu()
                wrong = int((host != expected).sum())
                check = "ok" if wrong == 0 else (f"WRONG: {wrong}/{numel} elements differ from {expected:g}, "
                                                  f"e.g. {host[(host != expected).nonzero()[0]].item():g}")
                t.zero_()  # timed in place: zeros stay zeros, however many iterations
                times = []
                for i in range(self.args.warmup + self.args.iters):
                    sync()
                    self.barrier()
                    start = time.perf_counter()
                    dist.all_reduce(t, group=group)
                    sync()
                    if i >= self.args.warmup:
                        times.append(time.perf_counter() - start)
                gathered = self.gather({"times": times, "check": check})
                if self.rank == 0:
                    seconds = slowest_rank_median([g["times"] for g in gathered])
                    checks = sorted({g["check"] for g in gathered})
                    rows[str(size)] = {"seconds": seconds, "check": "ok" if checks == ["ok"] else "; ".join(
                        f"rank {r}: {g['check']}" for r, g in enumerate(gathered) if g["check"] != "ok")}
                    self.log(f"all_reduce {name:<20} {fmt_bytes(size):>8}  {seconds * 1e6:10.1f} us  "
                             f"check {rows[str(size)]['check']}")
                del t
                self.save()

    # 2. DDP scaling

    def make_model(self) -> torch.nn.Module:
        a = self.args
        torch.manual_seed(a.seed)  # every rank and both transports start from the same weights
        layers, width = [], a.features
        for _ in range(a.layers):
            layers += [torch.nn.Linear(width, a.hidden), torch.nn.GELU()]
            width = a.hidden
        layers.append(torch.nn.Linear(width, NUM_CLASSES))
        return torch.nn.Sequential(*layers)

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's fixed batch: its own samples, the same for both transports."""
        g = torch.Generator().manual_seed(self.args.seed + 1 + self.rank)
        x = torch.randn(self.args.batch, self.args.features, generator=g)
        return x, torch.randint(0, NUM_CLASSES, (self.args.batch,), generator=g)

    def ddp(self) -> None:
        from torch.nn.parallel import DistributedDataParallel

        dist, a = self.dist, self.args
        trained = {}
        for name in TRANSPORTS:
            device, group, sync = self.transport(name)
            model = DistributedDataParallel(self.make_model().to(device), process_group=group)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            x, y = (t.to(device) for t in self.batch())
            sync()

            def step() -> torch.Tensor:
                optimizer.zero_grad(set_to_none=True)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()  # DDP all_reduces the gradients here
                optimizer.step()
                return loss

            self.barrier()
            times = []
            for i in range(a.warmup + a.steps):
                start = time.perf_counter()
                loss = step()
                sync()
                if i >= a.warmup:
                    times.append(time.perf_counter() - start)
            final_loss = float(loss.detach().cpu())
            flat = torch.cat([p.detach().cpu().reshape(-1) for p in model.module.parameters()])
            trained[name] = flat
            reference = flat.clone()
            dist.broadcast(reference, src=0, group=self.gloo)
            gathered = self.gather({"times": times, "loss": final_loss,
                                    "vs_rank0": float((flat - reference).abs().max())})
            if self.rank == 0:
                seconds = slowest_rank_median([g["times"] for g in gathered])
                self.result["ddp"][name] = {
                    "seconds": seconds, "params": flat.numel(), "loss": final_loss,
                    "vs_rank0": max(g["vs_rank0"] for g in gathered)}
                self.log(f"DDP {name:<20} {seconds * 1e3:8.2f} ms/step  "
                         f"{self.world * a.batch / seconds:10,.0f} samples/s  loss {final_loss:.4f}")
            del model, optimizer
        if self.rank == 0:
            self.result["ddp_tpu_vs_cpu"] = float((trained[TRANSPORTS[0]] - trained[TRANSPORTS[1]]).abs().max())
        self.save()

    def run(self, sizes: list[int]) -> None:
        self.save()
        if self.world > 1 and not self.args.skip_allreduce:
            self.allreduce(sizes)
        if not self.args.skip_ddp:
            self.ddp()
        self.barrier()
        self.dist.destroy_process_group()


def worker(args: argparse.Namespace, sizes: list[int]) -> None:
    if args.cpu_threads > 0:
        torch.set_num_threads(args.cpu_threads)
    rank = Rank(args)
    try:
        rank.run(sizes)
    except Exception as error:
        if rank.rank == 0:  # keep what was measured, and say what failed
            rank.result["errors"].append(f"{type(error).__name__}: {error}")
            rank.save()
        raise


# The launcher.

def worker_argv(args: argparse.Namespace) -> list[str]:
    """The options a rank needs, as command-line arguments (everything but --plot)."""
    argv = []
    for key, value in vars(args).items():
        if key in ("plot", "worker") or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def launch(world: int, argv: list[str], timeout: float) -> dict[str, Any]:
    """Runs this script as `world` ranks; returns rank 0's results, with an "errors" entry for a rank that
    failed (its stderr's tail) or a launch that outlived `timeout`. Rank 0's output streams through."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="collectives-") as tmp:
        result_path = os.path.join(tmp, "result.json")
        procs, logs = [], []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            err = open(os.path.join(tmp, f"rank{rank}.err"), "w+")
            out = None if rank == 0 else open(os.path.join(tmp, f"rank{rank}.out"), "w+")
            logs.append((out, err))
            procs.append(subprocess.Popen([sys.executable, __file__, *argv, "--worker", result_path],
                                          env=env, stdout=out, stderr=err))
        errors, killed, deadline = [], [], time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                if failed:
                    time.sleep(2)  # let the other ranks raise on their own first
                killed = [r for r, p in enumerate(procs) if p.poll() is None]
                for r in killed:
                    procs[r].kill()
                why = f"rank {failed[0]} failed" if failed else f"still running after {timeout:g} s (a hang?)"
                errors.append(f"{why}; killed rank{'s' if len(killed) > 1 else ''} {killed}")
                break
            time.sleep(0.2)
        for p in procs:
            p.wait()
        for rank, (p, (out, err)) in enumerate(zip(procs, logs)):
            if p.returncode != 0 and rank not in killed:
                err.seek(0)
                tail = err.read()[-3000:].rstrip()
                errors.append(f"rank {rank} exited {p.returncode}:\n{tail}")
            err.close()
            if out is not None:
                out.close()
        result = json.loads(Path(result_path).read_text()) if os.path.exists(result_path) else {
            "world": world, "allreduce": {}, "ddp": {}, "errors": []}
    result["errors"] = result.get("errors", []) + errors
    return result


# Reporting.

def bandwidths(size: int, seconds: float, world: int) -> tuple[float, float]:
    algbw = size / seconds / 1e9
    return algbw, algbw * 2 * (world - 1) / world


def print_allreduce(results: list[dict[str, Any]], sizes: list[int], iters: int) -> None:
    width = 29  # one transport's three columns
    for res in results:
        world, rows = res["world"], res["allreduce"]
        if world < 2 or not rows:
            continue
        print(f"\nall_reduce SUM float32, {world} ranks: median of {iters} iterations (slowest rank per iteration); "
              f"GB/s = 1e9 bytes/s, busbw = algbw * 2(n-1)/n")
        print(f"{'':>10}" + "".join(f"   {name:<{width - 3}}" for name in TRANSPORTS))
        header = f"{'size':>10}" + f"{'time us':>11}{'algbw':>9}{'busbw':>9}" * len(TRANSPORTS) + f"{'tpu/gloo':>10}  check"
        print(header)
        print("-" * len(header))
        for size in sizes:
            line, secs, checks = f"{fmt_bytes(size):>10}", [], []
            for name in TRANSPORTS:
                row = rows.get(name, {}).get(str(size))
                if row is None:
                    line += f"{'-':>11}{'-':>9}{'-':>9}"
                    secs.append(None)
                    continue
                algbw, busbw = bandwidths(size, row["seconds"], world)
                line += f"{row['seconds'] * 1e6:11.1f}{algbw:9.4f}{busbw:9.4f}"
                secs.append(row["seconds"])
                if row["check"] != "ok":
                    checks.append(f"{name}: {row['check']}")
            ratio = f"{secs[0] / secs[1]:.2f}x" if None not in secs else "-"
            print(f"{line}{ratio:>10}  {'; '.join(checks) or 'ok'}")
        print("tpu/gloo: the host transport's time over plain gloo's (its two copies and the tpu ops around them)")


def print_ddp(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    rows = [r for r in results if r["ddp"]]
    if not rows:
        return
    params = next(iter(rows[0]["ddp"].values()))["params"]
    print(f"\nDDP weak scaling: MLP {args.features}->{args.hidden}x{args.layers}->{NUM_CLASSES} ({params:,} "
          f"parameters, {params * FLOAT_BYTES / 2**20:.2f} MiB of gradients), {args.batch} samples per rank, "
          f"SGD; median of {args.steps} steps (slowest rank per step)")
    width = 31
    print(f"{'':>6}" + "".join(f"   {name:<{width - 3}}" for name in TRANSPORTS))
    header = (f"{'ranks':>6}" + f"{'ms/step':>10}{'samples/s':>12}{'eff':>9}" * len(TRANSPORTS)
              + f"{'tpu/gloo':>10}{'max|d| ranks':>14}{'max|d| tpu-cpu':>16}")
    print(header)
    print("-" * len(header))
    base: dict[str, float | None] = {name: None for name in TRANSPORTS}
    for res in rows:
        world, line, secs, drift = res["world"], f"{res['world']:>6}", [], []
        for name in TRANSPORTS:
            row = res["ddp"].get(name)
            if row is None:
                line += f"{'-':>10}{'-':>12}{'-':>9}"
                secs.append(None)
                continue
            rate = world * args.batch / row["seconds"]
            if world == 1:
                base[name] = rate
            eff = f"{rate / (world * base[name]) * 100:.0f} %" if base[name] else "-"
            line += f"{row['seconds'] * 1e3:10.2f}{rate:12,.0f}{eff:>9}"
            secs.append(row["seconds"])
            drift.append(row["vs_rank0"])
        ratio = f"{secs[0] / secs[1]:.2f}x" if None not in secs else "-"
        tpu_cpu = res.get("ddp_tpu_vs_cpu")
        print(f"{line}{ratio:>10}{max(drift) if drift else float('nan'):>14.1e}"
              f"{tpu_cpu if tpu_cpu is not None else float('nan'):>16.1e}")
    print("eff: samples/s at n ranks / (n * samples/s at 1 rank), weak scaling; tpu/gloo: step time on tpu over "
          "the CPU step's;\nmax|d| ranks: largest parameter difference from rank 0 after training (DDP keeps "
          "them equal: 0);\nmax|d| tpu-cpu: the tpu run's parameters against the CPU run's (same weights and "
          "data: float rounding only)")


def plot(path: str, results: list[dict[str, Any]], sizes: list[int], args: argparse.Namespace) -> None:
    """busbw vs message size (one line per transport and world size) and DDP samples/s vs ranks."""
    from torchtpu.tools import plots

    bandwidth = {}
    for res in results:
        for name in TRANSPORTS:
            rows = res["allreduce"].get(name, {})
            xs = [s for s in sizes if str(s) in rows]
            if res["world"] > 1 and xs:
                bandwidth[f"{name}, {res['world']} ranks"] = (
                    xs, [bandwidths(s, rows[str(s)]["seconds"], res["world"])[1] for s in xs])
    scaling = {}
    for name in TRANSPORTS:
        points = [(r["world"], r["world"] * args.batch / r["ddp"][name]["seconds"]) for r in results
                  if name in r["ddp"]]
        if points:
            scaling[name] = ([w for w, _ in points], [rate for _, rate in points])
    worlds = sorted({r["world"] for r in results})
    try:
        plots.draw(path,
                   plots.Lines("all_reduce bus bandwidth", bandwidth, "message size", "busbw (GB/s)", xlog=2,
                               xticks=[(s, fmt_bytes(s)) for s in sizes],
                               empty_text="no all_reduce run (needs a world size > 1)"),
                   plots.Lines(f"DDP weak scaling ({args.batch} samples per rank)", scaling, "ranks",
                               "samples/s", xticks=[(w, str(w)) for w in worlds], empty_text="no DDP run"))
    except plots.PlotsUnavailable as missing:
        print(f"--plot {path}: {missing}; no plot written")
        return
    print(f"plot written to {path}")


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
        worlds = [int(w) for w in args.world_sizes.split(",") if w.strip()]
    except (ValueError, argparse.ArgumentTypeError) as error:
        parser.error(str(error))
    if args.worker:
        worker(args, sizes)
        return

    if not torchtpu.is_available():
        raise SystemExit(f"no tpu runtime: {torchtpu.init_error()}")
    devices = torch.tpu.device_count()
    if any(w < 1 or w > devices for w in worlds):
        parser.error(f"--world-sizes {args.world_sizes}: each must be 1 .. {devices} (one tpu device per rank)")
    print(f"collectives: world sizes {worlds}, {len(sizes)} all_reduce sizes x {args.iters} iterations, "
          f"DDP {args.steps} steps, {args.warmup} warm-up; torch {torch.__version__}, PJRT plugin "
          f"{torchtpu._C.platform_name()} ({devices} devices), {os.cpu_count()} CPU cores, "
          f"{args.cpu_threads or 'default'} torch thread(s) per rank")
    argv = worker_argv(args)
    start = time.perf_counter()
    results = []
    for world in worlds:
        print(f"\n{world} rank{'s' if world > 1 else ''}:", flush=True)
        launched = time.perf_counter()
        results.append(launch(world, argv, args.timeout))
        print(f"  ({time.perf_counter() - launched:.1f} s)", flush=True)

    if not args.skip_allreduce:
        print_allreduce(results, sizes, args.iters)
    if not args.skip_ddp:
        print_ddp(results, args)
    for res in results:
        for error in res["errors"]:
            print(f"\n{res['world']} ranks FAILED: {error}")
    print(f"\ntotal wall time {time.perf_counter() - start:.1f} s")
    if args.plot:
        plot(args.plot, results, sizes, args)
    if any(res["errors"] for res in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
