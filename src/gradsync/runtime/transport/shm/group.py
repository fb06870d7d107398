"""Waiting on a group's segment, and naming the rank that failed (see ``shm``).

Nobody moves data in the background: ``post`` and ``wait`` progress every pending operation
of the group. A waiting rank spins ``SPIN_S``, then blocks on its doorbell; every
``CHECK_EVERY_S`` a blocked rank checks its peers' processes, and the first rank to see a
failure records it in the segment's header, so every survivor names the same rank.
"""

from __future__ import annotations

import os
import select
import time

import torch

from ....errors import PeerError
from .ring import Channels, Op
from .segment import (ACROSS, BLOCKED, CLOSED, DIED, FAILED, LEFT, NOBODY, PID, REMOTE, SILENT, START, WHY,
                      remove, start_time)

SPIN_S = 50e-6                      # spin this long before blocking on the doorbell (1 ms: 4x slower, loaded)
NAP_S = 2e-3                        # the longest block: bounds the cost of a missed ring
CHECK_EVERY_S = 0.01                # liveness checks while blocked


class SharedGroup(Channels):
    """One process group's segment and this rank's side of its channels; every collective of
    the group on shared memory goes through it, one at a time (they share the group's
    progress engine). Made by ``shared_group`` (all the group's ranks) or ``host_group`` (the
    ranks of this host, in a group spanning several). ``rank``, ``size`` and every peer here
    are local (0..size-1); ``ranks[i]`` is local rank i's rank in the process group, which
    messages and ``PeerError.peer`` name, and the segment records a failed rank by."""

    # --- waiting ------------------------------------------------------------------------

    def wait(self, pending: list[Op], deadline: float, outside=None) -> None:
        """Progress until every op of ``pending`` is done, or raise ``PeerError`` naming a rank.

        ``outside`` (a group spanning hosts): ``outside(expired)`` says whether this wait's
        operations on the other engine are done too; it raises their ``PeerError``, and with
        ``expired`` (the deadline has passed) it raises the timeout's. Their completions ring
        this rank's doorbell, so waiting for them still keeps the channels moving."""
        if self.failure is not None:
            raise self.failure
        started = time.monotonic()
        idle_since, next_check = started, started + CHECK_EVERY_S
        blocked = False
        sleeping, blocked_on = self.sleeping[self.rank], self.layout.rank_word(self.rank, BLOCKED)
        wanted = [op for op in pending if op.kind == "recv" and not op.done]
        for op in wanted:
            op.wanted = True
            self.wanted[op.peer] += 1
        try:
            while True:
                if self.progress():
                    idle_since = time.monotonic()
                if all(op.done for op in pending) and (outside is None or self._outside(outside, False)):
                    return
                now = time.monotonic()
                idle = now - idle_since
                if idle < SPIN_S:
                    continue
                waiting = next((op for op in pending if not op.done), None)
                self.ctl[blocked_on] = ACROSS if waiting is None else waiting.peer
                blocked = True
                if now >= next_check or now >= deadline:
                    if waiting is None and now >= deadline:
                        self._outside(outside, True)
                    error = self._check(waiting, deadline)
                    # frames a peer published just before dying or leaving still count
                    if error is not None and not self.progress():
                        self._fail(error)
                    next_check = now + CHECK_EVERY_S
                # block until a peer rings: say so, look once more, then wait on the doorbell
                self.ctl[sleeping] = 1
                if self.progress(flush=True):        # idle: free the channels for the senders
                    idle_since = time.monotonic()
                elif not all(op.done for op in pending) or outside is not None:
                    select.select([self.bells[self.rank]], [], [], max(0.0, min(NAP_S, next_check - now)))
                self.ctl[sleeping] = 0
                try:
                    os.read(self.bells[self.rank], 4096)
                except BlockingIOError:
                    pass
        finally:
            for op in wanted:
                op.wanted = False
                self.wanted[op.peer] -= 1
            if blocked:
                self.ctl[blocked_on] = NOBODY

    def reduce_from(self, op: Op, target: torch.Tensor, deadline: float) -> None:
        """Finish receive ``op`` by adding it into ``target`` (flat, its dtype): frames still in
        the channel are added from there, without the copy to the receive's own tensor."""
        size = op.tensor.element_size()
        flat = op.tensor.reshape(-1)
        for offset, n in op.landed:
            target[offset // size:(offset + n) // size].add_(flat[offset // size:(offset + n) // size])
            self.added_after_copy += n
        if not op.done:
            op.target = target
            self.wait([op], deadline)

    def busy(self) -> bool:
        """Whether this rank has something in flight here (the group state keeps a busy group)."""
        return not self.idle()

    # --- failures -----------------------------------------------------------------------

    def _check(self, op: Op | None, deadline: float) -> PeerError | None:
        """The group's failure if a peer died or left, or the deadline has passed. The first
        rank to see a failure records it in the segment, so every survivor names that rank
        (not one that gave up on it first and left). ``op`` None: this rank waits only for
        ranks of other hosts (their engine names those)."""
        ctl, lay = self.ctl, self.layout
        if ctl[FAILED] < 0:
            gone = next((r for r in self.peers if not self.alive(r)), None)
            if gone is not None:
                self._record(self.ranks[gone], LEFT if ctl[lay.rank_word(gone, CLOSED)] else DIED)
            elif op is not None and time.monotonic() >= deadline:
                end = self._end_of_chain(op.peer)
                # a rank waiting across hosts learns who failed there from the engine: give it a second
                if end is not None or time.monotonic() >= deadline + 1.0:
                    self._record(self.ranks[op.peer if end is None else end], SILENT)
        if ctl[FAILED] < 0:
            return None
        failed, why = int(ctl[FAILED]), int(ctl[WHY])
        how = {LEFT: "left the group", SILENT: "did not answer before the timeout",
               REMOTE: "failed (seen by a rank of this host that waited for it across hosts)"}.get(why, "failed")
        if why == DIED and failed in self.ranks:
            how = f"died (process {int(ctl[lay.rank_word(self.ranks.index(failed), PID)])} is gone)"
        doing = "" if op is None else \
            f" to {'receive from' if op.kind == 'recv' else 'send to'} rank {self.ranks[op.peer]}"
        return PeerError(f"rank {self.ranks[self.rank]}: rank {failed} {how} while this rank waited{doing}",
                         peer=failed, op="recv" if op is None else op.kind)

    def raise_failure(self, waiting, deadline: float) -> None:
        """Raise the group's ``PeerError`` if a peer died or left, or the deadline has passed
        while this rank waits for ``waiting.peer`` (a barrier of the shared buffers)."""
        error = self._check(waiting, deadline)
        if error is not None:
            self._fail(error)

    def _record(self, rank: int, why: int) -> None:
        """Record the group's failed rank (its rank in the process group) and how."""
        if self.ctl[FAILED] < 0:      # two ranks at once: either may win, both name a failed rank
            self.ctl[WHY] = why
            self.ctl[FAILED] = rank

    def _outside(self, outside, expired: bool) -> bool:
        try:
            return outside(expired)
        except PeerError as error:
            self.abandon(error)
            raise

    def abandon(self, error: PeerError) -> None:
        """This rank met ``error`` on another engine (a rank of another host failed): record
        its rank in the segment, so this host's ranks name it too, and fail from now on."""
        if error.peer is not None and error.peer not in self.ranks:
            self._record(error.peer, REMOTE)
        self.failure = error
        remove(self.name)

    def _fail(self, error: PeerError) -> None:
        self.failure = error
        remove(self.name)              # rank 0 may have died before unlinking them
        raise error

    def alive(self, r: int) -> bool:
        """Whether rank ``r``'s process lives and has not left the group."""
        ctl, lay = self.ctl, self.layout
        if ctl[lay.rank_word(r, CLOSED)]:
            return False
        return start_time(int(ctl[lay.rank_word(r, PID)])) == int(ctl[lay.rank_word(r, START)])

    def _end_of_chain(self, peer: int) -> int | None:
        """Follow who waits for whom from ``peer``: the last rank is the one holding all up
        (None: a rank waiting for another host, where this host cannot see)."""
        seen = {self.rank}
        while peer not in seen:
            seen.add(peer)
            nxt = int(self.ctl[self.layout.rank_word(peer, BLOCKED)])
            if nxt == ACROSS:
                return None
            if nxt < 0:
                return peer
            peer = nxt
        return peer

    def close(self) -> None:
        """Tell the peers this rank has left (a peer still waiting for it fails at once)."""
        if not self.closed:
            self.closed = True
            self.ctl[self.layout.rank_word(self.rank, CLOSED)] = 1
