"""A compressed all-reduce: a codec (``gradsync.compression``) running exact collectives of its
payload over one transport, as one job on the group's progress thread.

The codec's inner all-reduces go through ``prepare.build`` (so the ranks agree on their shape
and dtype as for any collective, and a codec set differently on two ranks is a
``MismatchError``); its all-gathers run the COPY half of a ring schedule over a buffer where
each rank's payload sits in the segment the ring's reduce-scatter would leave it owning.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from ..algorithms import ring
from ..core.plan import compile_plan
from ..core.schedule import COPY, Schedule, complete_segments
from .collective import Collective, node_buffers
from .prepare import prepare
from .progress import start


def all_gather_schedule(workers: int, elements: int) -> Schedule:
    """The all-gather of ``elements`` per worker: a ring all-reduce of workers x elements
    without its reduce-scatter rounds. Worker w's part starts at ``gather_offsets(...)[w]``.

    >>> all_gather_schedule(4, 10).rounds
    3
    """
    full = ring.schedule(workers, workers * elements)
    copies = full.transfers[full.transfers["op"] == COPY].copy()
    if len(copies):
        copies["round"] -= copies["round"].min()
    return Schedule("ring_all_gather", workers, workers * elements, copies)


@lru_cache(maxsize=64)
def _gather(workers: int, elements: int, rank: int, itemsize: int):
    schedule = all_gather_schedule(workers, elements)
    owned = complete_segments(ring.schedule(workers, workers * elements))
    offsets = np.array([owned[w][0][0] if owned.get(w) else w * elements for w in range(workers)])
    return schedule, compile_plan(schedule, rank, itemsize), offsets


def gather_offsets(workers: int, elements: int) -> np.ndarray:
    """Where each worker's part lies in the gathered buffer: ``gather_offsets(2, 5).tolist()`` is [5, 0]."""
    return _gather(workers, elements, 0, 1)[2]


class TransportExchange:
    """The ``Exchange`` a codec runs on: exact all-reduces with ``algorithm`` and ring
    all-gathers over ``transport``, each finished before the next starts; with ``trace`` (a
    ``tracing.Trace``, on every rank or none), each is recorded as its own collective.

    Example: ``codec.reduce(grad, TransportExchange(transport, "ring", {}, deadline))``.
    """

    def __init__(self, transport, algorithm: str, options: dict, deadline: float, check: bool = True, trace=None):
        self.transport, self.algorithm, self.options = transport, algorithm, options
        self.deadline, self.check, self.trace = deadline, check, trace
        self.workers, self.rank = transport.size, transport.rank

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return prepare(tensor, self.algorithm, "sum", self.transport, self.deadline, check=self.check,
                       options=self.options, trace=self.trace).start(inline=True).wait()

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        n, workers = tensor.numel(), self.workers
        if workers == 1:
            return tensor.view(1, -1).clone()
        schedule, plan, offsets = _gather(workers, n, self.rank, tensor.element_size())
        flat = torch.zeros(workers * n, dtype=tensor.dtype)
        flat[offsets[self.rank]:offsets[self.rank] + n] = tensor.view(-1)
        salt = (0x5A17 + n) & 0xFF
        Collective(schedule, plan, node_buffers(schedule, self.rank, flat), self.transport, self.deadline,
                   salt=salt, trace=self.trace).start(inline=True).wait()
        return torch.stack([flat[o:o + n] for o in offsets])


class CompressedAllReduce:
    """One compressed all-reduce ready to start, like a ``Collective``: ``start(inline)`` returns
    a future of the tensor holding the decompressed sum (divided for ``op="avg"``).

    Example, in each rank: ``CompressedAllReduce(grad, codec, exchange, "avg").start().wait()``.
    """

    def __init__(self, tensor: torch.Tensor, codec, exchange: TransportExchange, op: str = "sum", key=None):
        self.tensor, self.codec, self.exchange, self.op = tensor, codec, exchange, op
        self.transport = exchange.transport
        self.key = (tuple(tensor.shape), str(tensor.dtype)) if key is None else key

    @classmethod
    def of(cls, request, transport, deadline: float) -> "CompressedAllReduce":
        """The compressed all-reduce of a checked ``request`` (one with a codec) over ``transport``."""
        exchange = TransportExchange(transport, request.algorithm, request.options, deadline, request.check,
                                     request.trace)
        return cls(request.tensor, request.codec, exchange, request.op, request.compression_key)

    def start(self, inline: bool = False) -> torch.futures.Future:
        return start(self, self.transport, inline)

    def complete(self, future: torch.futures.Future) -> None:
        try:
            with torch.no_grad():
                flat = self.tensor.detach().reshape(-1).to(torch.float32)
                if self.exchange.workers > 1:
                    self.codec.reduce(flat, self.exchange, self.key)
                if self.op == "avg":
                    flat /= self.exchange.workers
                self.tensor.copy_(flat.view(self.tensor.shape))
        except BaseException as exc:       # the future carries it to whoever waits
            self.transport.close()
            future.set_exception(exc)
            return
        self.transport.close()
        future.set_result(self.tensor)


def emulate(compression, inputs: list, algorithm: str = "ring", op: str = "sum", **options) -> torch.Tensor:
    """Rank 0's result of one compressed all-reduce of ``inputs`` (one tensor per worker), every
    rank a thread of this process over the in-memory transport, each with a fresh codec.

    >>> emulate("topk:ratio=1", [torch.ones(3), torch.ones(3)]).tolist()
    [2.0, 2.0, 2.0]
    """
    import time

    from ..compression import make
    from .transport.memory import run_threads

    def rank(r, transport):
        exchange = TransportExchange(transport, algorithm, options, time.monotonic() + 60)
        return CompressedAllReduce(inputs[r].clone(), make(compression), exchange, op).start(inline=True).wait()

    out = run_threads(rank, len(inputs), join=120)
    for x in out:
        if isinstance(x, Exception):
            raise x
    return out[0]
