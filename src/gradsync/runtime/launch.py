"""Start N local worker processes joined in a Gloo process group on 127.0.0.1: no set-up.

Across machines, run the same entry point under torchrun instead (see the README); this
module is the embedded default for one machine.
"""

from __future__ import annotations

import datetime
import os
import queue as queue_module
import socket
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp

from ..errors import ConfigError, GradsyncError

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _entry(rank, workers, port, host, fn, args, results, timeout):
    if host == LOOPBACK:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")    # listen on loopback only
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank, world_size=workers,
                                timeout=datetime.timedelta(seconds=timeout))
        results.put((rank, "ok", fn(rank, workers, *args)))
    except BaseException as exc:  # report every failure to the parent, then exit
        detail = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, GradsyncError):
            detail += "\n" + traceback.format_exc(limit=6)
        results.put((rank, "error", detail))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run(fn, workers: int, *args, host: str = LOOPBACK, timeout: float = 300.0) -> list:
    """Run ``fn(rank, workers, *args)`` in ``workers`` new processes; return their results by rank.

    ``fn`` must be importable (defined at module level). Raises ``GradsyncError`` naming the
    ranks that failed, with their errors.

    Example::

        def body(rank, workers):
            t = torch.full((4,), float(rank))
            gradsync.all_reduce(t)
            return t.tolist()

        run(body, 3)   # [[3.0, 3.0, 3.0, 3.0]] * 3
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 256:
        raise ConfigError(f"workers must be an integer in 1..256, got {workers!r}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port(host)
    procs = [ctx.Process(target=_entry, args=(r, workers, port, host, fn, args, results, timeout), daemon=True)
             for r in range(workers)]
    for p in procs:
        p.start()
    out, errors = [None] * workers, {}
    try:
        for _ in range(workers):
            rank, status, value = results.get(timeout=timeout + 30)
            if status == "ok":
                out[rank] = value
            else:
                errors[rank] = value
    except queue_module.Empty:
        missing = [r for r in range(workers) if out[r] is None and r not in errors]
        errors.update({r: "no result (the process hung or died)" for r in missing})
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if errors:
        lines = "; ".join(f"rank {r}: {msg.splitlines()[0]}" for r, msg in sorted(errors.items()))
        raise GradsyncError(f"{len(errors)} of {workers} workers failed: {lines}")
    return out
