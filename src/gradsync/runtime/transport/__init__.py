"""Transports: how a collective's messages travel. The collective talks only to this protocol.

``DistributedTransport`` runs over torch.distributed (Gloo on CPU, NCCL on GPU), ``ShmTransport``
through shared memory between the ranks of one host, ``MixedTransport`` through shared memory
inside each host and Gloo across hosts, ``MpiTransport`` over mpi4py, ``MemoryTransport``
between threads of one process (for tests: every rank in one process, as Gloo's own tests do).
Each names a failed peer in a ``PeerError``.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ...errors import ConfigError
from .distributed import DistributedTransport, TorchTransport
from .memory import MemoryTransport
from .mixed import MixedTransport
from .shm import ShmTransport, host_group, shared_group

CHOICES = ("gloo", "shm", "auto")      # for a torch.distributed group; MPI has its own entry point


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


def for_group(name: str, group=None, device: str = "cpu", timeout: float = 60.0, stall_warning=None):
    """The transport ``name`` asks for, on a torch.distributed ``group``: "gloo" is the group's
    own backend (Gloo, or NCCL for GPU tensors), "shm" shared memory (every rank on this host),
    "auto", for CPU tensors on Gloo: shared memory when all ranks share one host, shared memory
    inside each host and Gloo across (``MixedTransport``) when the group spans hosts and some
    host holds two ranks or more, else the group's backend. The ranks learn their hosts through
    the group (``runtime.hosts.host_map``). Every rank must ask for the same. ``stall_warning``
    is a Gloo-transport feature: "auto" keeps to Gloo when it is set.

    Example, in each rank: ``for_group("auto")`` is a ``ShmTransport`` when all run on one host.
    """
    if name not in CHOICES:
        hint = " (MPI runs through gradsync.integrations.mpi.all_reduce under mpirun)" if name == "mpi" else ""
        raise ConfigError(f"transport must be one of {', '.join(CHOICES)}, got {name!r}{hint}")
    if name == "shm" and (device != "cpu" or stall_warning):
        raise ConfigError(f"transport 'shm' takes CPU tensors without stall_warning, got a {device} tensor"
                          + (f" and stall_warning={stall_warning!r}" if stall_warning else ""))
    if name == "shm":
        return ShmTransport(group, shared=shared_group(group, timeout))
    if name == "auto" and device == "cpu" and not stall_warning and _gloo(group):
        from .hosts import host_map

        kind = auto_kind(host_map(group, timeout))
        if kind == "shm":
            shared = shared_group(group, timeout)
            if not isinstance(shared, str):
                return ShmTransport(group, shared=shared)
        elif kind == "mixed":
            return MixedTransport(group, timeout, shared=host_group(group, timeout))
    return DistributedTransport(group, stall_warning)


def auto_kind(found) -> str:
    """What "auto" runs a group whose ranks are placed as ``found`` (a ``hosts.HostMap``) on:
    "shm" (one host), "mixed" (several, some with two ranks or more) or "gloo" (one rank each).

    >>> from gradsync.runtime.transport.hosts import HostMap
    >>> [auto_kind(HostMap(h, ("a", "b")[:max(h) + 1])) for h in [(0, 0), (0, 0, 1), (0, 1)]]
    ['shm', 'mixed', 'gloo']
    """
    if found.hosts == 1:
        return "shm"
    return "mixed" if found.shared() else "gloo"


def _gloo(group) -> bool:
    import torch.distributed as dist

    return dist.get_backend(group) == "gloo"


__all__ = ["CHOICES", "DistributedTransport", "MemoryTransport", "MixedTransport", "ShmTransport", "Transport",
           "TorchTransport", "auto_kind", "for_group", "host_group", "post_each", "shared_group"]
