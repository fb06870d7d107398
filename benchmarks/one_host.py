"""One host at the speed of its memory: gradsync's shared-buffer all-reduce against Gloo's and
against the machine's memory bound, as nccl-tests prints busbw against the line rate.

Usage: python benchmarks/one_host.py [--workers 2,4] [--launches 3] [--sizes 4KiB,1MiB,16MiB,64MiB,256MiB]
                                     [--no-mpi] [--out docs/results/one_host.json]

Each launch starts N local processes (one thread each). First they measure this machine's
memory rates all at once, as the collective will run: a copy (bytes copied per second, over
all ranks) and a sum of N rows into one (bytes read per second, over all ranks). Then, per
size, blocks of back-to-back calls alternate between Gloo's ``all_reduce`` and gradsync's
``all_reduce(algorithm=...)`` over shared memory ("auto", "one_shot", "sharded": the last two
run by reads of the peers' buffers); a block's time per call is the slowest rank's, and each
figure is the median of three blocks, in an order that turns, so that no one always
follows Gloo's (whose threads go on using a core for a while after its call). The bound of
an algorithm is the bytes all ranks must move through memory divided by those rates
(``gradsync.tools.memory_bound``, which ``gradsync bench`` uses for its shared-buffer rows).

With mpirun on the path, as many launches of ``gradsync bench --backend mpi`` give Open MPI's
Allreduce on the same host (its ``native`` row; Open MPI moves intra-host messages through
shared memory too), compared by medians across launches.

Printed and recorded: medians over launches of each time, its ratio to Gloo's (speed-up) and
to its bound.
"""

import argparse
import json
import shutil
import socket
import subprocess
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gradsync.tools.memory_bound import bound_s as bound, measure_rates
from gradsync.units import parse_size

ALGORITHMS = ("auto", "one_shot", "sharded")
def timed(fn, iters: int) -> float:
    """Seconds per call of ``fn``: ``iters`` calls back to back (as a training loop makes them,
    and as nccl-tests times), started together, the slowest rank's total over ``iters``. One
    call timed alone would also count how unevenly the ranks leave the barrier before it."""
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return dt.item()


def memory_rates(n: int) -> dict:
    """Bytes per second over all ranks at once (gradsync.tools.memory_bound, as bench measures them)."""
    def slowest(seconds):
        dt = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        return dt.item()
    return measure_rates(n, dist.barrier, slowest)


def body(rank, n, port, sizes, queue):
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, n, is_master=rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n)
    import gradsync
    from gradsync.runtime.reads import choose

    rates = memory_rates(n)
    out = {"rates": rates, "sizes": {}}
    for nbytes in sizes:
        x = torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(rank))
        want = x.clone()
        dist.all_reduce(want)
        row = {"chosen": choose(nbytes, n), "error": 0.0}
        calls = {"gloo": lambda t: dist.all_reduce(t)}
        for algorithm in ALGORITHMS:
            calls[algorithm] = lambda t, a=algorithm: gradsync.all_reduce(t, algorithm=a, transport="shm")
        for name, call in calls.items():
            t = x.clone()
            call(t)
            row["error"] = max(row["error"], float((t - want).abs().max() / want.abs().max()))
        iters = 200 if nbytes <= 64 << 10 else 30 if nbytes <= 1 << 20 else 6 if nbytes <= 64 << 20 else 3
        times = {name: [] for name in calls}
        work = x.clone()
        names = list(calls)
        for block in range(3):               # alternating blocks: drift in the machine's load hits all alike,
            for name in names[block:] + names[:block]:     # and each follows Gloo's (whose threads linger) once
                times[name].append(timed(lambda: calls[name](work), iters))
        row["time_s"] = {name: statistics.median(v) for name, v in times.items()}
        out["sizes"][nbytes] = row
    if rank == 0:
        queue.put(out)
    dist.barrier()


def launch(n: int, sizes: list[int]) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(body, args=(n, port, sizes, queue), nprocs=n, start_method="spawn")
    return queue.get()


def mpi_times(n: int, sizes: list[int]) -> dict[int, float]:
    """Open MPI's Allreduce time per size: one ``gradsync bench --backend mpi`` launch (its native row)."""
    out = subprocess.run([sys.executable, "-m", "gradsync", "bench", "--backend", "mpi", "--workers", str(n),
                          "--algorithms", "ring", "--sizes", ",".join(f"{b}B" for b in sizes), "--format", "json"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"gradsync bench --backend mpi failed: {out.stderr.strip()[-400:]}")
    return {r["bytes"]: r["time_s"] for r in json.loads(out.stdout) if r["algorithm"] == "native"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--sizes", default="4KiB,1MiB,16MiB,64MiB,256MiB")
    ap.add_argument("--no-mpi", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    mpi = not args.no_mpi and shutil.which("mpirun") is not None
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    results = {}
    for n in map(int, args.workers.split(",")):
        runs = [launch(n, sizes) for _ in range(args.launches)]
        mpi_runs = [mpi_times(n, sizes) for _ in range(args.launches)] if mpi else []
        rates = {k: statistics.median(r["rates"][k] for r in runs) for k in runs[0]["rates"]}
        print(f"N = {n}: memory, all ranks at once: copy {rates['copy_Bps'] / 1e9:.1f} GB/s, "
              f"sum {rates['sum_read_Bps'] / 1e9:.1f} GB/s read")
        rows = []
        for nbytes in sizes:
            med = {name: statistics.median(r["sizes"][nbytes]["time_s"][name] for r in runs)
                   for name in runs[0]["sizes"][nbytes]["time_s"]}
            speedups = {name: statistics.median(r["sizes"][nbytes]["time_s"]["gloo"] / r["sizes"][nbytes]["time_s"][name]
                                                for r in runs) for name in ALGORITHMS}
            chosen = runs[0]["sizes"][nbytes]["chosen"]
            b = bound(chosen, nbytes, n, rates)
            error = max(r["sizes"][nbytes]["error"] for r in runs)
            row = {"bytes": nbytes, "time_s": med, "speedup_over_gloo": speedups, "chosen": chosen,
                   "bound_s": b, "auto_over_bound": med["auto"] / b, "max_relative_error": error}
            line = (f"  {nbytes:>10} B  gloo {med['gloo'] * 1e3:9.3f} ms  auto ({chosen}) {med['auto'] * 1e3:9.3f} ms "
                    f"= {speedups['auto']:5.2f}x gloo, {med['auto'] / b:5.2f}x its bound ({b * 1e3:.3f} ms)  "
                    f"one_shot {med['one_shot'] * 1e3:9.3f} ms  sharded {med['sharded'] * 1e3:9.3f} ms  "
                    f"err {error:.1e}")
            if mpi_runs and all(nbytes in m for m in mpi_runs):
                row["mpi_allreduce_s"] = statistics.median(m[nbytes] for m in mpi_runs)
                row["speedup_over_mpi"] = row["mpi_allreduce_s"] / med["auto"]
                line += f"  MPI {row['mpi_allreduce_s'] * 1e3:.3f} ms ({row['speedup_over_mpi']:.2f}x)"
            rows.append(row)
            print(line, flush=True)
        results[n] = {"rates": rates, "rows": rows, "launches": args.launches}
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
