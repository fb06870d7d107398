"""One launch of ``benchmarks/peers.py``: what each of the N ranks runs under mpirun.

peers.py starts it, once per launch, as
``mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader -np N
python benchmarks/peers_rank.py --sizes ... --out launch.json``; and, before any launch, as
``python benchmarks/peers_rank.py --build-deepspeed``, which compiles DeepSpeed's CPU
shared-memory all-reduce with DeepSpeed's own op builder and prints the library's path.

MPI is initialized by mpirun (mpi4py); torch.distributed is set up from MPI's rank and size
(MASTER_ADDR=127.0.0.1, a free port that rank 0 picks and broadcasts over MPI). Then, at each
size, the systems take turns call by call, on the same tensor:

- ``gloo``: ``torch.distributed.all_reduce`` on the Gloo world group;
- ``mpi``: ``comm.Allreduce(MPI.IN_PLACE, view)``, ``view`` the tensor's numpy view;
- ``deepspeed``: ``torch.ops.deepspeed.inference_all_reduce_``, DeepSpeed's op loaded from
  the library built before the launch and initialized as DeepSpeed does (``LOCAL_SIZE``,
  ``MASTER_ADDR``, ``MASTER_PORT``, then ``initialize(size, rank)``);
- ``gradsync``: ``gradsync.all_reduce(t, algorithm="auto")``, the front door;
- ``backend``: ``torch.distributed.all_reduce`` on a ``new_group(backend="gradsync")``
  (its all_reduce under ``auto``, the backend's default).

Every call starts after an MPI barrier, from a fresh copy of this rank's input; its result is
compared, element for element, with a float64 sum of every rank's input (the inputs are small
whole numbers, so every order of summation gives that sum exactly in float32). A wrong
result or a failed call ends the whole launch at once (``MPI_Abort``), naming the system, the
size, the rank and the first wrong element. Rank 0 writes, per size and system, the median
over calls of the slowest rank's seconds per call.
"""

import argparse
import faulthandler
import importlib.util
import json
import os
import socket
import statistics
import sys
import time
import traceback
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from peers import LABELS, SYSTEMS

ADDRESS = "127.0.0.1"


def build_deepspeed_op() -> str:
    """Compile DeepSpeed's CPU shared-memory all-reduce (csrc/cpu/comm/shm.cpp and
    shm_interface.cpp, no oneCCL) with its ``ShareMemCommBuilder``, gcc and ninja, into torch's
    extension cache (``TORCH_EXTENSIONS_DIR``), or find it there; return the library's path."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder
    return ShareMemCommBuilder().load(verbose=False).__file__


def deepspeed_segment(rank: int, port: int) -> str:
    """The /dev/shm file DeepSpeed's ``shm_initialize`` creates for ``rank`` (its name in shm.cpp)."""
    return f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{ADDRESS}_{port}_{rank}"


def load_deepspeed_op(path: str, comm, port: int):
    """DeepSpeed's in-place all-reduce, initialized for this world; its segments unlinked once
    every rank has mapped every one (they live on in the mappings, and nothing stays in
    /dev/shm however the launch ends)."""
    os.environ.update(LOCAL_SIZE=str(comm.size), MASTER_ADDR=ADDRESS, MASTER_PORT=str(port))
    spec = importlib.util.spec_from_file_location("deepspeed_shm_comm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.initialize(comm.size, comm.rank)    # maps every rank's workspace (spins until each exists)
    comm.Barrier()
    segment = deepspeed_segment(comm.rank, port)
    if os.path.exists(segment):
        os.unlink(segment)
    else:
        print(f"peers: DeepSpeed's segment {segment} not found to unlink (another naming?)", file=sys.stderr)
    return torch.ops.deepspeed.inference_all_reduce_


def free_port() -> int:
    with socket.socket() as s:
        s.bind((ADDRESS, 0))
        return s.getsockname()[1]


def setup(comm, args) -> dict:
    """torch.distributed from MPI's rank and size; the systems asked for, as functions of the tensor."""
    port = comm.bcast(free_port() if comm.rank == 0 else None, root=0)
    os.environ.update(MASTER_ADDR=ADDRESS, MASTER_PORT=str(port))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    timeout = timedelta(seconds=args.timeout)
    dist.init_process_group("gloo", rank=comm.rank, world_size=comm.size, timeout=timeout)
    import gradsync                                   # registers the "gradsync" backend
    from mpi4py import MPI
    backend_group = dist.new_group(backend="gradsync", timeout=timeout) if "backend" in args.systems else None
    ds = load_deepspeed_op(args.deepspeed, comm, port) if "deepspeed" in args.systems else None
    makers = {
        "gloo": lambda t: lambda: dist.all_reduce(t),
        "mpi": lambda t: (lambda view: lambda: comm.Allreduce(MPI.IN_PLACE, view))(t.numpy()),
        "deepspeed": lambda t: lambda: ds(t),
        "gradsync": lambda t: lambda: gradsync.all_reduce(t, algorithm="auto"),
        "backend": lambda t: lambda: dist.all_reduce(t, group=backend_group),
    }
    return {name: makers[name] for name in args.systems}


def pattern(rank: int, numel: int, variant: int) -> torch.Tensor:
    """Rank ``rank``'s input: whole numbers in [-64, 64], different per rank, element and
    variant (two variants alternate, so a result left over from the call before is wrong)."""
    i = torch.arange(numel, dtype=torch.int64)
    return ((i * 7919 + rank * 104729 + variant * 15485863) % 129 - 64).to(torch.float32)


def reference(world: int, numel: int, variant: int) -> torch.Tensor:
    """The sum of every rank's input, added in float64 (exact in float32 too: |sum| <= 64 N)."""
    total = np.zeros(numel, dtype=np.float64)
    for rank in range(world):
        total += pattern(rank, numel, variant).numpy()
    return torch.from_numpy(total.astype(np.float32))


def fail(comm, message: str, code: int):
    """End every rank of the launch now, with one line saying why (a wrong sum must not pass,
    and a rank that stops calling must not leave the others waiting until the timeout)."""
    print(f"peers: {message}", file=sys.stderr, flush=True)
    comm.Abort(code)


def call_checked(comm, name: str, call, out: torch.Tensor, want: torch.Tensor, where: str) -> float:
    """Seconds one call of ``name`` took on this rank, after the barrier; its result checked."""
    comm.Barrier()
    start = time.perf_counter()
    try:
        call()
    except Exception as e:  # noqa: BLE001 (any failure ends the launch, named)
        traceback.print_exc()
        fail(comm, f"{LABELS[name]} failed at {where}, rank {comm.rank}: {type(e).__name__}: {e}", 4)
    elapsed = time.perf_counter() - start
    if not torch.equal(out, want):
        j = int((out != want).nonzero()[0])
        fail(comm, f"WRONG RESULT from {LABELS[name]} at {where}, rank {comm.rank}, element {j}: "
                   f"{out[j].item()} where the float64 sum of the inputs is {want[j].item()}", 3)
    return elapsed


def time_size(comm, makers: dict, size: int, calls: int, warmup: int):
    """Per system, this rank's seconds per timed call (calls x systems); the systems take
    turns call by call, the first of each turn rotating, so that none always follows another."""
    numel = size // 4
    inputs = [pattern(comm.rank, numel, v) for v in (0, 1)]
    wanted = [reference(comm.size, numel, v) for v in (0, 1)]
    tensor = torch.empty(numel)
    names = list(makers)
    run = {name: makers[name](tensor) for name in names}
    times = np.zeros((calls, len(names)))
    where = f"N = {comm.size}, {size} bytes"
    for i in range(warmup + calls):
        for k in (np.arange(len(names)) + i) % len(names):
            tensor.copy_(inputs[i % 2])
            elapsed = call_checked(comm, names[k], run[names[k]], tensor, wanted[i % 2], where)
            if i >= warmup:
                times[i - warmup, k] = elapsed
    return names, times


def calls_for(size: int, calls: int) -> int:
    """``calls``, or by default 200 calls up to 4 MiB and fewer above (16 at 64 MiB)."""
    return calls if calls else max(10, min(200, 2**30 // size))


def measure(comm, makers: dict, args) -> list[dict]:
    """Per size: the median over calls of the slowest rank's time per call, per system (rank 0)."""
    from mpi4py import MPI
    rows = []
    for size in args.sizes:
        names, times = time_size(comm, makers, size, calls_for(size, args.calls), args.warmup)
        slowest = np.empty_like(times) if comm.rank == 0 else None
        comm.Reduce(times, slowest, op=MPI.MAX, root=0)
        if comm.rank == 0:
            rows.append({"bytes": size, "calls": len(times),
                         "median_s": {n: statistics.median(slowest[:, k]) for k, n in enumerate(names)}})
    return rows


def versions(comm) -> dict:
    from importlib import metadata
    from mpi4py import MPI
    out = {"torch": torch.__version__, "mpi4py": metadata.version("mpi4py"),
           "mpi": MPI.Get_library_version().splitlines()[0].strip(" \0"), "gradsync": metadata.version("gradsync")}
    try:
        out["deepspeed"] = metadata.version("deepspeed")
    except metadata.PackageNotFoundError:
        pass
    return out


def parse(argv=None):
    ap = argparse.ArgumentParser(description="one launch of benchmarks/peers.py (run by it, under mpirun)")
    ap.add_argument("--build-deepspeed", action="store_true", help="build DeepSpeed's op; print its path")
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[4096])
    ap.add_argument("--systems", type=lambda s: s.split(","), default=list(SYSTEMS))
    ap.add_argument("--deepspeed", default="", help="path of DeepSpeed's built op")
    ap.add_argument("--calls", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--out", default="")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    if args.build_deepspeed:
        print(build_deepspeed_op())
        return
    # A rank stuck in any system (a spin wait whose peer is gone) prints where and ends the launch.
    faulthandler.dump_traceback_later(args.timeout, exit=True)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    try:
        makers = setup(comm, args)
    except Exception as e:  # noqa: BLE001 (the other ranks would wait for this one until the timeout)
        traceback.print_exc()
        fail(comm, f"set-up failed on rank {comm.rank}: {type(e).__name__}: {e}", 5)
    rows = measure(comm, makers, args)
    if comm.rank == 0:
        result = {"workers": comm.size, "threads_per_rank": torch.get_num_threads(),
                  "systems": list(makers), "versions": versions(comm), "sizes": rows}
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    comm.Barrier()
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
