"""The shared-memory transport: the transport protocol over a group's ``SharedGroup``."""

from __future__ import annotations

from ....errors import ConfigError
from ..base import GatherOverPost, failure_key, group_key
from .group import SharedGroup
from .setup import shared_group


class ShmTransport(GatherOverPost):
    """The transport protocol over shared memory, for one collective of a group whose ranks
    share a host. Raises ``ConfigError`` when they cannot (``shared_group`` says why).

    Example, in each rank after ``dist.init_process_group("gloo", ...)`` on one host::

        transport = ShmTransport()
        transport.wait([transport.send(torch.ones(4), peer=1, tag=0)], time.monotonic() + 10)
    """

    def __init__(self, group=None, timeout: float = 60.0, shared: SharedGroup | None = None):
        if shared is None:
            shared = shared_group(group, timeout)
        if isinstance(shared, str):
            raise ConfigError(f"transport 'shm' needs every rank on one host, sharing one segment: {shared}")
        self.shared, self.rank, self.size, self.group = shared, shared.rank, shared.size, group
        self.group_key = group_key(group)          # the same progress engine as Gloo's on this group
        self.failure_key = failure_key(group)

    def recv(self, tensor, peer, tag):
        return self.shared.post([("recv", tensor, peer, tag)])[0]

    def send(self, tensor, peer, tag):
        return self.shared.post([("send", tensor, peer, tag)])[0]

    def post(self, ops):
        return self.shared.post(ops) if ops else []

    def wait(self, pending, deadline):
        self.shared.wait(pending, deadline)

    def reduce_from(self, handle, target, deadline):
        """Wait for receive ``handle`` and add what it brings into ``target`` (the executor's
        REDUCE), from the channel itself where it can: one copy per byte fewer."""
        self.shared.reduce_from(handle, target, deadline)

    def shared_buffers(self):
        """The group's shared buffers, which collectives that run by reads use (``runtime.reads``)."""
        from .buffers import SharedBuffers

        return SharedBuffers.of(self.shared)

    def close(self):
        pass
