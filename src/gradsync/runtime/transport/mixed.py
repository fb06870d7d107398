"""The mixed transport: shared memory between the ranks of one host, the group's engine (Gloo)
between hosts, in one collective.

A group spanning several hosts with several ranks on some (2 machines x 4 processes) has
two kinds of peers for each rank; this transport routes every send and receive by its peer:
a rank of the same host through the host's segment (``shm.host_group``: one copy in, the
executor's REDUCE adds straight from the channel), any other rank through torch.distributed.
The hierarchical all-reduce is its natural user: its phases inside a machine run at memory
speed, its rails across machines on the network.

Waiting over both kinds: shared memory moves only while a rank of the host progresses it, so
a rank must not block in a Gloo wait while its host's peers need it (with messages larger than
a channel's frames, two ranks of one host could each wait for the other that way). So while
this rank has anything in flight in its host's segment, the Gloo operations it waits for are
waited for by watcher threads, which ring the rank's doorbell when they complete, and the rank
stays in the shared-memory wait, progressing its channels, until its shared-memory operations
are done and the watchers report the rest. With nothing in flight there (the hierarchical
all-reduce's rails of a small message), it waits in Gloo itself, without the hand-over.

Failures keep their names on both sides. A rank that sees a failure through Gloo (a peer on
another host died) records that rank in its host's segment, so its host's ranks name it too;
a rank that sees one through shared memory (a peer of its host died) posts it as the group's
notice in the store, so the ranks of other hosts, whose Gloo operations with it then fail or
time out, name it too (``DistributedTransport.failure_of`` reads that notice).
"""

from __future__ import annotations

import atexit
import datetime
import queue
import threading
import time

from ...errors import ConfigError, PeerError
from .base import GatherOverPost
from .distributed import DistributedTransport, Pending
from .shm import SharedGroup, host_group

WATCHERS_LIMIT = 64          # threads waiting for Gloo operations, at most, per process
SETTLE_S = 3.0               # at exit, how long to let watchers still in a Gloo wait finish


class _Watchers:
    """Daemon threads that each wait for one Gloo operation at a time, started as operations
    outnumber them, up to ``limit`` (kept, idle, for the next collective). Daemons, so that a
    process does not wait at exit for operations of a group that failed."""

    def __init__(self, limit: int = WATCHERS_LIMIT):
        self.limit = limit
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = self._busy = 0

    def submit(self, job) -> None:
        with self._lock:
            self._busy += 1
            if self._busy > self._threads and self._threads < self.limit:
                if self._threads == 0:          # the first watcher: settle them at exit (see settle)
                    atexit.register(self.settle, SETTLE_S)
                self._threads += 1
                threading.Thread(target=self._loop, name="gradsync-watcher", daemon=True).start()
        self._jobs.put(job)

    def settle(self, seconds: float) -> bool:
        """Wait up to ``seconds`` until no watcher is inside a wait; return whether none is.
        Run at exit once a watcher has started: a daemon thread still inside a Gloo wait when
        the interpreter ends aborts the process ("terminate called without an active
        exception"), and after a failure, operations with a live peer stay pending until the
        group is destroyed or the watcher's timeout."""
        until = time.monotonic() + seconds
        while self._busy and time.monotonic() < until:
            time.sleep(0.01)
        return not self._busy

    def _loop(self):
        while True:
            job = self._jobs.get()
            try:
                job()
            finally:
                with self._lock:
                    self._busy -= 1


WATCHERS = _Watchers()


class _Remote:
    """A Gloo operation of a mixed collective: its handle, its tensor, and what its watcher saw."""

    __slots__ = ("pending", "tensor", "done", "error", "watched")

    def __init__(self, pending: Pending, tensor):
        self.pending, self.tensor = pending, tensor
        self.done = self.watched = False
        self.error: Exception | None = None


class MixedTransport(GatherOverPost):
    """The transport protocol over a group spanning hosts: shared memory to the ranks of this
    rank's host, torch.distributed (Gloo) to the others. A rank alone on its host (or whose
    host could not share a segment) uses Gloo to every peer. ``timeout``: how long a watcher
    waits for one Gloo operation (the collective's timeout).

    Example, in each rank after ``dist.init_process_group("gloo", ...)`` on 2 hosts x 2 ranks::

        transport = MixedTransport()            # rank 0: rank 1 by shared memory, 2 and 3 by Gloo
        transport.wait([transport.send(torch.ones(4), peer=1, tag=0)], time.monotonic() + 10)
    """

    def __init__(self, group=None, timeout: float = 60.0, shared: SharedGroup | str | None = None):
        self.group = group
        self.engine = DistributedTransport(group)
        self.rank, self.size = self.engine.rank, self.engine.size
        self.group_key, self.failure_key = self.engine.group_key, self.engine.failure_key
        if shared is None:
            shared = host_group(group, timeout)
        self.shared = shared if isinstance(shared, SharedGroup) else None
        if self.shared is not None and self.shared.ranks[self.shared.rank] != self.rank:
            raise ConfigError(f"the shared-memory group given is rank {self.shared.ranks[self.shared.rank]}'s, "
                              f"not rank {self.rank}'s")
        self.local = {} if self.shared is None else {r: i for i, r in enumerate(self.shared.ranks)}
        self._watch_until = time.monotonic() + timeout + 1.0

    # --- posting ------------------------------------------------------------------------

    def recv(self, tensor, peer, tag):
        return self.post([("recv", tensor, peer, tag)])[0]

    def send(self, tensor, peer, tag):
        return self.post([("send", tensor, peer, tag)])[0]

    def post(self, ops):
        """Post ("send" | "recv", tensor, peer, tag) operations, each on its peer's side."""
        out = [None] * len(ops)
        near = [i for i, op in enumerate(ops) if op[2] in self.local]
        far = [i for i, op in enumerate(ops) if op[2] not in self.local]
        if far:
            for i, pending in zip(far, self.engine.post([ops[i] for i in far])):
                out[i] = _Remote(pending, ops[i][1])
        if near:
            posted = self._local(self.shared.post, [(kind, t, self.local[peer], tag)
                                                    for kind, t, peer, tag in (ops[i] for i in near)])
            for i, handle in zip(near, posted):
                out[i] = handle
        return out

    def _watch(self, handle: _Remote) -> None:
        """In a watcher thread: wait for one Gloo operation, then wake the rank."""
        try:
            left = max(0.001, self._watch_until - time.monotonic())
            handle.pending.work.wait(datetime.timedelta(seconds=left))
        except Exception as exc:    # what the rank's wait turns into a PeerError
            handle.error = exc
        handle.done = True
        self.shared.wake_self()

    # --- waiting ------------------------------------------------------------------------

    def wait(self, pending, deadline):
        """Wait for every handle of ``pending``, progressing this host's channels meanwhile."""
        near = [h for h in pending if not isinstance(h, _Remote)]
        far = [h for h in pending if isinstance(h, _Remote)]
        if not far:
            if near:
                self._local(self.shared.wait, near, deadline)
        elif self.shared is None or (not near and self.shared.idle()):
            # no peer of this host needs this rank meanwhile: wait in Gloo itself (no hand-over)
            try:
                self.engine.wait([h.pending for h in far if not h.watched], deadline)
            except PeerError as error:
                if self.shared is not None:
                    self.shared.abandon(error)
                raise
        else:
            for h in far:
                if not h.watched:
                    h.watched = True
                    WATCHERS.submit(lambda h=h: self._watch(h))
            self._local(self.shared.wait, near, deadline, lambda expired: self._outside(far, expired, deadline))

    def _outside(self, far: list[_Remote], expired: bool, deadline: float) -> bool:
        """Whether the Gloo operations ``far`` are done; their failure (or, ``expired``, the
        timeout's) as the PeerError naming the rank that failed."""
        for h in far:
            if h.done and h.error is not None:
                raise self.engine.failure_of(h.error, h.pending, deadline)
        if all(h.done for h in far):
            return True
        if expired:
            late = next(h for h in far if not h.done)
            raise self.engine.failure_of(TimeoutError("deadline passed"), late.pending, deadline)
        return False

    def _local(self, fn, *args):
        """Run a shared-memory step; its failure is posted for the ranks of other hosts too."""
        try:
            return fn(*args)
        except PeerError as error:
            self.engine.publish(error)
            raise

    def reduce_from(self, handle, target, deadline):
        """Wait for receive ``handle`` and add what it brings into ``target``: from the
        channel itself for a rank of this host, from the receive's tensor for another."""
        if isinstance(handle, _Remote):
            self.wait([handle], deadline)
            target.add_(handle.tensor)
        else:
            self._local(self.shared.reduce_from, handle, target, deadline)

    def close(self):
        self.engine.close()
