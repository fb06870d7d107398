"""``gradsync.all_reduce``: any gradsync algorithm, in place, between real processes.

The front door, and only that: check the whole call (``request.Request.checked``), then build
the transport and the collective (``prepare.build``) and start it. Nothing here is called back.
"""

from __future__ import annotations

import time

import torch

from . import flight
from .compressed import CompressedAllReduce
from .prepare import build
from .request import Request, check_initialized, recipe_key
from .state import STATE
from .transport import for_group


class Work:
    """An all-reduce in flight (``all_reduce(..., async_op=True)``), like torch.distributed's Work.

    Example, in each rank::

        work = gradsync.all_reduce(grad, algorithm="ring", async_op=True)
        ...                      # compute on, without touching grad
        work.wait()              # grad now holds the sum (PeerError if a peer failed)
    """

    def __init__(self, future: torch.futures.Future):
        self._future = future

    def wait(self) -> torch.Tensor:
        """Block until done; return the tensor, or raise the collective's error."""
        return self._future.wait()

    def is_completed(self) -> bool:
        return self._future.done()

    def get_future(self) -> torch.futures.Future:
        """The future of the result tensor (what a DDP communication hook returns)."""
        return self._future


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
    key = recipe_key(tensor, algorithm, op, group, timeout, check, transport, options) \
        if compression is None and trace is None and stall_warning is None and not check_finite else None
    recipe = STATE.recipe(key) if key is not None else None
    if recipe is not None and recipe.usable():      # this very call was checked before
        flight.watch_signal()
        return Work(recipe.start(tensor)) if async_op else recipe.run(tensor)
    request = Request.checked(tensor, algorithm, op, timeout, options=options, check=check,
                              check_finite=check_finite, trace=trace, stall_warning=stall_warning,
                              transport=transport, compression=compression, compression_key=compression_key)
    check_initialized()
    flight.watch_signal()               # SIGUSR1 dumps the flight record, if GRADSYNC_FLIGHT_DIR is set
    deadline = time.monotonic() + request.timeout
    channel = for_group(transport, group, tensor.device.type, request.timeout, stall_warning)
    try:
        collective = (CompressedAllReduce.of if request.codec is not None else build)(request, channel, deadline)
    except BaseException:
        channel.close()
        raise
    if key is not None and getattr(collective, "recipe", None) is not None:
        STATE.remember(key, collective.recipe)
    return _handed(collective.start(inline=not async_op), async_op)


def _handed(future, async_op: bool):
    return Work(future) if async_op else future.wait()
