"""Waiting on a group's segment, and naming the rank that failed (see ``shm``).

Nobody moves data in the background: ``post`` and ``wait`` progress every pending operation
of the group. A waiting rank spins ``SPIN_S``, then sleeps on its doorbell (a futex word in the
segment that a peer which moved something for it rings); every
``CHECK_EVERY_S`` a blocked rank checks its peers' processes, and the first rank to see a
failure records it in the segment's header, so every survivor names the same rank.
"""

from __future__ import annotations

import time

import torch

from ....errors import PeerError
from . import _native
from .ring import Channels, Op
from .segment import (ACROSS, BELL, BLOCKED, CLOSED, DIED, FAILED, LEFT, NOBODY, PID, REMOTE, SILENT, START,
                      failure_word, remove, start_time, stopped)

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
        bell = self.layout.rank_word(self.rank, BELL)
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
                if self.failure is not None:         # cancelled meanwhile (an abort)
                    raise self.failure
                if now >= next_check or now >= deadline:
                    if waiting is None and now >= deadline:
                        self._outside(outside, True)
                    error = self._check(waiting, deadline)
                    # frames a peer published just before dying or leaving still count
                    if error is not None and not self.progress():
                        self._fail(error)
                    next_check = now + CHECK_EVERY_S
                # sleep until a peer rings: read the bell, say so, look once more, then sleep on
                # the bell's word (the kernel compares it first: a ring after the look is not lost)
                rung = self._load(bell) & 0xFFFFFFFF
                self._store(sleeping, 1)
                if self.progress(flush=True):        # idle: free the channels for the senders
                    idle_since = time.monotonic()
                elif not all(op.done for op in pending) or outside is not None:
                    _native.futex_wait(self.bells[self.rank], rung - (1 << 32) if rung >= 1 << 31 else rung,
                                       int(max(1e-4, min(NAP_S, next_check - now)) * 1e9))
                self._store(sleeping, 0)
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
        word = int(ctl[FAILED])
        failed, why = word & 0xFFFFFFFF, word >> 32
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
        # one compare-and-swap: of two ranks recording at once, one wins, and both name its rank
        _native.cas(self.address + 8 * FAILED, NOBODY, failure_word(rank, why))

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
        (None: a rank waiting for another host, where this host cannot see). A rank stopped
        while it waited keeps the word it had, so the waits can close on themselves; the rank
        holding all up is then in that loop, never this rank: the stopped one, else the one
        whose word closed it (a random campaign named the survivor itself before)."""
        chain = [self.rank]
        while peer not in chain:
            chain.append(peer)
            nxt = int(self.ctl[self.layout.rank_word(peer, BLOCKED)])
            if nxt == ACROSS:
                return None
            if nxt < 0:
                return peer
            peer = nxt
        loop = [r for r in chain[chain.index(peer):] if r != self.rank] or [peer]
        pid = self.layout.rank_word
        return next((r for r in loop if stopped(int(self.ctl[pid(r, PID)]))), loop[-1])

    def cancel(self, error: PeerError) -> None:
        """Give the group up (an abort, from any thread): a wait in progress raises ``error``
        at its next look (within ``CHECK_EVERY_S``), and so does every later call."""
        self.failure = error
        buffers = self.buffers
        if buffers is not None:
            buffers.native.cancel()
        self.wake_self()

    def wake_self(self) -> None:
        """Ring this rank's own doorbell (a watcher thread whose operation on another engine
        completed); nothing once the segment is unmapped."""
        with self._unmap_lock:
            if not self.unmapped:
                self.ring(self.rank)

    def close(self) -> None:
        """Leave: tell the peers (a peer still waiting for this rank fails at once), then unmap
        the segment. The caller sees that no collective of the group runs now (its progress
        engine is stopped): every later call fails with the group's error before it touches the
        mapping, and views of the mapping are dropped before it goes. A mapping some numpy view
        still holds stays mapped (mmap refuses: safe, and freed with the process)."""
        with self._unmap_lock:
            if self.unmapped:
                return
            if not self.closed:
                self.closed = True
                self.ctl[self.layout.rank_word(self.rank, CLOSED)] = 1
            if self.failure is None:
                self.failure = PeerError(f"rank {self.ranks[self.rank]}: this rank's shared-memory group is closed",
                                         peer=None, op="closed")
            if self.buffers is not None:
                self.buffers.release()
                self.buffers = None
            self.ctl = self.data = None
            try:
                self.mm.close()
                self.unmapped = True
            except BufferError:       # a view is still alive somewhere: leave it mapped
                pass
