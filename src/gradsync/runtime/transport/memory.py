"""Ranks as threads of one process, exchanging tensors through memory: the test transport.

As on a network, a message moves some time after both its send and its receive are posted,
whatever either side does meanwhile: a delivery thread copies matched messages in a random
order, so a collective that overwrites a segment while a send of it is still in flight, or
that relies on messages arriving in the order they were posted, gets a wrong answer here too.
"""

from __future__ import annotations

import itertools
import random
import threading
import time

import torch

from ...errors import PeerError
from .base import GatherOverPost, post_each


class _Message:
    def __init__(self):
        self.source = self.target = None
        self.done = threading.Event()


class _Network:
    """The group's shared state: messages by (src, dst, tag), and the delivery thread."""

    serials = itertools.count()

    def __init__(self, seed: int):
        self.serial = next(self.serials)
        self.messages: dict = {}
        self.ready: list[_Message] = []
        self.lock = threading.Condition()
        self.random = random.Random(seed)
        threading.Thread(target=self._deliver, daemon=True, name="memory-transport").start()

    def post(self, key, source=None, target=None) -> _Message:
        with self.lock:
            message = self.messages.setdefault(key, _Message())
            if source is not None:
                message.source = source
            else:
                message.target = target
            if message.source is not None and message.target is not None:
                del self.messages[key]         # the tag may be used again by a later collective
                self.ready.append(message)
                self.lock.notify()
            return message

    def _deliver(self):
        while True:
            with self.lock:
                while not self.ready:
                    self.lock.wait()
                message = self.ready.pop(self.random.randrange(len(self.ready)))
            with torch.no_grad():            # bytes on a wire, as Gloo writes them: no autograd
                message.target.copy_(message.source)
            message.done.set()


class _Handle:
    def __init__(self, message: _Message, kind: str, peer: int):
        self.message, self.kind, self.peer = message, kind, peer


class MemoryTransport(GatherOverPost):
    """One rank's end of an in-process group; make all ranks' ends with ``group(size)``.

    >>> a, b = MemoryTransport.group(2)
    >>> out = torch.zeros(2)
    >>> received, sent = b.recv(out, 0, tag=7), a.send(torch.ones(2), 1, tag=7)
    >>> b.wait([received], time.monotonic() + 1); out.tolist()
    [1.0, 1.0]
    """

    def __init__(self, rank: int, size: int, network: _Network):
        self.rank, self.size, self._network = rank, size, network
        self.group_key = f"memory/{network.serial}/{rank}"     # each rank its own progress thread

    @classmethod
    def group(cls, size: int, seed: int = 0) -> list["MemoryTransport"]:
        network = _Network(seed)
        return [cls(rank, size, network) for rank in range(size)]

    def send(self, tensor, peer, tag):
        return _Handle(self._network.post((self.rank, peer, tag), source=tensor), "send", peer)

    def recv(self, tensor, peer, tag):
        return _Handle(self._network.post((peer, self.rank, tag), target=tensor), "recv", peer)

    def post(self, ops):
        return post_each(self, ops)

    def wait(self, pending, deadline):
        for h in pending:
            if not h.message.done.wait(max(0.0, deadline - time.monotonic())):
                raise PeerError(f"rank {self.rank}: {'receive from' if h.kind == 'recv' else 'send to'} rank "
                                f"{h.peer} did not answer before the timeout", peer=h.peer, op=h.kind)

    def close(self):
        pass


def run_threads(fn, size: int, seed: int = 0, join: float = 60.0) -> list:
    """``fn(rank, transport)`` on every rank of one in-memory group, each rank a thread of this
    process; per rank what it returned or the exception it raised (None if it did not finish
    within ``join`` seconds).

    >>> run_threads(lambda rank, transport: rank * 10, 3)
    [0, 10, 20]
    """
    transports = MemoryTransport.group(size, seed)
    out = [None] * size

    def rank(r):
        try:
            out[r] = fn(r, transports[r])
        except Exception as exc:       # noqa: BLE001 - handed to the caller
            out[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join)
    return out
