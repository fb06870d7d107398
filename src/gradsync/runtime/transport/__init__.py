"""Transports: how a collective's messages travel. The collective talks only to this protocol.

``DistributedTransport`` runs over torch.distributed (Gloo on CPU, NCCL on GPU), ``ShmTransport``
through shared memory between the ranks of one host, ``MixedTransport`` through shared memory
inside each host and Gloo across hosts, ``MpiTransport`` over mpi4py, ``MemoryTransport``
between threads of one process (for tests: every rank in one process, as Gloo's own tests do).
Each names a failed peer in a ``PeerError``. What they share (the protocol, its optional
capabilities, the group keys, ``gather``) is in ``base``.
"""

from __future__ import annotations

from ...errors import ConfigError
from .base import GATHER_TAG, GatherOverPost, ReducesFromChannel, Transport, group_key, post_each, \
    reduces_from_channel
from .distributed import DistributedTransport, TorchTransport
from .memory import MemoryTransport
from .mixed import MixedTransport
from .shm import ShmTransport, host_group, shared_group

CHOICES = ("gloo", "shm", "auto")      # for a torch.distributed group; MPI has its own entry point


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
    check_choice(name, device, stall_warning)
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


def check_choice(name: str, device: str = "cpu", stall_warning=None) -> None:
    """Refuse, as a ``ConfigError``, a transport ``for_group`` cannot give for a ``device``
    tensor and ``stall_warning``, before any group or store is touched.

    >>> check_choice("tcp")
    Traceback (most recent call last):
    gradsync.errors.ConfigError: transport must be one of gloo, shm, auto, got 'tcp'
    """
    if name not in CHOICES:
        hint = " (MPI runs through gradsync.integrations.mpi.all_reduce under mpirun)" if name == "mpi" else ""
        raise ConfigError(f"transport must be one of {', '.join(CHOICES)}, got {name!r}{hint}")
    if name == "shm" and (device != "cpu" or stall_warning):
        raise ConfigError(f"transport 'shm' takes CPU tensors without stall_warning, got a {device} tensor"
                          + (f" and stall_warning={stall_warning!r}" if stall_warning else ""))


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
    """Whether the group's messages travel on Gloo (its own, or the gradsync backend's engine)."""
    import torch.distributed as dist

    return dist.get_backend(group) in ("gloo", "gradsync")


__all__ = ["CHOICES", "DistributedTransport", "GATHER_TAG", "GatherOverPost", "MemoryTransport", "MixedTransport",
           "ReducesFromChannel", "ShmTransport", "Transport", "TorchTransport", "auto_kind", "check_choice",
           "for_group", "group_key", "host_group", "post_each", "reduces_from_channel", "shared_group"]
