"""``gradsync bench``: all-reduce timings between local processes, like nccl-tests.

Every algorithm runs on the same inputs as the engine's own all-reduce (the ``native`` row),
in the same processes, one size at a time. Worker r holds (r + 1) * base, so each rank checks
its result against the float64 sum of exactly those inputs.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist

from .. import dtypes
from ..errors import ConfigError
from .progress_bar import bar as progress_bar
from .report import bus_bandwidth
from ..runtime.api import all_reduce

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
    ``shared_rows``: beside rows over Gloo, where ranks share a host, the ring over shared
    memory too (one host) or the hierarchical all-reduce over the mixed transport (several)."""

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
        return [("ring", "shm")] if kind == "shm" else [("hierarchical", "mixed")] if kind == "mixed" else []

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
    the native row)."""
    torch.set_num_threads(1)
    engine = engine or TorchEngine()
    tracer = None
    if trace:
        from ..runtime.tracing import Trace
        tracer = Trace()
    transport = engine.transport_used()
    extra = engine.extra_rows()
    dtype, itemsize = _bench_dtype(dtype_name), dtypes.itemsize(dtype_name)
    rows, total = [], len(sizes) * (len(names) + 1 + len(extra))
    bar = progress_bar(total, "bench") if progress and rank == 0 else None
    for nbytes in sizes:
        elements = nbytes // itemsize
        mine, reference = _inputs(rank, workers, elements, dtype)
        # a row's key: its algorithm, or "algorithm@transport" for a row beside the chosen transport
        names_here = [NATIVE] + list(names) + [f"{a}@{t}" for a, t in extra]
        bufs = {name: mine.clone() for name in names_here}
        calls = {name: engine.native(bufs[name]) if name == NATIVE else
                 engine.ours(name.partition("@")[0], bufs[name], timeout,
                             {**options.get(name, {}), **({"trace": tracer} if tracer else {})},
                             name.partition("@")[2] or None)
                 for name in names_here}
        times = time_in_blocks(calls, iters or default_iters(nbytes), engine.barrier,
                               before=lambda name: bufs[name].copy_(mine))
        scale = reference.abs().max().item() or 1.0
        for name in names_here:
            error = (bufs[name].double() - reference).abs().max().item() / scale if elements else 0.0
            stats = engine.max(torch.tensor([statistics.median(times[name]), error], dtype=torch.float64))
            t = stats[0].item()
            algbw = nbytes / t if t > 0 else 0.0
            algorithm, _, beside = name.partition("@")
            rows.append({"algorithm": algorithm, "bytes": elements * itemsize, "count": elements, "dtype": dtype_name,
                         "time_s": t, "algbw_GBps": algbw / 1e9,
                         "busbw_GBps": bus_bandwidth(nbytes, t, workers) / 1e9, "max_error": stats[1].item(),
                         "workers": workers, "transport": "native" if name == NATIVE else beside or transport})
            if bar:
                bar(f"{name} {nbytes} B")
    if bar:
        bar(None)
    if tracer is not None:
        return {"rows": rows if rank == 0 else None, "trace": tracer.to_dict()}
    return rows if rank == 0 else None


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
