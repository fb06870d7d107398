"""``gradsync.all_reduce``: any gradsync algorithm, in place, between real processes.

The front door, and only that: check the whole call once (``request.Request.checked``; a call
repeated with the same kind of tensor and arguments is not checked again), then hand it to the
group's communicator (``communicator``), which chooses, plans and runs it. A call with what only
a schedule's own executor offers (compression, a trace, a stall warning, a finiteness check,
an algorithm's options, CUDA tensors) is built here over its transport (``prepare.build``).
Nothing here is called back.
"""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict

import torch
import torch.distributed as dist

from . import flight
from .communicator import communicator_for
from .compressed import CompressedAllReduce
from .pending import Pending
from .prepare import build
from .request import Request, check_initialized
from .transport import for_group


class Work:
    """An all-reduce in flight (``all_reduce(..., async_op=True)``), like torch.distributed's Work.

    Example, in each rank::

        work = gradsync.all_reduce(grad, algorithm="ring", async_op=True)
        ...                      # compute on, without touching grad
        work.wait()              # grad now holds the sum (PeerError if a peer failed)
    """

    def __init__(self, pending):
        self._pending = pending if isinstance(pending, Pending) else _Wrapped(pending)

    def wait(self) -> torch.Tensor:
        """Block until done; return the tensor, or raise the collective's error."""
        return self._pending.wait()

    def is_completed(self) -> bool:
        return self._pending.done()

    def get_future(self) -> torch.futures.Future:
        """The future of the result tensor (what a DDP communication hook returns); it fails, for
        C++ readers too, with the collective's error."""
        return self._pending.future()


class _Wrapped(Pending):
    """A ``Pending`` over a future a schedule's collective completes."""

    __slots__ = ("inner",)

    def __init__(self, inner: torch.futures.Future):
        self.inner = inner

    def wait(self):
        return self.inner.wait()

    def done(self) -> bool:
        return self.inner.done()

    def error(self):
        from .pending import Queued

        return Queued(self.inner).error()

    def future(self, value=None, translate=None):
        from .pending import Queued

        return Queued(self.inner).future(value, translate)


def all_reduce(tensor: torch.Tensor, algorithm: str = "ring", op: str = "sum", group=None,
               timeout: float | None = None, check: bool = True, stall_warning: float | None = None,
               check_finite: bool = False, async_op: bool = False, trace=None, transport: str = "auto",
               compression=None, compression_key=None,
               **options):
    """All-reduce ``tensor`` in place across ``group`` with a gradsync algorithm; return it.

    Like ``torch.distributed.all_reduce``: every rank calls it with a tensor of the same shape
    and dtype, in the same order. ``algorithm`` is a registry name or "auto"; ``options`` go
    to the algorithm (``components=16`` for CERAR). ``async_op=True`` returns a ``Work`` at
    once (``wait()``, ``get_future()``) while the collective runs on gradsync's progress
    thread; leave the tensor alone until it completes. ``transport``: "auto" (the default:
    shared memory within hosts where the ranks share one, CPU tensors; else the group's
    backend), "gloo" (the group's torch.distributed backend) or "shm" (shared memory; every
    rank on this host). There, one_shot and
    sharded (one-shot and two-shot) read the peers' buffers directly; "auto" picks by size.

    The ranks agree on shape, dtype, algorithm and options (``check``) before anything
    received is used; a mismatch raises ``MismatchError`` on every rank. A peer that fails or
    stalls raises ``PeerError`` within ``timeout`` seconds, on every rank, naming the rank
    that failed; ``stall_warning`` seconds logs a warning naming the peer still awaited (a
    straggler) before that. ``check_finite`` adds to the agreement whether each rank's tensor
    is free of NaN and Inf: if one is not, every rank raises ``MismatchError`` naming it,
    before anything is summed (off by default: it reads the tensor once more). ``trace``: a
    ``gradsync.runtime.tracing.Trace`` to record the collective's rounds and transfers in (every
    rank passes one, or none; the ranks agree on it).

    ``compression`` (a float tensor only): a codec of ``gradsync.compression``, as text
    (``"fp16"``, ``"powersgd:rank=4"``, ``"topk:ratio=0.01"``) or a ``Codec``; the algorithm then
    runs the codec's payload (a ``trace`` records each of the codec's collectives). Text makes a
    new codec per call: pass one ``Codec`` to keep error feedback and warm starts across calls,
    per ``compression_key`` (default: shape and dtype).

    Example, in each of N processes after ``dist.init_process_group("gloo", ...)``::

        grad = torch.ones(1000)
        gradsync.all_reduce(grad, algorithm="halving_doubling", op="avg")
        work = gradsync.all_reduce(grad, algorithm="ring", async_op=True); work.wait()
    """
    plain = compression is None and trace is None and stall_warning is None and not check_finite and check \
        and not options
    key = _call_key(tensor, algorithm, op, group, timeout, transport) if plain else None
    known = _CHECKED.get(key) if key is not None else None
    comm = known() if known is not None else None
    if comm is None:                     # the first call of its kind: check it whole
        request = Request.checked(tensor, algorithm, op, timeout, options=options, check=check,
                                  check_finite=check_finite, trace=trace, stall_warning=stall_warning,
                                  transport=transport, compression=compression, compression_key=compression_key)
        check_initialized()
        flight.watch_signal()           # SIGUSR1 dumps the flight record, if GRADSYNC_FLIGHT_DIR is set
        if key is None or tensor.device.type != "cpu" or not _takes(algorithm):
            return _scheduled(request, group, transport, stall_warning, async_op)
        comm = _remember(key, communicator_for(group, timeout, transport))
    if comm.closed:                     # the group was destroyed: find its successor, if any
        _CHECKED.pop(key, None)
        return all_reduce(tensor, algorithm, op, group, timeout, check, stall_warning, check_finite, async_op,
                          trace, transport, compression, compression_key, **options)
    out = comm.all_reduce(tensor, op, algorithm, async_op)
    return Work(out) if async_op else out


CHECKED_LIMIT = 256
# a checked call's key -> its group's communicator, weakly: api's own, bounded, and holding no
# group alive (a destroyed group's communicator goes with it, and its calls are checked again)
_CHECKED: OrderedDict = OrderedDict()


def _call_key(tensor, algorithm, op, group, timeout, transport):
    """What makes two calls the same call: the group object (its id: a group made again is
    another, and its communicator another, which the weak reference tells), the tensor's kind,
    and every argument; None when it cannot be a key."""
    if type(tensor) is not torch.Tensor or not dist.is_initialized():
        return None
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    key = (id(pg), algorithm, op, timeout, transport, tensor.dtype, tensor.device.type, tensor.requires_grad)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _remember(key, comm):
    _CHECKED[key] = weakref.ref(comm)
    if len(_CHECKED) > CHECKED_LIMIT:
        _CHECKED.popitem(last=False)
    return comm


def _takes(algorithm: str) -> bool:
    """Whether the communicator runs ``algorithm`` (exact ones, "auto", its own names)."""
    from .. import algorithms

    return algorithm == "auto" or algorithms.get(algorithm).exact


def _scheduled(request: Request, group, transport: str, stall_warning, async_op: bool):
    """A call only a schedule's executor takes (compression, trace, ...), over its transport."""
    deadline = time.monotonic() + request.timeout
    channel = for_group(transport, group, request.tensor.device.type, request.timeout, stall_warning)
    try:
        collective = (CompressedAllReduce.of if request.codec is not None else build)(request, channel, deadline)
    except BaseException:
        channel.close()
        raise
    future = collective.start(inline=not async_op)
    return Work(future) if async_op else future.wait()
