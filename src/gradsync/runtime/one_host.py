"""Every collective of gradient synchronization on one host's shared buffers: all-reduce,
reduce-scatter, all-gather, broadcast and barrier, each a schedule run by reads (``reads``).

What sharded data parallelism calls (FSDP2, ZeRO: D2L's "each device owns 1/N") is the two
halves of the two-shot all-reduce: reduce-scatter is ``sharded``'s REDUCE round alone (rank r
sums segment r of every rank's input: torch's rank order, so no permutation), all-gather its
COPY round alone (rank r's input is segment r). Broadcast is one round of copies from the root.
Each runs on the group's progress engine, in order with the group's all-reduces, and meets
the others at the same barriers, so a dead rank is named here as everywhere on shared memory.
A message larger than a slot runs in pieces: columns of the N segments, so each piece is the
same collective on fewer elements.

``group_buffers(group)`` says whether a group can use them: every rank on this host, CPU
tensors; otherwise the caller uses another engine.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import torch

from ..core.schedule import COPY, REDUCE, Schedule, transfers
from ..errors import ConfigError
from . import flight
from .agree import digest
from .api import Work, all_reduce as _all_reduce
from .progress import start
from .reads import ReadProgram, compile_reads, run_piece
from .request import default_timeout
from .transport import ShmTransport
from .transport.hosts import host_map

OPS = ("sum", "avg")


def group_buffers(group=None, timeout: float | None = None):
    """The group's ``ShmTransport`` when every rank of ``group`` runs on this host, else None.

    Example, in each rank: ``group_buffers() is not None`` on one host.
    """
    timeout = default_timeout() if timeout is None else timeout
    found = host_map(group, timeout)
    if found.hosts != 1:
        return None
    try:
        return ShmTransport(group, timeout)
    except ConfigError:
        return None


def all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, timeout: float | None = None,
               async_op: bool = False):
    """All-reduce ``tensor`` in place on this host's shared buffers (one-shot or two-shot, by size).

    Example, in each rank on one host: ``one_host.all_reduce(grad, op="avg")``.
    """
    return _all_reduce(tensor, algorithm="auto", op=op, group=group, timeout=timeout, transport="shm",
                       async_op=async_op)


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, op: str = "sum", group=None,
                   timeout: float | None = None, async_op: bool = False):
    """Rank r's ``output`` gets the sum (or average) of segment r of every rank's ``input``
    (``input`` holds N x ``output.numel()`` elements, rank order), as torch's
    ``reduce_scatter_tensor``. ``input`` is left as it was.

    Example, in each of 4 ranks: ``reduce_scatter(torch.empty(2), torch.arange(8.))`` gives
    rank 1 ``[4 * 2., 4 * 3.]``.
    """
    transport, workers = _transport(group, timeout)
    m = _check("reduce_scatter", output, input, op, workers * output.numel(), input.numel())
    src, out = input.reshape(workers, m), output.view(-1)

    def body(buffers, deadline, signature):
        for c0, c1 in _columns(buffers, output, workers):
            w = c1 - c0
            target = out[c0:c1]
            run_piece(_program("reduce_scatter", workers, w, transport.rank), buffers, output.dtype,
                      lambda region: region(0, workers * w).view(workers, w).copy_(src[:, c0:c1]),
                      lambda a, b: target, deadline, signature if c0 == 0 else None, None)
        if op == "avg":
            out.div_(workers)
        return output

    return _start(body, transport, ("reduce_scatter", output, op), timeout, async_op)


def all_gather(output: torch.Tensor, input: torch.Tensor, group=None, timeout: float | None = None,
               async_op: bool = False):
    """``output`` (N x ``input.numel()`` elements) gets every rank's ``input``, in rank order,
    as torch's ``all_gather_into_tensor``.

    Example, in each of 2 ranks: ``all_gather(torch.empty(2), torch.tensor([rank + 0.]))`` gives ``[0., 1.]``.
    """
    transport, workers = _transport(group, timeout)
    m = _check("all_gather", input, output, "sum", workers * input.numel(), output.numel())
    src, out = input.reshape(-1), output.view(workers, m)
    rank = transport.rank

    def body(buffers, deadline, signature):
        for c0, c1 in _columns(buffers, input, workers):
            w = c1 - c0
            out[rank, c0:c1].copy_(src[c0:c1])
            run_piece(_program("all_gather", workers, w, rank), buffers, input.dtype,
                      lambda region: region(rank * w, (rank + 1) * w).copy_(src[c0:c1]),
                      lambda a, b: out[a // w, c0:c1], deadline, signature if c0 == 0 else None, None)
        return output

    return _start(body, transport, ("all_gather", input), timeout, async_op)


def broadcast(tensor: torch.Tensor, src: int = 0, group=None, timeout: float | None = None,
              async_op: bool = False):
    """Every rank's ``tensor`` gets rank ``src``'s (its rank in ``group``), in place.

    Example, in each rank: ``broadcast(weights, src=0)``.
    """
    transport, workers = _transport(group, timeout)
    if not isinstance(src, int) or isinstance(src, bool) or not 0 <= src < workers:
        raise ConfigError(f"src must be a rank of the group, 0..{workers - 1}, got {src!r}")
    _check("broadcast", tensor, tensor, "sum", tensor.numel(), tensor.numel())
    flat = tensor.view(-1)
    rank = transport.rank

    def body(buffers, deadline, signature):
        for c0, c1 in _columns(buffers, tensor, 1):
            piece = flat[c0:c1]
            fill = (lambda region: region(0, c1 - c0).copy_(piece)) if rank == src else (lambda region: None)
            run_piece(_program(f"broadcast{src}", workers, c1 - c0, rank), buffers, tensor.dtype, fill,
                      lambda a, b: piece[a:b], deadline, signature if c0 == 0 else None, None)
        return tensor

    return _start(body, transport, ("broadcast", tensor, src), timeout, async_op)


def barrier(group=None, timeout: float | None = None, async_op: bool = False):
    """Wait until every rank of ``group`` on this host has called it (``PeerError`` if one died).

    Example, in each rank: ``barrier()``.
    """
    transport, _ = _transport(group, timeout)
    return _start(lambda buffers, deadline, signature: buffers.barrier(deadline), transport, None, timeout,
                  async_op)


class _Job:
    """A collective of this module on the group's progress engine (``complete(future)``)."""

    def __init__(self, body, transport, deadline: float, signature: bytes | None):
        self.body, self.transport, self.deadline, self.signature = body, transport, deadline, signature

    def complete(self, future: torch.futures.Future) -> None:
        try:
            with torch.no_grad():
                result = self.body(self.transport.shared_buffers(), self.deadline, self.signature)
        except BaseException as exc:
            future.set_exception(exc)
            return
        future.set_result(result)


def _start(body, transport, described, timeout, async_op: bool):
    flight.watch_signal()
    timeout = default_timeout() if timeout is None else float(timeout)
    signature = None
    if described is not None:
        kind, tensor, *rest = described
        signature = digest({"collective": kind, "shape": list(tensor.shape), "dtype": str(tensor.dtype),
                            "more": rest})
    future = start(_Job(body, transport, time.monotonic() + timeout, signature), transport, inline=not async_op)
    return Work(future) if async_op else future.wait()


def _transport(group, timeout):
    transport = group_buffers(group, timeout)
    if transport is None:
        raise ConfigError("one_host collectives need every rank of the group on this host, sharing memory")
    return transport, transport.size


def _check(name: str, small: torch.Tensor, large: torch.Tensor, op: str, want: int, got: int) -> int:
    """Refuse what the collective cannot take; return the elements per rank."""
    for t in (small, large):
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or not t.is_contiguous():
            raise ConfigError(f"{name} takes contiguous CPU tensors, got {t!r:.60}")
    if small.dtype != large.dtype:
        raise ConfigError(f"{name}: input and output dtypes differ ({small.dtype} and {large.dtype})")
    if op not in OPS:
        raise ConfigError(f"{name}: op must be one of {', '.join(OPS)}, got {op!r}")
    if want != got:
        raise ConfigError(f"{name}: the larger tensor must hold {want} elements (ranks x the smaller), got {got}")
    return small.numel()


def _columns(buffers, tensor: torch.Tensor, segments: int) -> list[tuple[int, int]]:
    """Pieces of a collective over ``segments`` segments of ``tensor.numel()`` elements each:
    column ranges that fit a slot (none for an empty tensor: nothing to move, no barrier)."""
    per = max(1, buffers.capacity // tensor.element_size() // segments)
    m = tensor.numel()
    return [(c, min(m, c + per)) for c in range(0, m, per)]


@functools.lru_cache(maxsize=64)
def _program(kind: str, workers: int, width: int, rank: int) -> ReadProgram:
    """The read program of one piece: ``width`` elements per segment."""
    return compile_reads(_schedule(kind, workers, width), rank)


def _schedule(kind: str, workers: int, width: int) -> Schedule:
    """reduce_scatter: sharded's REDUCE round; all_gather: its COPY round; broadcast<root>: one
    round of copies from the root. ``width``: elements per segment (per rank)."""
    src, dst = np.meshgrid(np.arange(workers), np.arange(workers), indexing="ij")
    pairs = src != dst
    src, dst = src[pairs], dst[pairs]
    if kind == "reduce_scatter":          # every rank sends segment dst to its owner dst
        table = transfers(0, src, dst, dst * width, np.full_like(dst, width), REDUCE)
    elif kind == "all_gather":            # the owner src copies its segment src to everyone
        table = transfers(0, src, dst, src * width, np.full_like(dst, width), COPY)
    else:
        root = int(kind.removeprefix("broadcast"))
        others = np.array([r for r in range(workers) if r != root])
        table = transfers(0, np.full_like(others, root), others, np.zeros_like(others), np.full_like(others, width),
                          COPY)
        return Schedule(kind, workers, width, table)
    return Schedule(kind, workers, workers * width, table)
