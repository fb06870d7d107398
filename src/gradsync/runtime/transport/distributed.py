"""The torch.distributed transport: post receive, post send, wait with a deadline.

``DistributedTransport`` implements the transport protocol over torch.distributed (Gloo on
CPU, NCCL on GPU). Failures become ``PeerError`` naming the peer.

So that every survivor names the rank that actually failed, not just the neighbour it was
blocked on, failures are published in the group's rendezvous store (``naming``). A Gloo wait
cannot be resumed after it times out, so nobody polls in between.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections import deque

import torch
import torch.distributed as dist

from ...errors import PeerError
from ..state import group_state
from .base import GATHER_TAG, GatherOverPost, failure_key, group_key, group_name, post_each
from .naming import FailureNaming, Pending, peer_trouble, rendezvous_store

# GATHER_TAG and group_name live in base; the agreement and tracing import them from here too
__all__ = ["DistributedTransport", "GATHER_TAG", "Pending", "TorchTransport", "group_name"]


log = logging.getLogger("gradsync")
# The last operations' Work objects, kept alive a while after they complete. Freeing a Gloo
# send or receive as soon as its wait returns made a 4 KB ring all-reduce 5x slower (N = 2,
# median of 5 launches: 4.6 ms against 0.85 ms, benchmarks/runtime_overheads.py), with
# Gloo's event-loop thread using 3-7x the CPU; freed 32 operations later, they cost nothing.
# The price: the tensors of the last 32 operations stay referenced until later ones replace them.
_recent: deque = deque(maxlen=32)


class DistributedTransport(GatherOverPost, FailureNaming):
    """torch.distributed point-to-point operations within ``group``, for one collective.

    ``stall_warning``: seconds after which a still-running collective logs a warning naming
    the peer it waits for (a straggler), once. On NCCL a step's sends and receives are posted
    together (``batch_isend_irecv``: one NCCL group), on Gloo one by one.

    Example, after ``dist.init_process_group``::

        transport = DistributedTransport()
        transport.wait([transport.send(torch.ones(4), peer=1, tag=0)], time.monotonic() + 10)
    """

    def __init__(self, group=None, stall_warning: float | None = None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self._global = [dist.get_global_rank(group, r) if group is not None else r for r in range(self.size)]
        self.failure_key = failure_key(group)     # one notice per group (see there)
        self.group_key = group_key(group)         # the collectives of one group run one at a time
        self.sequence = group_state(self.group_key).advance("collectives")     # its number in this process
        self.waiting_for: Pending | None = None
        self._batched = dist.get_backend(group) == "nccl"
        self.started = time.monotonic()
        self._timer = None
        if stall_warning:
            self._timer = threading.Timer(stall_warning, self._warn_stall, args=(stall_warning,))
            self._timer.daemon = True
            self._timer.start()

    def _warn_stall(self, after):
        late = self._late_ranks(settle=min(1.0, after / 2))
        p = self.waiting_for
        if p is None:                  # finished while we looked: nobody to blame
            return
        waited = time.monotonic() - self.started
        if late:
            log.warning("gradsync: rank %d: straggler: rank(s) %s had not started collective #%d %.1f s after "
                        "this rank did", self.rank, late, self.sequence, waited)
        else:
            who = f"rank {p.peer} ({p.kind})" if p.peer >= 0 else "its peers"
            log.warning("gradsync: rank %d: collective #%d still waiting for %s after %.1f s (every rank has "
                        "started it: a slow link or a slow rank)", self.rank, self.sequence, who, waited)

    def _late_ranks(self, settle: float) -> list[int]:
        """Ranks that have not started this collective yet: each stalled rank checks in at the
        store when its warning is due, and whoever has not within ``settle`` seconds is late
        (every rank needs every other's data, so none can be done while another is missing)."""
        store = rendezvous_store()
        if store is None:
            return []
        prefix = f"gradsync/stall/{self.failure_key}/{self.sequence}/"
        try:
            store.set(prefix + str(self.rank), "1")
            deadline = time.monotonic() + settle
            while True:
                late = [r for r in range(self.size) if not store.check([prefix + str(r)])]
                if not late or time.monotonic() >= deadline:
                    return late
                time.sleep(0.05)
        except Exception:      # the store's host is gone: the timeout will name it
            return []

    def close(self):
        if self._timer is not None:
            self._timer.cancel()

    def post(self, ops: list[tuple[str, torch.Tensor, int, int]]) -> list[Pending]:
        """Post ("send" | "recv", tensor, peer, tag) operations: batched on NCCL, in turn on Gloo."""
        if not ops:
            return []
        if not self._batched:
            return post_each(self, ops)
        p2p = [dist.P2POp(dist.isend if kind == "send" else dist.irecv, t, self._global[p], self.group, tag)
               for kind, t, p, tag in ops]
        try:
            works = dist.batch_isend_irecv(p2p)
        except (RuntimeError, dist.DistBackendError) as exc:
            works = [_Failed(exc)] * len(ops)
        _recent.extend(works)
        return [Pending(w, p, kind, tag) for w, (kind, _, p, tag) in zip(works, ops)]

    def recv(self, tensor: torch.Tensor, peer: int, tag: int) -> Pending:
        work = _post(dist.irecv, tensor, self._global[peer], group=self.group, tag=tag)
        return Pending(work, peer, "recv", tag)

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> Pending:
        work = _post(dist.isend, tensor, self._global[peer], group=self.group, tag=tag)
        return Pending(work, peer, "send", tag)

    def wait(self, pending: list[Pending], deadline: float) -> None:
        """Wait for every posted operation, all within ``deadline`` (time.monotonic())."""
        for p in pending:
            self.waiting_for = p
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError("deadline passed")
                p.work.wait(datetime.timedelta(seconds=left))
            except (RuntimeError, TimeoutError, dist.DistBackendError) as exc:
                self.close()
                raise self.failure_of(exc, p, deadline) from None
        self.waiting_for = None


class _Failed:
    """An operation whose posting already failed (the peer's connection was gone): waiting
    on it raises that failure, so it is named like any other."""

    def __init__(self, exc: Exception):
        self.exc = exc

    def wait(self, timeout=None):
        raise self.exc


def _post(fn, *args, **kwargs):
    """Post a send or receive; its Work object is also kept in ``_recent`` for a while."""
    try:
        work = fn(*args, **kwargs)
    except (RuntimeError, dist.DistBackendError) as exc:
        return _Failed(exc)
    _recent.append(work)
    return work


ROLL_CALL_S = 60.0       # how long a roll call may wait on a group that states no timeout (a Gloo group)


def named_failure(group, what: str, exc: BaseException, timeout: float | None = None,
                  started: float | None = None) -> BaseException:
    """The error of an engine collective that failed with ``exc``: a ``PeerError`` naming the
    rank that is missing (the survivors check in at the group's store; who does not is named),
    or ``exc`` itself when it is not a failure of the group (a bad argument).

    Example, when Gloo's all_reduce failed with ``exc``: ``named_failure(group, "gloo's all_reduce", exc).peer``.
    """
    if not isinstance(exc, RuntimeError) or isinstance(exc, (ValueError, TypeError, PeerError)) \
            or not peer_trouble(str(exc)):
        return exc                       # a bad argument ("Invalid scalar type"): the engine's own words
    # a survivor blocked in the engine meets the failure only at its own timeout (in Gloo's ring
    # all-gather only the dead rank's neighbours see its socket close), counted from when it
    # began the collective, about when this rank did (``started``): the roll call waits until
    # then before it names one of several ranks missing, so that a slow survivor is not named
    timeout = timeout or float(getattr(group, "timeout", 0) or 0) or ROLL_CALL_S
    try:
        transport = DistributedTransport(group)
        deadline = (started if started is not None else time.monotonic()) + timeout
        error = transport.failure_of(exc, Pending(None, -1, "collective", 0), deadline)
    except Exception:                    # the store is gone too: the engine's own words
        return exc
    first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    return PeerError(f"{error} (in {what}: {first})", peer=error.peer, op=error.op)



TorchTransport = DistributedTransport   # the name used before the transport protocol
