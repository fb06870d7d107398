"""Who a failed wait names: the rank that failed first anywhere in the group.

A survivor's own error names only the peer it was blocked on, which may be a survivor blocked
in turn. So failures are published in the group's rendezvous store: a rank that sees a peer's
connection close records it under the group's key, first writer wins; a rank that times out
holds a roll call (every survivor checks in when it meets the failure; whoever has not by the
deadline is named); a process of this host that is gone is named at once. ``FailureNaming``
is that logic, mixed into the torch.distributed transport.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch.distributed as dist

from ...errors import PeerError


@dataclass
class Pending:
    """One posted operation: what to wait for and whom it involves."""

    work: object
    peer: int
    kind: str          # "recv" or "send"
    tag: int


def rendezvous_store():
    """The default group's store, where failures are posted, or None where there is none."""
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:   # no store (an unusual init): failures are then named locally only
        return None


class FailureNaming:
    """The failure naming of a transport that has ``group``, ``rank``, ``size`` and
    ``failure_key`` (the group's notice in the store).

    Example, in a transport whose receive from rank 2 failed with ``exc``:
    ``self.failure_of(exc, Pending(work, 2, "recv", tag), deadline).peer``.
    """

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
        store = rendezvous_store()
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
        store = rendezvous_store()
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


def peer_trouble(text: str) -> bool:
    """Whether an engine's error speaks of its peers (a connection, a timeout) rather than of
    the call's arguments.

    >>> peer_trouble("[pair.cc:553] Connection closed by peer [127.0.0.1]:8075"), peer_trouble("Invalid scalar type")
    (True, False)
    """
    low = text.lower()
    return any(word in low for word in PEER_TROUBLE)
