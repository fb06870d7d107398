"""What every transport is: the protocol the collective talks to, its optional capabilities,
the keys a torch.distributed group is known by, and the one ``gather`` written over ``post``.

A transport moves one collective's messages between the ``size`` ranks of a group; the
transports differ only in how (``distributed``, ``shm``, ``mixed``, ``mpi``, ``memory``).
Optional capabilities are declared here, by name, so that the runtime tests for them by name:
``reduces_from_channel(transport)`` says whether a receive can be added into its target
straight from where it landed (shared memory's channels).
"""

from __future__ import annotations

import os

from typing import Protocol

import torch
import torch.distributed as dist

GATHER_TAG = (1 << 31) - 16     # above any plan's tag (transfer index * 64 + piece, salted)


class Transport(Protocol):
    """Point-to-point messages of one collective between the ``size`` ranks of a group.

    ``recv``/``send`` post an operation and return a handle at once; ``post`` posts several
    (batched where the engine can); ``wait`` blocks until the handles are complete or
    ``deadline`` (time.monotonic()) passes, raising ``PeerError`` naming the peer; ``gather``
    exchanges fixed-size bytes with every rank (never pickled objects); ``close`` ends the
    collective's timers. ``group_key`` names the group in ``runtime.state``: the collectives
    of one key run one at a time, on one progress engine. Optional, read with ``getattr``:
    ``failure_key`` (where the group's failure notice is posted), ``waiting_for`` (the
    operation a stalled wait is blocked on, for the flight recorder) and ``group`` (the
    torch.distributed group it runs on, whose ranks can be asked for their hosts; absent on
    transports without one: MPI, threads).
    """

    rank: int
    size: int
    group_key: str

    def recv(self, tensor: torch.Tensor, peer: int, tag: int): ...

    def send(self, tensor: torch.Tensor, peer: int, tag: int): ...

    def post(self, ops: list[tuple[str, torch.Tensor, int, int]]) -> list: ...

    def wait(self, pending: list, deadline: float) -> None: ...

    def gather(self, data: torch.Tensor, deadline: float, tag: int = 0) -> list[torch.Tensor]: ...

    def close(self) -> None: ...


class ReducesFromChannel(Protocol):
    """A transport that can finish a receive by adding it into a tensor from where it landed:
    shared memory adds frames straight from the channel, one copy per byte fewer than a
    receive into scratch followed by an add (the executor's REDUCE)."""

    def reduce_from(self, handle, target: torch.Tensor, deadline: float) -> None:
        """Wait for receive ``handle`` and add what it brings into ``target`` (flat, its dtype)."""


def reduces_from_channel(transport) -> bool:
    """Whether ``transport`` has the ``ReducesFromChannel`` capability. Tested by the method's
    name, not ``isinstance`` against a runtime-checkable protocol: that took 13-20 us here, once
    per collective, against 0.2 us.

    >>> from gradsync.runtime.transport.memory import MemoryTransport
    >>> reduces_from_channel(MemoryTransport.group(1)[0])
    False
    """
    return callable(getattr(transport, "reduce_from", None))


class ReadsPeers(Protocol):
    """A transport whose ranks all share one host and can read each other's buffers directly:
    schedules whose spec says ``shared_buffers`` run on it by reads (``runtime.reads``), with
    a barrier between rounds instead of messages."""

    def shared_buffers(self):
        """The group's ``SharedBuffers``: every rank's slots and the barrier."""


def shared_buffers(transport):
    """The transport's shared buffers if it has the ``ReadsPeers`` capability, else None.

    >>> from gradsync.runtime.transport.memory import MemoryTransport
    >>> shared_buffers(MemoryTransport.group(1)[0]) is None
    True
    """
    method = getattr(transport, "shared_buffers", None)
    return method() if callable(method) else None


def group_name(group=None) -> str:
    """The group's name, the same in every process: "world" (the default group, passed or not),
    or its global ranks ("0-2-3")."""
    if group is None or (dist.is_initialized() and group is dist.distributed_c10d._get_default_group()):
        return "world"
    return "-".join(map(str, dist.get_process_group_ranks(group)))


def group_key(group=None) -> str:
    """The key of a torch.distributed group in ``runtime.state`` and for its progress engine,
    the same in every process: ``group_key()`` is "torch/world"."""
    return f"torch/{group_name(group)}"


def store_prefix() -> str:
    """The first part of every store key gradsync writes: "gradsync", or "gradsync@<k>" in the
    k-th restart of a job under torchrun's elastic agent, whose store outlives the workers (a
    restarted rank must not read the keys of the attempt that failed).

    >>> store_prefix() if "TORCHELASTIC_RESTART_COUNT" not in os.environ else "gradsync"
    'gradsync'
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return "gradsync" if attempt in ("", "0") else f"gradsync@{attempt}"


def failure_key(group=None) -> str:
    """Where a torch.distributed group's failure notice is posted in its rendezvous store, one
    per group, the same name on every rank (ids differ between processes): after a PeerError
    the group cannot be used again, and ranks may be one collective apart when a failure hits.
    ``failure_key()`` is "gradsync/failure/world" (in a job's first attempt)."""
    return f"{store_prefix()}/failure/{group_name(group)}"


def post_each(transport, ops: list[tuple[str, torch.Tensor, int, int]]) -> list:
    """``post`` for engines without a batch call: each ("send" | "recv", tensor, peer, tag) in turn."""
    return [transport.send(t, peer, tag) if kind == "send" else transport.recv(t, peer, tag)
            for kind, t, peer, tag in ops]


class GatherOverPost:
    """Gives a transport ``gather`` written over its own ``post`` and ``wait``."""

    def gather(self, data: torch.Tensor, deadline: float, tag: int = 0) -> list[torch.Tensor]:
        """Every rank's ``data`` (same-size bytes), by rank (this rank's entry is ``data``
        itself), without pickling: a message to and from every peer, all posted at once (the
        receives first), as the agreement exchanges its digests. Not Gloo's own all_gather:
        of 16 bytes it took 280 us here against 85 us for this (N = 2; 3.4 ms at N = 4;
        benchmarks/runtime_overheads.py). ``tag`` (0-15) tells consecutive gathers apart.

        >>> import time
        >>> from gradsync.runtime.transport.memory import run_threads
        >>> run_threads(lambda rank, t: [int(x) for x in t.gather(torch.tensor([rank]), time.monotonic() + 10)], 3)
        [[0, 1, 2], [0, 1, 2], [0, 1, 2]]
        """
        out = [data if r == self.rank else torch.empty_like(data) for r in range(self.size)]
        peers = [r for r in range(self.size) if r != self.rank]
        self.wait(self.post([("recv", out[r], r, GATHER_TAG + tag) for r in peers]
                            + [("send", data, r, GATHER_TAG + tag) for r in peers]), deadline)
        return out
