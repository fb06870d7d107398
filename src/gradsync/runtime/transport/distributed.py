"""The torch.distributed transport: post receive, post send, wait with a deadline.

``DistributedTransport`` implements the transport protocol over torch.distributed (Gloo on
CPU, NCCL on GPU). Failures become ``PeerError`` naming the peer.

So that every survivor names the rank that actually failed, not just the neighbour it was
blocked on, failures are published in the group's rendezvous store: a rank that sees a
peer's connection close (or a peer stall past the deadline) records it under the
collective's key, first writer wins; a rank whose deadline passes reads that key before
raising. A Gloo wait cannot be resumed after it times out, so nobody polls in between.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ...errors import PeerError
from ..state import group_state
from .base import GATHER_TAG, GatherOverPost, failure_key, group_key, group_name, post_each

# GATHER_TAG and group_name live in base; the agreement and tracing import them from here too
__all__ = ["DistributedTransport", "GATHER_TAG", "Pending", "TorchTransport", "group_name"]


@dataclass
class Pending:
    """One posted operation: what to wait for and whom it involves."""

    work: object
    peer: int
    kind: str          # "recv" or "send"
    tag: int


log = logging.getLogger("gradsync")
# The last operations' Work objects, kept alive a while after they complete. Freeing a Gloo
# send or receive as soon as its wait returns made a 4 KB ring all-reduce 5x slower (N = 2,
# median of 5 launches: 4.6 ms against 0.85 ms, benchmarks/runtime_overheads.py), with
# Gloo's event-loop thread using 3-7x the CPU; freed 32 operations later, they cost nothing.
# The price: the tensors of the last 32 operations stay referenced until later ones replace them.
_recent: deque = deque(maxlen=32)


def _store():
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:   # no store (an unusual init): failures are then named locally only
        return None


class DistributedTransport(GatherOverPost):
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
        store = _store()
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

    def failure_of(self, exc: Exception, p: Pending, deadline: float) -> PeerError:
        """The PeerError to raise for operation ``p`` that failed with ``exc``, naming the rank
        that failed first anywhere in the group (read from, or posted to, the store), by
        ``deadline`` + 2 s at the latest. A store that does not answer (its host stalled, or
        this rank's link cut) would hold every store call for good, whatever its timeout (seen
        with a stopped store): the calls run on a thread of their own, and past that bound the
        answer is that the store's host, rank 0, is unreachable."""
        answer: list = []
        thread = threading.Thread(target=lambda: answer.append(self._failure_of(exc, p, deadline)), daemon=True,
                                  name="gradsync-roll-call")
        thread.start()
        thread.join(max(0.0, deadline + 2.0 - time.monotonic()))
        if answer:
            return answer[0]
        return self._store_gone(_peer_error(exc, p, self.rank))

    def _failure_of(self, exc: Exception, p: Pending, deadline: float) -> PeerError:
        own = _peer_error(exc, p, self.rank)
        timed_out = own.op_detail == "timeout"
        store = _store()
        dead = self._dead_here()
        if dead:                     # a process of this host is gone: that is the rank, at once
            error = PeerError(f"rank {self.rank}: rank {dead[0][0]} died (process {dead[0][1]} is gone) while this "
                              f"rank waited to {'receive from' if p.kind == 'recv' else 'send to'} rank {p.peer}",
                              peer=dead[0][0], op=p.kind)
            try:
                store.compare_set(self.failure_key, "", f"{error.peer}|{error}")
                posted = self._notice(store)
            except Exception:
                posted = None
            return error if posted is None or posted[0] == error.peer else \
                PeerError(f"rank {self.rank}: collective abandoned: {posted[1]}", peer=posted[0], op=p.kind)
        if store is None:
            return own
        try:
            store.set(self._alive_key(self.rank), "1")    # for anyone's roll call
        except Exception:
            pass
        if own.peer is None:        # a collective step failed: find who is missing
            return self._roll_call(store, own, deadline + 1.0)
        if own.op_detail == "closed" and self._checked_in(store, own.peer, grace=0.5):
            # the peer lives: Gloo closed its connections after a failure of its own, so
            # naming it would blame a survivor (seen in the fault campaign): find who is missing
            return self._roll_call(store, own, deadline + 1.0)
        if timed_out:
            # nobody may have seen a connection close (the kill trials found a victim whose
            # death no survivor's socket reported): the peer waited on may be a survivor that
            # waits in turn, so whoever has not checked in is named, not the peer
            return self._roll_call(store, own, time.monotonic() + 1.0, suspect=own.peer)
        try:
            store.compare_set(self.failure_key, "", f"{own.peer}|{own}")   # we saw it: tell the others
            posted = self._notice(store)
            if posted is None:
                return own
            peer, text = posted
        except Exception:           # the store is gone: its host, rank 0, has died
            return self._store_gone(own)
        if peer == own.peer:
            return own
        return PeerError(f"rank {self.rank}: collective abandoned: {text} (this rank was waiting for rank "
                         f"{p.peer})", peer=peer, op=p.kind)

    def _dead_here(self) -> list[tuple[int, int]]:
        """(rank, pid) of the group's ranks on this host whose processes are gone, where the
        group's host map (kept by its first exchange) says which processes they are: a survivor
        that has not met the failure yet is never named so."""
        from .hosts import host_map_kept

        found = host_map_kept(self.group)
        if found is None or not found.processes:
            return []
        here = found.host[self.rank]
        return [(r, found.processes[r][0]) for r in range(self.size) if r != self.rank and found.dead(r, here)]

    def publish(self, error: PeerError) -> None:
        """Post a failure seen elsewhere (another transport of the same group) as this group's
        notice, first writer wins, and check in alive: the ranks that wait here then name it."""
        store = _store()
        if store is None or error.peer is None:
            return
        try:
            store.set(self._alive_key(self.rank), "1")
            store.compare_set(self.failure_key, "", f"{error.peer}|{error}")
        except Exception:        # the store is gone: the others' own timeouts name rank 0
            pass

    def _notice(self, store) -> tuple[int, str] | None:
        """The failure posted for this group, as (rank, message), if any."""
        if not store.check([self.failure_key]):
            return None
        peer, _, text = store.get(self.failure_key).decode().partition("|")
        return int(peer), text

    def _checked_in(self, store, rank: int, grace: float) -> bool:
        """Whether ``rank`` checks in (it met the failure alive) within ``grace`` seconds.
        No need to wait the whole grace once every other rank has checked in: a survivor
        checks in before its connections can close, so ``rank`` alone missing is gone."""
        until = time.monotonic() + grace
        try:
            while not store.check([self._alive_key(rank)]):
                if time.monotonic() >= until or self._missing(store) == [rank]:
                    return False
                time.sleep(0.02)
            return True
        except Exception:
            return False

    def _alive_key(self, rank: int) -> str:
        """Where ``rank`` checks in once it has met this group's failure, alive."""
        return f"{self.failure_key}/alive/{rank}"

    def _missing(self, store) -> list[int]:
        """Ranks that have not checked in since the group failed."""
        return [r for r in range(self.size) if not store.check([self._alive_key(r)])]


    def _store_gone(self, own: PeerError) -> PeerError:
        """The error when the store cannot be reached: its host, rank 0, has died (unless this
        is rank 0)."""
        if self.rank == 0:
            return own
        waited = f"rank {own.peer}" if own.peer is not None else "its peers"
        return PeerError(f"rank {self.rank}: rank 0 is unreachable (it hosts the rendezvous store) while "
                         f"waiting for {waited}", peer=0, op=own.op)

    def _roll_call(self, store, own: PeerError, until: float, suspect: int | None = None) -> PeerError:
        """A collective step failed, or timed out, without saying which rank is gone. Every
        survivor checks in when it meets the failure, at the latest by its own deadline; so
        unless a rank that saw the failure names it first, who has not checked in by ``until``
        (this rank's deadline plus a margin) is named: ``suspect`` (the peer waited on) if it is
        among several missing, else the first of them."""
        try:
            while True:
                posted = self._notice(store)
                if posted is not None:
                    return PeerError(f"rank {self.rank}: collective abandoned: {posted[1]}", peer=posted[0],
                                     op=own.op)
                missing = self._missing(store)
                # all others are here (the missing one is the culprit), or time is up
                if len(missing) <= 1 or time.monotonic() >= until:
                    break
                time.sleep(0.05)
        except Exception:           # the store is gone: its host, rank 0, has died
            return self._store_gone(own)
        if not missing:
            return own
        gone = [r for r, _ in self._dead_here() if r in missing]
        named = gone[0] if gone else suspect if suspect in missing and len(missing) > 1 else missing[0]
        if named == own.peer:
            error = own
        else:
            error = PeerError(f"rank {self.rank}: collective abandoned: rank(s) {missing} did not check in after "
                              f"the group failed", peer=named, op=own.op)
        try:
            store.compare_set(self.failure_key, "", f"{named}|{error}")
        except Exception:
            pass
        return error


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


def _peer_error(exc: Exception, p: Pending, rank: int) -> PeerError:
    text = str(exc)
    if "Timed out" in text or "deadline" in text or "timeout" in text.lower():
        why, kind = "did not answer before the timeout", "timeout"
    elif "closed by peer" in text or "Connection reset" in text or "Broken pipe" in text:
        why, kind = "closed its connection (the process probably died)", "closed"
    else:
        why, kind = f"failed: {text.splitlines()[0][:200] if text else type(exc).__name__}", "error"
    direction = "receive from" if p.kind == "recv" else "send to" if p.kind == "send" else "agree with"
    error = PeerError(f"rank {rank}: {direction} rank {p.peer} {why}", peer=p.peer if p.peer >= 0 else None,
                      op=p.kind)
    error.op_detail = kind
    return error


PEER_TROUBLE = ("closed by peer", "connection reset", "broken pipe", "timed out", "timeout", "read error",
                "connection closed", "connect", "aborted", "socket", "eof", "unreachable")


def _peer_trouble(text: str) -> bool:
    """Whether an engine's error speaks of its peers (a connection, a timeout) rather than of
    the call's arguments.

    >>> _peer_trouble("[pair.cc:553] Connection closed by peer [127.0.0.1]:8075"), _peer_trouble("Invalid scalar type")
    (True, False)
    """
    low = text.lower()
    return any(word in low for word in PEER_TROUBLE)


ROLL_CALL_S = 60.0       # how long a roll call may wait on a group that states no timeout (a Gloo group)


def named_failure(group, what: str, exc: BaseException, timeout: float | None = None,
                  started: float | None = None) -> BaseException:
    """The error of an engine collective that failed with ``exc``: a ``PeerError`` naming the
    rank that is missing (the survivors check in at the group's store; who does not is named),
    or ``exc`` itself when it is not a failure of the group (a bad argument).

    Example, when Gloo's all_reduce failed with ``exc``: ``named_failure(group, "gloo's all_reduce", exc).peer``.
    """
    if not isinstance(exc, RuntimeError) or isinstance(exc, (ValueError, TypeError, PeerError)) \
            or not _peer_trouble(str(exc)):
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
