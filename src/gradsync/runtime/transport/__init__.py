"""Transports: how a collective's messages travel. The collective talks only to this protocol.

``DistributedTransport`` runs over torch.distributed (Gloo on CPU, NCCL on GPU), ``MpiTransport``
over mpi4py, ``MemoryTransport`` between threads of one process (for tests: every rank in one
process, as Gloo's own tests do). Each names a failed peer in a ``PeerError``.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .distributed import DistributedTransport, TorchTransport
from .memory import MemoryTransport


class Transport(Protocol):
    """Point-to-point messages of one collective between the ``size`` ranks of a group.

    ``recv``/``send`` post an operation and return a handle at once; ``post`` posts several
    (batched where the engine can); ``wait`` blocks until the handles are complete or
    ``deadline`` (time.monotonic()) passes, raising ``PeerError`` naming the peer; ``gather``
    exchanges fixed-size bytes with every rank (never pickled objects); ``close`` ends the
    collective's timers.
    """

    rank: int
    size: int

    def recv(self, tensor: torch.Tensor, peer: int, tag: int): ...

    def send(self, tensor: torch.Tensor, peer: int, tag: int): ...

    def post(self, ops: list[tuple[str, torch.Tensor, int, int]]) -> list: ...

    def wait(self, pending: list, deadline: float) -> None: ...

    def gather(self, data: torch.Tensor, deadline: float, tag: int = 0) -> list[torch.Tensor]: ...

    def close(self) -> None: ...


def post_each(transport, ops: list[tuple[str, torch.Tensor, int, int]]) -> list:
    """``post`` for engines without a batch call: each ("send" | "recv", tensor, peer, tag) in turn."""
    return [transport.send(t, peer, tag) if kind == "send" else transport.recv(t, peer, tag)
            for kind, t, peer, tag in ops]


__all__ = ["DistributedTransport", "MemoryTransport", "Transport", "TorchTransport", "post_each"]
