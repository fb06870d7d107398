"""Bodies run in worker processes by tests/test_shm.py (importable by spawned children)."""

import os
import time

import numpy as np
import torch

import gradsync
from gradsync.runtime.transport import for_group, shared_group

LENGTHS = (0, 1, 13, 1000)
LONG = 300_000          # float64 only: 2.4 MB, several 1 MB frames per message


def _inputs(rank, n, dtype):
    rng = np.random.default_rng(1000 + rank)
    if dtype.is_floating_point:
        return torch.from_numpy(rng.standard_normal(n) * 10).to(dtype)
    return torch.from_numpy(rng.integers(-1000, 1000, n)).to(dtype)


def exact_sums(rank, workers):
    """Max relative error against numpy's float64 sum, per (algorithm, dtype, length), over shm."""
    out = {"transport": type(for_group("shm")).__name__}
    for alg in gradsync.algorithms.names(exact=True):
        for dtype in (torch.float64, torch.float32, torch.int32):
            for n in LENGTHS + ((LONG,) if dtype == torch.float64 else ()):
                x = _inputs(rank, n, dtype)
                gradsync.all_reduce(x, algorithm=alg, transport="shm")
                ref = np.sum([_inputs(r, n, dtype).double().numpy() for r in range(workers)], axis=0)
                scale = float(np.abs(ref).max()) if n else 1.0
                err = float(np.abs(x.double().numpy() - ref).max()) / (scale or 1.0) if n else 0.0
                out[(alg, str(dtype), n)] = err
    return out


def auto_picks(rank, workers):
    """What "auto" chooses between local processes, and that it sums right."""
    x = torch.full((5,), float(rank + 1))
    gradsync.all_reduce(x, transport="auto", algorithm="ring")
    return {"chosen": type(for_group("auto")).__name__, "sum": x.tolist(),
            "shared": not isinstance(shared_group(), str)}


def killed_rank(rank, workers, victim, timeout, transport="shm", algorithm="ring"):
    """Every rank runs all-reduces over ``transport``; ``victim`` kills itself (SIGKILL) mid-stream."""
    import signal
    import threading

    x = torch.ones(1 << 18)
    gradsync.all_reduce(x, algorithm=algorithm, transport=transport, timeout=timeout)    # the segment is set up
    if rank == victim:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    start = None
    try:
        for _ in range(100000):
            x.fill_(1.0)
            start = time.monotonic()
            gradsync.all_reduce(x, algorithm=algorithm, transport=transport, timeout=timeout)
            assert x[0].item() == workers
        return {"error": None}
    except gradsync.PeerError as exc:
        return {"error": str(exc), "peer": exc.peer, "seconds": time.monotonic() - start}


def stalled(rank, workers, timeout, sleeper=0, transport="shm", oversleep=2.0):
    """``sleeper`` sets up, then sleeps past the timeout; the others must name it, not a neighbour."""
    x = torch.ones(1000)
    gradsync.all_reduce(x, transport=transport, timeout=timeout)
    if rank == sleeper:
        time.sleep(timeout + oversleep)
        return {"slept": True}
    start = time.monotonic()
    try:
        gradsync.all_reduce(x, transport=transport, timeout=timeout)
        return {"error": None}
    except gradsync.PeerError as exc:
        return {"error": str(exc), "peer": exc.peer, "seconds": time.monotonic() - start}


def stopped_while_waiting(rank, workers, timeout, victim, algorithm):
    """``victim`` enters an all-reduce first and is stopped (SIGSTOP) while it waits there:
    its word in the segment still says whom it waited for, so the survivors' waits seem to close
    on themselves. Each survivor must name the victim, never itself or a neighbour."""
    import signal

    pids = torch.zeros(workers, dtype=torch.float64)
    pids[rank] = os.getpid()
    gradsync.all_reduce(pids, algorithm="ring", transport="shm", timeout=timeout)   # set up; every pid
    x = torch.ones(1000)
    if rank == victim:
        try:
            gradsync.all_reduce(x, algorithm=algorithm, transport="shm", timeout=timeout)
        except gradsync.PeerError:
            pass
        return {"stopped": True}
    time.sleep(0.5)                                   # the victim is blocked by now
    if rank == 0:
        os.kill(int(pids[victim]), signal.SIGSTOP)
    time.sleep(0.2)
    try:
        for _ in range(2):        # one-shot's first call may end: the victim's data was in before it stopped
            start = time.monotonic()
            gradsync.all_reduce(x, algorithm=algorithm, transport="shm", timeout=timeout)
        out = {"error": None}
    except gradsync.PeerError as exc:
        out = {"error": str(exc), "peer": exc.peer, "seconds": time.monotonic() - start}
    time.sleep(1.0)                                   # every survivor has named it
    if rank == 0:
        os.kill(int(pids[victim]), signal.SIGCONT)
    return out


def absent_at_setup(rank, workers, timeout):
    """The last rank exits before the group's first shared-memory collective."""
    if rank == workers - 1:
        os._exit(0)
    start = time.monotonic()
    try:
        gradsync.all_reduce(torch.ones(10), transport="shm", timeout=timeout)
        return {"error": None}
    except gradsync.PeerError as exc:
        return {"error": str(exc), "peer": exc.peer, "seconds": time.monotonic() - start}


def _as_machines(rank, per_host):
    """Emulate machines of ``per_host`` consecutive ranks: the host-identity override, and no
    launcher variable, so that the ranks learn the grouping from their hosts."""
    os.environ["GRADSYNC_HOST"] = f"machine{rank // per_host}"
    os.environ.pop("LOCAL_WORLD_SIZE", None)


MIXED_LENGTHS = {torch.float64: (0, 13, LONG), torch.float32: (1000,)}


def mixed_sums(rank, workers, per_host):
    """Ring and hierarchical over "auto" on emulated machines: max relative error against
    numpy's float64 sum, per (algorithm, dtype, length); what auto chose; the learned grouping."""
    from gradsync.runtime.transport import hosts

    _as_machines(rank, per_host)
    chosen = for_group("auto")
    out = {"transport": type(chosen).__name__, "local_size": hosts.local_size(workers),
           "host_ranks": list(chosen.shared.ranks) if getattr(chosen, "shared", None) else None, "errors": {}}
    for alg in ("ring", "hierarchical"):
        for dtype, lengths in MIXED_LENGTHS.items():
            for n in lengths:
                x = _inputs(rank, n, dtype)
                gradsync.all_reduce(x, algorithm=alg, transport="auto", timeout=60)
                ref = np.sum([_inputs(r, n, dtype).double().numpy() for r in range(workers)], axis=0)
                scale = float(np.abs(ref).max()) if n else 1.0
                out["errors"][(alg, str(dtype), n)] = \
                    float(np.abs(x.double().numpy() - ref).max()) / (scale or 1.0) if n else 0.0
    out["added_in_place"] = chosen.shared.added_in_place if getattr(chosen, "shared", None) else 0
    return out


def mixed_killed(rank, workers, per_host, victim, timeout):
    """Ring all-reduces over "auto" on emulated machines; ``victim`` kills itself mid-stream."""
    _as_machines(rank, per_host)
    return killed_rank(rank, workers, victim, timeout, transport="auto")


def mixed_stalled(rank, workers, per_host, sleeper, timeout):
    """After one all-reduce over "auto" on emulated machines, ``sleeper`` sleeps past the
    timeout: the ranks of both machines must name it, not a neighbour waiting for it."""
    _as_machines(rank, per_host)
    return stalled(rank, workers, timeout, sleeper=sleeper, transport="auto", oversleep=3.0)


def one_host_collectives(rank, workers, capacity):
    """Every one-host collective against numpy's float64 sums, slots cut to ``capacity`` bytes
    (None: as laid out) so that large messages go in pieces; returns the failures."""
    from gradsync.runtime import one_host

    buffers = for_group("shm").shared_buffers()
    if capacity is not None:
        buffers.capacity = capacity
    failures = []

    def data(r, m, dtype):
        return _inputs(r, workers * m, dtype)

    for m in (0, 1, 7, 1000):
        for dtype in (torch.float64, torch.float32, torch.int32):
            every = np.stack([data(r, m, dtype).double().numpy() for r in range(workers)])
            total = every.sum(axis=0)
            out = torch.empty(m, dtype=dtype)
            one_host.reduce_scatter(out, data(rank, m, dtype), op="avg" if dtype.is_floating_point else "sum")
            want = total[rank * m:(rank + 1) * m] / (workers if dtype.is_floating_point else 1)
            if not np.allclose(out.double().numpy(), want, rtol=1e-5, atol=1e-3):
                failures.append(("reduce_scatter", m, str(dtype)))
            gathered = torch.empty(workers * m, dtype=dtype)
            one_host.all_gather(gathered, data(rank, m, dtype)[:m].clone())
            if not np.array_equal(gathered.double().numpy(), every[:, :m].reshape(-1)):
                failures.append(("all_gather", m, str(dtype)))
            x = data(rank, m, dtype)
            one_host.broadcast(x, src=workers - 1)
            if not np.array_equal(x.double().numpy(), every[workers - 1]):
                failures.append(("broadcast", m, str(dtype)))
            one_host.barrier()
            for algorithm in ("one_shot", "sharded"):
                x = data(rank, m, dtype)
                uses = buffers.uses
                gradsync.all_reduce(x, algorithm=algorithm, transport="shm")
                if not np.allclose(x.double().numpy(), total, rtol=1e-5, atol=1e-3):
                    failures.append((algorithm, m, str(dtype)))
                if m and buffers.uses == uses:             # it ran by reads: it took the shared slots
                    failures.append((algorithm, "not by reads", m))
    return failures


def mismatched_reads(rank, workers):
    """Rank 0 all-reduces a longer tensor than the others, by reads: every rank must say so."""
    x = torch.ones(100 + (rank == 0))
    try:
        gradsync.all_reduce(x, algorithm="one_shot", transport="shm", timeout=5)
        return {"error": None}
    except (gradsync.MismatchError, gradsync.PeerError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
