"""Start N local worker processes joined in a Gloo process group on 127.0.0.1: no set-up.

Across machines, run the same entry point under torchrun instead (see the README); this
module is the embedded default for one machine.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import shutil
import signal
import socket
import sys
import tempfile
import time

import torch.distributed as dist
import torch.multiprocessing as mp

from .. import algorithms
from ..errors import ConfigError, GradsyncError
from ..runtime import flight
from .launch_report import MEETING, STARTING, Job, current, describe_failure, engine_messages

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


PHASE_BYTES = 120             # what a worker is doing, as its slot in the launcher's table holds it
START_UP_S = 60.0             # at least this long for every worker to reach the store


class _Phase:
    """This worker's slot (set by ``doing``) in the launcher's shared table of what each rank is
    doing, read when the rank dies without a word; None outside ``run``'s workers."""

    def __init__(self):
        self.slot = None


PHASE = _Phase()


def doing(what: str) -> None:
    """Say what this worker is doing now, so that the launcher can say it if the rank dies
    (a no-op outside ``run``'s workers). Costs a copy of at most 120 bytes.

    >>> doing("timing ring at 16 MB")     # outside a launched worker: nothing happens
    """
    slot = PHASE.slot
    if slot is not None:
        slot.value = what.encode()[:PHASE_BYTES - 1]


def _entry(rank, workers, port, host, fn, args, results, timeout, network=None, external=(), phase=None,
           log=None):
    PHASE.slot = phase
    _signals_in_worker()
    _engine_messages_to(log)
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
    try:
        algorithms.load_external(external)    # a spawned process sees only gradsync's own algorithms
        doing(MEETING)
        # the store waits for the slowest to start (N imports of torch on shared cores), the group's
        # collectives for `timeout`; a rank that dies starting is caught by the launcher at once
        store = rendezvous_store(host, port, rank, workers, max(timeout, START_UP_S))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=workers,
                                timeout=datetime.timedelta(seconds=timeout))
        doing(f"running {getattr(fn, '__name__', 'the worker')}")
        value = fn(rank, workers, *args)
        doing("shutting down")
        results.put((rank, "ok", value))
    except BaseException as exc:  # report every failure to the parent, then exit
        results.put((rank, "error", describe_failure(exc, current(phase))))
    finally:
        if dist.is_initialized():
            _check_out(rank, workers)
            dist.destroy_process_group()


def _engine_messages_to(path) -> None:
    """What the engine writes straight to fd 2 (c10d's C++ warnings, each with dozens of stack
    frames) goes to ``path``; Python's ``sys.stderr`` (tracebacks, warnings, progress) stays."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if path is not None else None
    except OSError:
        return                                 # no file, no redirection: the messages stay on stderr
    if fd is not None:
        sys.stderr = os.fdopen(os.dup(2), "w", buffering=1)
        os.dup2(fd, 2)
        os.close(fd)


def _signals_in_worker() -> None:
    """A worker starts with SIGINT ignored and SIGUSR1 blocked (inherited from ``run``): Ctrl-C
    is the launcher's to handle (it stops the workers), and SIGUSR1 writes the flight record once
    the handler is in (``GRADSYNC_FLIGHT_DIR``), else is ignored: a signal sent while the worker
    was still importing waits, blocked, until now and never kills it."""
    if not flight.watch_signal():
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1, signal.SIGINT})




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
    """Children start with OMP_NUM_THREADS=1 unless the user set it, as torchrun does (N OpenMP
    pools the size of the machine oversubscribe it); it must be set before torch loads."""
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


def leave_launched(code: int = 0) -> None:
    """End a rank that torchrun, mpirun or srun started: run the exit handlers (shared-memory
    segments left, Gloo waits settled), finalize MPI if it was started, flush, and leave
    without interpreter teardown. Elsewhere (a shell, a test), return and let the caller exit as usual.

    Why: a Gloo worker thread may drop the last reference to a finished operation while the
    interpreter is tearing down; the tensors it held then need a GIL that no longer exists, and
    the process aborts ("terminate called without an active exception"), even after
    ``destroy_process_group`` (the group survives while anything refers to it). torchrun reads
    the abort as the rank's failure: a finished job reported failed, or restarted. PyTorch has
    the problem open ("Improve mean time to detect the issue by adding warning logs when users
    miss to call destroy_process_group"; an atexit fix was tried and abandoned).

    >>> leave_launched(0) if launched() is None else None     # outside a launcher: returns
    """
    if not any(rank in os.environ for rank, _, _ in LAUNCHERS.values()):
        return
    atexit._run_exitfuncs()           # what normal exit would run: they need the interpreter alive
    mpi = sys.modules.get("mpi4py.MPI")      # mpi4py finalizes at interpreter teardown, which is skipped:
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():     # mpirun needs it done
        mpi.Finalize()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


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
        network=None, job_timeout: float | None = None) -> list:
    """Run ``fn(rank, workers, *args)`` in ``workers`` new processes; return their results by rank.

    ``fn`` must be importable (defined at module level). A worker that raises or dies makes
    this raise ``GradsyncError`` in one line: who failed first, when, doing what (``doing``);
    the others are stopped within ``timeout`` + 2 s (at once if it died starting). With
    ``tolerate`` they run on, and a failed worker's slot holds its error. ``timeout``: the
    process group's collectives; ``job_timeout`` (default ``timeout`` + 30 s): the whole job.
    ``network``: a ``links.SlowLinks`` whose namespaces the workers join. Ctrl-C stops every
    worker at once (they never see it) and removes their shared memory.

    The engine's own messages (c10d's C++ warnings with their stack frames) go to a file per
    rank: replayed on stderr after a healthy run, named in the error after a failure.

    Example: ``run(body, 3)`` with ``def body(rank, workers): gradsync.all_reduce(t := torch.ones(4));
    return t.tolist()`` at module level gives ``[[3.0, 3.0, 3.0, 3.0]] * 3``.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 256:
        raise ConfigError(f"workers must be an integer in 1..256, got {workers!r}")
    if network is not None and network.workers != workers:
        raise ConfigError(f"the slow-link network is for {network.workers} workers, not {workers}")
    ctx = mp.get_context("spawn")
    if network is not None:
        host, port = network.addresses[0], network.port      # rank 0's address, in fresh namespaces
    else:
        port = free_port(host)
    logs = tempfile.mkdtemp(prefix="gradsync-workers-")
    with _one_openmp_thread(), _signals_blocked():          # the children inherit the mask, not the wait
        results = ctx.Queue()
        phases = [ctx.Array("c", PHASE_BYTES, lock=False) for _ in range(workers)]
        for slot in phases:
            slot.value = STARTING.encode()
        procs = [ctx.Process(target=_entry, args=(r, workers, port, host, fn, args, results, timeout, network,
                                                  algorithms.external(), phases[r], f"{logs}/rank{r}.log"),
                             daemon=True) for r in range(workers)]
        for p in procs:
            p.start()
    job = Job(procs, results, phases, timeout, timeout + 30 if job_timeout is None else job_timeout, tolerate)
    try:
        job.collect()
    except BaseException:
        _stop(procs, at_once=True)
        shutil.rmtree(logs, ignore_errors=True)
        raise
    _stop(procs, at_once=bool(job.errors) and not tolerate)
    kept = engine_messages(logs, replay=not job.errors, keep=bool(job.errors) and not tolerate)
    if job.errors and not tolerate:
        raise GradsyncError(job.summary() + (f"; the engine's own messages are in {kept}" if kept else ""))
    for r, msg in job.errors.items():
        job.out[r] = GradsyncError(f"rank {r}: {msg}")
    return job.out


@contextlib.contextmanager
def _signals_blocked():
    """SIGINT and SIGUSR1 held back while the workers are started, and SIGINT ignored: each child
    inherits both (Python leaves an ignored SIGINT alone, where it would unblock a blocked one;
    the worker unblocks SIGUSR1 itself once it can handle it). A Ctrl-C meanwhile stays pending
    (Linux queues a blocked signal even while it is ignored) and reaches this process as soon
    as the block ends."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGUSR1})
    try:
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:                   # not the main thread: the mask alone
        handler = None
    try:
        yield
    finally:
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _stop(procs: list, at_once: bool) -> None:
    """End the workers: wait for them (10 s each) unless ``at_once``, then kill what is left
    and remove the shared-memory segments of those that died holding them."""
    for p in procs:
        if not at_once:
            p.join(timeout=10)
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=5)
    if any(p.exitcode is not None and p.exitcode < 0 for p in procs):
        from ..runtime.transport.shm import sweep
        sweep()
