"""``gradsync bench``: all-reduce timings between local processes, like nccl-tests.

Every algorithm runs on the same inputs as the engine's own all-reduce (the ``native`` row),
in the same processes, one size at a time. Worker r holds (r + 1) * base, so each rank checks
its result against the float64 sum of exactly those inputs.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist

from .. import dtypes
from ..errors import ConfigError
from ..units import format_size
from . import memory_bound
from .launch import doing
from .progress_bar import bar as progress_bar
from .report import bus_bandwidth
from ..runtime import flight
from ..runtime.api import all_reduce
from ..runtime.reads import choose

NATIVE = "native"
BLOCK = 5          # timed calls in a row per algorithm
DTYPES = ("float32", "float64", "bfloat16", "int32")   # the dtypes bench times, names of gradsync.dtypes


def _bench_dtype(name: str) -> torch.dtype:
    """The torch dtype of one of ``DTYPES``: ``_bench_dtype("int32")`` is ``torch.int32``."""
    if name not in DTYPES:
        raise ConfigError(f"bench times {', '.join(DTYPES)} tensors, got {name!r}")
    return dtypes.torch_dtype(name)


def default_iters(nbytes: int) -> int:
    return 20 if nbytes <= 1 << 20 else 10 if nbytes <= 16 << 20 else 5


# What bench's workers hold, for the estimate made before anything starts (``estimate``).
BASELINE_BYTES = 320 << 20      # a worker with torch and its process group loaded: 293 MB measured here
POOL_IDLE_BYTES = 1 << 30       # the scratch pool keeps up to this much of earlier rows' scratch
# scratch per algorithm at N workers, as a multiple of the tensor (docs/architecture.md's table,
# the largest rank); an algorithm not named here is taken at N - 1, the most any takes
SCRATCH = {"central": lambda n: n - 1, "host": lambda n: n, "sharded": lambda n: (n - 1) / n,
           "ring": lambda n: min(0.5, 2 / n), "tree": lambda n: 0.5, "halving_doubling": lambda n: 0.75,
           "cerar": lambda n: 7.0, "hierarchical": lambda n: 1.0, "auto": lambda n: 1.0}
LOOPBACK_BPS = 1.5e9            # Gloo's all-reduce over loopback, 2 ranks, 16 MB: 1.6 GB/s algbw measured
START_S, START_PER_WORKER_S = 4.0, 1.5     # the command's imports, then each worker's (2 cores)
INPUT_PASSES, MEMORY_BPS = 8, 1e9          # the reference: about 8 passes over float64 copies per rank


def estimate(sizes, workers: int, names, dtype_name: str = "float32", rows_beside: int = 0,
             iters=None, cores: int | None = None) -> dict:
    """What a bench run will take, before it starts: each worker's peak memory at the largest
    size (``per_worker_bytes``), all workers' (``total_bytes``), and a rough wall time
    (``seconds``: loopback at about 1.5 GB/s shared by the cores). The memory: per row a copy
    of the tensor (the native row's included, plus one the engine keeps), the input, the exact
    reference and two temporaries in float64, the algorithms' scratch (``SCRATCH``), and a
    loaded worker (``BASELINE_BYTES``). ``rows_beside``: rows added beside the chosen ones.

    >>> e = estimate([64 << 20], 2, ["ring"])
    >>> round(e["per_worker_bytes"] / 2**20), e["total_bytes"] == 2 * e["per_worker_bytes"]
    (1120, True)
    """
    import os

    cores = cores or os.cpu_count() or 1
    names = list(names)
    copies = len(names) + rows_beside + 3                   # the rows, native's, the input, the engine's
    factors = [SCRATCH.get(a, lambda n: n - 1)(workers) for a in names] or [0.0]
    float64 = 8 / dtypes.itemsize(dtype_name)

    def per_worker(nbytes: int) -> float:
        scratch = min(sum(factors) * nbytes, max(factors) * nbytes + POOL_IDLE_BYTES)
        return BASELINE_BYTES + nbytes * (copies + 4 * float64) + scratch

    crowding = max(1.0, workers / cores)
    seconds = START_S + START_PER_WORKER_S * workers * crowding
    for nbytes in sizes:
        call = 1e-3 * workers + 2 * (workers - 1) / workers * nbytes / LOOPBACK_BPS * crowding
        inputs = workers * nbytes * float64 * INPUT_PASSES / MEMORY_BPS * crowding   # the exact reference
        seconds += inputs + (len(names) + rows_beside + 1) * (iters or default_iters(nbytes)) * (1 + 1 / BLOCK) * call
    top = max(sizes)
    if rows_beside:                      # the shared-buffer row's bound: its workers measure memory rates first
        measuring = BASELINE_BYTES + memory_bound.rates_bytes(workers)
        per_worker = (lambda f: lambda nbytes: max(f(nbytes), measuring))(per_worker)
    return {"per_worker_bytes": int(per_worker(top)), "total_bytes": int(workers * per_worker(top)),
            "seconds": seconds, "largest": top, "per_byte": (per_worker(top) - BASELINE_BYTES) / top}


def available_memory() -> int:
    """Bytes this process may still use: the kernel's MemAvailable, or less under a cgroup limit
    (``available_memory() > 0``)."""
    avail = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    for path, used in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                       ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(path) as fh, open(used) as gh:
                limit, current = fh.read().strip(), int(gh.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:
            room = int(limit) - current
            avail = room if avail is None else min(avail, room)
    return avail if avail is not None else 1 << 62


def conclusions(rows: list[dict]) -> list[str]:
    """Per size, which row was fastest and by how much against the engine's own all-reduce
    (the native row), in one sentence each.

    >>> conclusions([{"bytes": 4000, "algorithm": "native", "transport": "native", "time_s": 2e-3},
    ...              {"bytes": 4000, "algorithm": "tree", "transport": "gloo", "time_s": 1e-3}])
    ["4 KB: tree (gloo) was fastest, 2.00x faster than the engine's own all-reduce (1 ms against 2 ms)."]
    """
    from ..units import format_time

    out = []
    for nbytes in dict.fromkeys(r["bytes"] for r in rows):
        here = [r for r in rows if r["bytes"] == nbytes and r["time_s"] > 0]
        native = next((r for r in here if r["algorithm"] == NATIVE), None)
        ours = [r for r in here if r["algorithm"] != NATIVE]
        if not ours:
            continue
        best = min(ours, key=lambda r: r["time_s"])
        name = f"{best['algorithm']} ({best['transport']})"
        if native is None:
            out.append(f"{format_size(nbytes)}: {name} was fastest ({format_time(best['time_s'])}).")
        elif best["time_s"] <= native["time_s"]:
            out.append(f"{format_size(nbytes)}: {name} was fastest, {native['time_s'] / best['time_s']:.2f}x faster "
                       f"than the engine's own all-reduce ({format_time(best['time_s'])} against "
                       f"{format_time(native['time_s'])}).")
        else:
            out.append(f"{format_size(nbytes)}: the engine's own all-reduce was fastest "
                       f"({format_time(native['time_s'])}); the best of gradsync's, {name}, took "
                       f"{best['time_s'] / native['time_s']:.2f}x as long ({format_time(best['time_s'])}).")
    return out


def _inputs(rank: int, workers: int, elements: int, dtype: torch.dtype):
    base = torch.randn(elements, generator=torch.Generator().manual_seed(12345), dtype=torch.float64)
    if not dtype.is_floating_point:
        base = (base * 1000).round()
    mine = (base * (rank + 1)).to(dtype)
    reference = torch.zeros(elements, dtype=torch.float64)
    for r in range(workers):
        reference += (base * (r + 1)).to(dtype).double()
    return mine, reference


def time_in_blocks(calls: dict, total: int, barrier, before=None) -> dict:
    """Seconds per call of each of ``calls`` (name -> callable), ``total`` timed calls each.

    Blocks of BLOCK back-to-back calls, the callables taking turns block by block: each runs
    in its steady state, as in a training loop, while the machine's slow and fast moments
    (2 shared cores) still fall on all of them alike. Calling them in turn one call at a time,
    as before, measured each just after a barrier and another engine's collective, a state
    in which the same ring all-reduce took 1-3.5 ms instead of 0.4-0.8 ms (4 KB, N = 2). The
    first call of each block is not timed; ``before(name)`` runs, untimed, before every call.

    >>> t = time_in_blocks({"a": lambda: None}, 7, barrier=lambda: None)
    >>> len(t["a"])
    7
    """
    times = {name: [] for name in calls}
    for block in range(-(-total // BLOCK)):
        for name, fn in calls.items():
            barrier()
            for call in range(1 + min(BLOCK, total - block * BLOCK)):
                if before is not None:
                    before(name)
                start = time.perf_counter()
                fn()
                if call:
                    times[name].append(time.perf_counter() - start)
    return times


class TorchEngine:
    """The torch.distributed engine: Gloo's own all-reduce is the native row; gradsync's rows
    run over ``transport`` ("gloo", "shm" or "auto", as ``gradsync.all_reduce`` takes).
    ``shared_rows``: beside rows over Gloo, where ranks share a host, the shared-buffer
    all-reduce too ("auto" over shared memory: one-shot or two-shot by direct reads, one host)
    or the hierarchical all-reduce over the mixed transport (several)."""

    def __init__(self, transport: str = "gloo", shared_rows: bool = False):
        self.transport = transport
        self.shared_rows = shared_rows

    def extra_rows(self) -> list[tuple[str, str]]:
        """(algorithm, transport) rows beside the chosen ones (every rank together)."""
        if not self.shared_rows or self.transport != "gloo":
            return []
        from ..runtime.transport.hosts import host_map
        from ..runtime.transport import auto_kind

        kind = auto_kind(host_map())
        # one host: "auto" over shared memory is the shared-buffer all-reduce (one-shot or two-shot by reads)
        return [("auto", "shm")] if kind == "shm" else [("hierarchical", "mixed")] if kind == "mixed" else []

    def transport_used(self) -> str:
        """What gradsync's rows run over: "auto" resolved (every rank together)."""
        from ..runtime.transport import MixedTransport, ShmTransport, for_group

        if self.transport != "auto":
            return self.transport
        chosen = for_group("auto")
        return "shm" if isinstance(chosen, ShmTransport) else "mixed" if isinstance(chosen, MixedTransport) else "gloo"

    def barrier(self):
        dist.barrier()

    def max(self, values: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        return values

    def native(self, buf):
        return lambda: dist.all_reduce(buf)

    def ours(self, name, buf, timeout, opts, transport=None):
        transport = {"mixed": "auto"}.get(transport, transport) or self.transport
        return lambda: all_reduce(buf, algorithm=name, timeout=timeout, transport=transport, **opts)


class MpiEngine:
    """The MPI engine: MPI's own Allreduce is the native row."""

    def __init__(self):
        from mpi4py import MPI
        self.MPI, self.comm = MPI, MPI.COMM_WORLD

    def transport_used(self) -> str:
        return "mpi"

    def extra_rows(self) -> list[tuple[str, str]]:
        return []

    def barrier(self):
        self.comm.Barrier()

    def max(self, values):
        out = values.clone()
        self.comm.Allreduce(values.numpy(), out.numpy(), op=self.MPI.MAX)
        return out

    def native(self, buf):
        array = buf.numpy()
        return lambda: self.comm.Allreduce(self.MPI.IN_PLACE, array, op=self.MPI.SUM)

    def ours(self, name, buf, timeout, opts, transport=None):
        from ..integrations.mpi import all_reduce as mpi_all_reduce
        return lambda: mpi_all_reduce(buf, algorithm=name, comm=self.comm, timeout=timeout, **opts)


def worker(rank: int, workers: int, sizes, names, iters, dtype_name, timeout, options, progress,
           engine=None, trace: bool = False):
    """One rank's part of the benchmark; rank 0 returns the rows. With ``trace``, every rank
    returns ``{"rows": rows, "trace": its Chrome trace}`` (gradsync's collectives traced, not
    the native row). Each row also carries ``peak_rss_bytes``: the largest worker's resident
    high-water mark so far. With GRADSYNC_FLIGHT_DIR set, every rank writes its flight record
    at the end of a healthy run too, so that ``gradsync doctor`` has the run to read."""
    torch.set_num_threads(1)
    engine = engine or TorchEngine()
    tracer = None
    if trace:
        from ..runtime.tracing import Trace
        tracer = Trace()
    extra = engine.extra_rows()
    # a row's key: its algorithm, or "algorithm@transport" for a row beside the chosen transport
    names_here = [NATIVE] + list(names) + [f"{a}@{t}" for a, t in extra]
    bar = progress_bar(len(sizes) * len(names_here), "bench") if progress and rank == 0 else None
    rows, transport = [], engine.transport_used()
    rates = None
    if any(_bound_algorithm(name, transport, 1, workers) for name in names_here):
        doing("measuring this machine's memory rates, for the shared-buffer rows' bound")
        rates = memory_bound.measure_rates(workers, engine.barrier,
                                           lambda s: engine.max(torch.tensor([s], dtype=torch.float64)).item())
    for nbytes in sizes:
        rows += _one_size(rank, workers, nbytes, names_here, iters, dtype_name, timeout, options, engine,
                          tracer, transport, bar)
        for row, name in zip(rows[-len(names_here):], names_here):
            chosen = rates and _bound_algorithm(name, transport, row["bytes"], workers)
            if chosen and row["time_s"] > 0:
                row["bound_s"] = memory_bound.bound_s(chosen, row["bytes"], workers, rates)
                row["bound_algorithm"] = chosen
                row["over_bound"] = row["time_s"] / row["bound_s"]
                row["memory_rates_Bps"] = rates
    if bar:
        bar(None)
    doing("writing the flight record at the end of the run")
    flight.RECORDER.dump("completion")      # only where GRADSYNC_FLIGHT_DIR is set
    doing("shutting down")
    if tracer is not None:
        return {"rows": rows if rank == 0 else None, "trace": tracer.to_dict()}
    return rows if rank == 0 else None


def _one_size(rank, workers, nbytes, names_here, iters, dtype_name, timeout, options, engine, tracer,
              transport, bar) -> list[dict]:
    """Every row of one size: each rank times every row, then the ranks' slowest time, largest
    error and largest peak memory are gathered (the engine's all-reduce)."""
    dtype, itemsize = _bench_dtype(dtype_name), dtypes.itemsize(dtype_name)
    elements = nbytes // itemsize
    mine, reference = _inputs(rank, workers, elements, dtype)
    bufs = {name: mine.clone() for name in names_here}
    calls = {name: engine.native(bufs[name]) if name == NATIVE else
             engine.ours(name.partition("@")[0], bufs[name], timeout,
                         {**options.get(name, {}), **({"trace": tracer} if tracer else {})},
                         name.partition("@")[2] or None)
             for name in names_here}
    size = format_size(nbytes)

    def before(name):
        doing(f"timing {_row_label(name)} at {size}")
        bufs[name].copy_(mine)

    def barrier():
        doing(f"waiting at the engine's barrier between rows at {size}")
        engine.barrier()

    times = time_in_blocks(calls, iters or default_iters(nbytes), barrier, before=before)
    doing(f"gathering every rank's times and errors at {size} (the engine's all-reduce)")
    scale = reference.abs().max().item() or 1.0
    rows = []
    for name in names_here:
        error = (bufs[name].double() - reference).abs().max().item() / scale if elements else 0.0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024       # KiB on Linux
        stats = engine.max(torch.tensor([statistics.median(times[name]), error, rss], dtype=torch.float64))
        t = stats[0].item()
        algbw = nbytes / t if t > 0 else 0.0
        algorithm, _, beside = name.partition("@")
        rows.append({"algorithm": algorithm, "bytes": elements * itemsize, "count": elements, "dtype": dtype_name,
                     "time_s": t, "algbw_GBps": algbw / 1e9,
                     "busbw_GBps": bus_bandwidth(nbytes, t, workers) / 1e9, "max_error": stats[1].item(),
                     "workers": workers, "transport": "native" if name == NATIVE else beside or transport,
                     "peak_rss_bytes": int(stats[2].item())})
        if bar:
            bar(f"{name} {size}")
    return rows


def _bound_algorithm(name: str, transport: str, nbytes: int, workers: int) -> str | None:
    """The shared-buffer all-reduce row ``name`` runs at ``nbytes`` (the one a memory bound is
    known for), or None: ``_bound_algorithm("auto@shm", "gloo", 4096, 4) == "one_shot"``."""
    algorithm, _, beside = name.partition("@")
    if (beside or transport) != "shm" or algorithm not in ("auto", *memory_bound.ALGORITHMS):
        return None
    return choose(nbytes, workers) if algorithm == "auto" else algorithm


def _row_label(name: str) -> str:
    """A row in words: ``_row_label("native")`` is "the engine's own all-reduce (the native row)"."""
    if name == NATIVE:
        return "the engine's own all-reduce (the native row)"
    algorithm, _, transport = name.partition("@")
    return f"{algorithm}" + (f" over {transport}" if transport else "")


def mpi_main(argv=None) -> None:
    """Entry point under mpirun: ``mpirun -np N python -m gradsync.tools.bench '<json args>'``;
    rank 0 prints the rows as JSON on stdout."""
    import json

    from .. import algorithms

    args = json.loads((argv or sys.argv)[1])
    algorithms.load_external(args.get("external", ()))     # algorithms the parent registered
    engine = MpiEngine()
    rows = worker(engine.comm.Get_rank(), engine.comm.Get_size(), args["sizes"], args["names"], args["iters"],
                  args["dtype"], args["timeout"], args["options"], False, engine=engine)
    if rows is not None:
        print(json.dumps(rows))


if __name__ == "__main__":
    mpi_main()
