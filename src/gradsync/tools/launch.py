"""Start N local worker processes joined in a Gloo process group on 127.0.0.1: no set-up.

Across machines, run the same entry point under torchrun instead (see the README); this
module is the embedded default for one machine.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import queue as queue_module
import socket
import time
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp

from .. import algorithms
from ..errors import ConfigError, GradsyncError
from ..runtime import flight

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rendezvous_store(host: str, port: int, rank: int, workers: int, timeout: float) -> dist.TCPStore:
    """The group's TCPStore; rank 0 serves it on ``host`` only. (Given just a host and port,
    TCPStore's server listens on every interface; handed a socket bound to ``host``, it
    listens there.)"""
    wait = datetime.timedelta(seconds=timeout)
    if rank != 0:
        return dist.TCPStore(host, port, workers, is_master=False, timeout=wait)
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(128)
    port = listener.getsockname()[1]                  # port 0: the one the system chose
    return dist.TCPStore(host, port, workers, is_master=True, timeout=wait, wait_for_workers=False,
                         master_listen_fd=listener.detach())


def _entry(rank, workers, port, host, fn, args, results, timeout, network=None, external=()):
    if network is not None:                                  # a worker behind an emulated slow link
        from .links import enter
        enter(network.namespace_of(rank))
        os.environ["GLOO_SOCKET_IFNAME"] = network.interface
        # each namespace an emulated machine: its ranks share a host, the others do not
        os.environ["GRADSYNC_HOST"] = f"{socket.gethostname()}/{network.namespace_of(rank)}"
    elif host == LOOPBACK:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")    # listen on loopback only
    # workers per machine, as torchrun says it: what hierarchical algorithms group by
    os.environ["LOCAL_WORLD_SIZE"] = str(network.per_node if network is not None else workers)
    flight.watch_signal()                     # SIGUSR1 writes the flight record from the start (GRADSYNC_FLIGHT_DIR)
    try:
        algorithms.load_external(external)    # a spawned process sees only gradsync's own algorithms
        dist.init_process_group("gloo", store=rendezvous_store(host, port, rank, workers, timeout), rank=rank,
                                world_size=workers, timeout=datetime.timedelta(seconds=timeout))
        results.put((rank, "ok", fn(rank, workers, *args)))
    except BaseException as exc:  # report every failure to the parent, then exit
        detail = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, GradsyncError):
            detail += "\n" + traceback.format_exc(limit=6)
        results.put((rank, "error", detail))
    finally:
        if dist.is_initialized():
            _check_out(rank, workers)
            dist.destroy_process_group()


def _check_out(rank: int, workers: int, grace: float = 3.0) -> None:
    """Rank 0's process hosts the rendezvous store, where failures are posted: it stays until
    every other rank has checked out (or ``grace`` seconds), so survivors can still read it."""
    try:
        store = dist.distributed_c10d._get_default_store()
        left = store.add("gradsync/checked_out", 1)
        if rank == 0:
            deadline = time.monotonic() + grace
            while left < workers and time.monotonic() < deadline:
                time.sleep(0.05)
                left = store.add("gradsync/checked_out", 0)
    except Exception:
        pass


@contextlib.contextmanager
def _one_openmp_thread():
    """Children start with OMP_NUM_THREADS=1 unless the user set it, as torchrun does: N
    processes each with an OpenMP pool the size of the machine oversubscribe its cores. It
    has to be in their environment before torch loads (set inside the worker, as it was, torch
    still ran 2 threads here)."""
    preset = "OMP_NUM_THREADS" in os.environ
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        yield
    finally:
        if not preset:
            del os.environ["OMP_NUM_THREADS"]


# rank, world size and ranks per machine, as each launcher names them
LAUNCHERS = {"torchrun": ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"),
             "mpirun": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
             "srun": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE")}


def launched() -> dict | None:
    """This process's place in a job started by torchrun, mpirun or srun: {launcher, rank,
    world, local}; None when no launcher started it (then gradsync starts local workers).
    mpirun and srun give no rendezvous address: they need MASTER_ADDR and MASTER_PORT set.

    >>> launched() is None or launched()["launcher"] in LAUNCHERS
    True
    """
    for name, (rank, world, local) in LAUNCHERS.items():
        if rank in os.environ and world in os.environ:
            if name != "torchrun" and not ("MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ):
                raise ConfigError(f"started by {name}: set MASTER_ADDR and MASTER_PORT to rank 0's address and a "
                                  f"free port, so the ranks can meet")
            value = os.environ.get(local, "").split("(")[0]          # srun writes e.g. 2(x3)
            return {"launcher": name, "rank": int(os.environ[rank]), "world": int(os.environ[world]),
                    "local": int(value) if value.isdigit() else int(os.environ[world])}
    return None


def as_launched(fn, *args, timeout: float = 300.0):
    """Run ``fn(rank, world, *args)`` as this process's rank of the job its launcher started
    (Gloo, env:// rendezvous); return (its result, rank, world). Example: under
    ``torchrun --nnodes 2 --nproc-per-node 2 ...``, ``as_launched(body)`` runs rank 0..3 of one group."""
    job = launched()
    if job is None:
        raise ConfigError("as_launched needs a launcher (torchrun, mpirun or srun); none started this process")
    os.environ.setdefault("RANK", str(job["rank"]))
    os.environ.setdefault("WORLD_SIZE", str(job["world"]))
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(job["local"]))
    flight.watch_signal()
    dist.init_process_group("gloo", init_method="env://", rank=job["rank"], world_size=job["world"],
                            timeout=datetime.timedelta(seconds=timeout))
    try:
        return fn(job["rank"], job["world"], *args), job["rank"], job["world"]
    finally:
        dist.destroy_process_group()


def run(fn, workers: int, *args, host: str = LOOPBACK, timeout: float = 300.0, tolerate: bool = False,
        network=None) -> list:
    """Run ``fn(rank, workers, *args)`` in ``workers`` new processes; return their results by rank.

    ``fn`` must be importable (defined at module level). A worker that raises or dies makes
    this raise ``GradsyncError`` naming it, unless ``tolerate``: then its slot holds the error.
    ``network``: a ``links.SlowLinks`` whose namespaces the workers join (slow-link emulation).

    Example::

        def body(rank, workers):
            t = torch.full((4,), float(rank))
            gradsync.all_reduce(t)
            return t.tolist()

        run(body, 3)   # [[3.0, 3.0, 3.0, 3.0]] * 3
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 256:
        raise ConfigError(f"workers must be an integer in 1..256, got {workers!r}")
    if network is not None and network.workers != workers:
        raise ConfigError(f"the slow-link network is for {network.workers} workers, not {workers}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    if network is not None:
        host, port = network.addresses[0], network.port      # rank 0's address, in fresh namespaces
    else:
        port = free_port(host)
    procs = [ctx.Process(target=_entry, args=(r, workers, port, host, fn, args, results, timeout, network,
                                              algorithms.external()), daemon=True) for r in range(workers)]
    with _one_openmp_thread():
        for p in procs:
            p.start()
    try:
        out, errors = _collect(procs, results, timeout)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if errors and not tolerate:
        lines = "; ".join(f"rank {r}: {msg.splitlines()[0]}" for r, msg in sorted(errors.items()))
        raise GradsyncError(f"{len(errors)} of {workers} workers failed: {lines}")
    for r, msg in errors.items():
        out[r] = GradsyncError(f"rank {r}: {msg}")
    return out


def _collect(procs: list, results, timeout: float) -> tuple[list, dict[int, str]]:
    """The workers' results by rank as they report them, and the errors of those that failed,
    died without a word, or said nothing within ``timeout`` + 30 s."""
    workers = len(procs)
    out, errors, done = [None] * workers, {}, set()
    deadline = time.monotonic() + timeout + 30
    while len(done) < workers and time.monotonic() < deadline:
        try:
            rank, status, value = results.get(timeout=0.2)
        except queue_module.Empty:
            for r, p in enumerate(procs):   # a process gone without a word has died
                if r not in done and not p.is_alive() and results.empty():
                    time.sleep(0.2)
                    if results.empty():
                        errors[r] = f"died with exit code {p.exitcode} before reporting"
                        done.add(r)
            continue
        done.add(rank)
        if status == "ok":
            out[rank] = value
        else:
            errors[rank] = value
    for r in range(workers):
        if r not in done:
            errors[r] = "no result before the timeout (the process hung)"
    return out, errors
