"""The shared buffers of a group's segment: every rank's slot, readable by every rank of the
host, and the barrier between the rounds that read them (see ``segment`` for where they lie).

A collective on shared buffers copies each rank's data into its slot, then runs rounds of
direct reads (``runtime.reads``): no messages, no frames, no second copy. Between rounds the
ranks meet at a barrier: each publishes the barrier it reached in its ``ARRIVED`` word; the
last to arrive publishes it as the group's ``GENERATION`` and wakes every rank sleeping on that
word with one system call, and only when one said it sleeps (a wake-up that switches to the
woken rank cost 200 us here). A waiting rank spins ``SPIN_S`` (``CROWDED_SPIN_S`` when the host
has more ranks than cores: a spinning rank takes the core from the one it waits for), then
says it sleeps and sleeps on the generation in the kernel (``futex``: the kernel compares the
word before sleeping, so a release between the look and the sleep is not missed), ``NAP_S`` at
a time, checking every ``CHECK_EVERY_S`` that its peers live and that the deadline has not
passed, as the message path does (``SharedGroup``: the same failure record, so every survivor
names the same rank). Two ranks arriving last at the same instant may each miss the other's
word (x86 lets a load pass an earlier store): then nobody releases at once, and the sleepers
find everyone arrived at their next look, one nap later, never a hang.

Successive collectives alternate between two slots per rank (parity), so the copy-in of one
never overwrites what a slower rank still reads of the one before: by the time a rank is back
at a parity, every rank has passed a barrier of the collective in between, so it is done
reading. On x86 stores are seen in the order they were made, so a word published after the
data it covers is enough (and the futex wake is a system call, a full barrier anyway).
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from ....errors import MismatchError
from . import futex
from .group import CHECK_EVERY_S, SharedGroup
from .segment import ARRIVED, BLOCKED, GENERATION, NOBODY, SLOT_HEADER

SPIN_S = 50e-6               # spin this long on a peer's word before sleeping on it
CROWDED_SPIN_S = 5e-6        # the same with more ranks than cores
NAP_S = 2e-3                 # the longest sleep: bounds the cost of a missed wake-up
VIEWS = 4096                 # slot views kept (``view``)
WRAP = 1 << 31               # barrier marks count modulo this (non-negative int32 words)


class _Waiting:
    """What a barrier's wait looks like to ``SharedGroup``'s failure check (a receive from ``peer``)."""

    __slots__ = ("peer", "kind")

    def __init__(self, peer: int):
        self.peer, self.kind = peer, "recv"


class SharedBuffers:
    """This rank's view of its group's shared buffers: the slots and the barrier. Made once per
    ``SharedGroup`` (its ``buffers``), used by one collective at a time (the group's).

    Example, in each rank of a group on one host::

        buffers = SharedBuffers.of(shared_group())
        slots = buffers.begin(torch.float32)     # [ranks, capacity] this collective's slots
        slots[buffers.rank, :4] = 1.0
        buffers.barrier(time.monotonic() + 10)   # every rank's slot now readable
    """

    def __init__(self, group: SharedGroup):
        lay = group.layout
        self.group, self.rank, self.size = group, group.rank, group.size
        self.capacity = lay.region_bytes - SLOT_HEADER          # bytes of data a slot holds
        self._data = [torch.frombuffer(group.mm, dtype=torch.uint8, offset=lay.region(0, parity),
                                       count=group.size * lay.region_bytes).view(group.size, lay.region_bytes)
                      [:, SLOT_HEADER:] for parity in (0, 1)]
        # each slot's digest: the collective its rank runs in it (per parity: a rank one collective
        # ahead writes the other parity's, never the one a slower rank still compares)
        self._digests = [np.ndarray((group.size, 2), np.int64, buffer=group.mm, offset=lay.region(0, parity),
                                    strides=(lay.region_bytes, 8)) for parity in (0, 1)]
        self._words = np.frombuffer(group.mm, dtype=np.int32, count=2 * lay.words)
        self._arrived = [2 * lay.rank_word(r, ARRIVED) for r in range(group.size)]    # low halves, little-endian
        self._peer_words = [(r, self._arrived[r]) for r in range(group.size) if r != group.rank]
        self._generation = 2 * GENERATION                   # its low half; the high half: sleepers
        self._generation_address = self._words.ctypes.data + 4 * self._generation
        self._blocked = lay.rank_word(group.rank, BLOCKED)
        self.barriers = 0        # barriers passed: every rank passes the same ones, in order
        self.uses = 0            # collectives begun: their parity
        self.parity = 0          # the parity of the one begun last
        self._views: dict = {}   # (parity, dtype, capacity) -> the slots as that dtype
        self._columns: dict = {}  # (parity, dtype, row, start, stop) -> a view of them (``view``)
        self._current, self._dtype = None, None
        self.spin_s = CROWDED_SPIN_S if group.size > len(os.sched_getaffinity(0)) else SPIN_S

    @classmethod
    def of(cls, group: SharedGroup) -> "SharedBuffers":
        """The group's shared buffers (made on first use, kept on the group: one per group)."""
        if getattr(group, "buffers", None) is None:
            group.buffers = cls(group)
        return group.buffers

    def begin(self, dtype: torch.dtype) -> torch.Tensor:
        """This collective's slots, [ranks, capacity in elements of ``dtype``]: the next parity."""
        self.parity = self.uses & 1
        self.uses += 1
        key = (self.parity, dtype, self.capacity)
        slots = self._views.get(key)
        if slots is None:
            data = self._data[self.parity]
            slots = self._views[key] = data[:, :self.capacity // dtype.itemsize * dtype.itemsize].view(dtype)
            self._columns.clear()           # the capacity may have changed (tests cut it to force pieces)
        self._current, self._dtype = slots, dtype
        return slots

    def view(self, row: int | None, start: int, stop: int) -> torch.Tensor:
        """Elements [start, stop) of rank ``row``'s slot (None: of every rank's, [ranks, n]) in
        the collective begun last; views are kept (at most VIEWS), since making one costs as
        much as a small collective's sum."""
        key = (self.parity, self._dtype, row, start, stop)
        view = self._columns.get(key)
        if view is None:
            if len(self._columns) >= VIEWS:
                self._columns.clear()
            slots = self._current
            view = self._columns[key] = slots[:, start:stop] if row is None else slots[row, start:stop]
        return view

    def rows(self, ranks: tuple[int, ...], start: int, stop: int) -> torch.Tensor:
        """Elements [start, stop) of the slots of ``ranks`` only, [len(ranks), n] (a copy)."""
        return self._current[list(ranks), start:stop]

    def publish_digest(self, signature: bytes) -> None:
        """Write this collective's 16-byte digest where every rank reads it after the next barrier."""
        row = self._digests[self.parity][self.rank]
        row[0] = int.from_bytes(signature[:8], "little", signed=True)
        row[1] = int.from_bytes(signature[8:16], "little", signed=True)

    def check_digests(self) -> None:
        """After a barrier: every rank published this rank's digest, or ``MismatchError`` naming them."""
        rows = self._digests[self.parity].tolist()        # a few words: plain ints beat numpy's reductions
        mine = rows[self.rank]
        others = [r for r, row in enumerate(rows) if row != mine]
        if others:
            ranks = [self.group.ranks[r] for r in others]
            raise MismatchError(f"rank {self.group.ranks[self.rank]}: rank(s) {ranks} run a different collective "
                                f"(shape, dtype, algorithm or options) on the shared buffers")

    def barrier(self, deadline: float) -> None:
        """Wait until every rank of the host has reached this barrier, or raise ``PeerError``.

        The last rank to arrive publishes the barrier as the group's generation and wakes
        everyone sleeping on it with one system call; the others sleep on that one word (once
        each, not once per peer: with 4 ranks on 2 cores every extra wake-up is a context switch)."""
        group = self.group
        if group.failure is not None:
            raise group.failure
        self.barriers += 1
        mark = self.barriers % WRAP
        self._words[self._arrived[self.rank]] = mark
        if self._missing(mark) is None:
            self._release(mark)
            return
        spin_until = time.perf_counter() + self.spin_s
        while time.perf_counter() < spin_until:
            if self._missing(mark) is None:
                return
        self._sleep(mark, deadline)

    def _missing(self, mark: int):
        """The first peer that has not reached barrier ``mark`` yet, or None."""
        words = self._words
        for peer, index in self._peer_words:
            if (int(words[index]) - mark) % WRAP >= WRAP // 2:
                return peer
        return None

    def _release(self, mark: int) -> None:
        words = self._words
        words[self._generation] = mark
        if words[self._generation + 1]:
            words[self._generation + 1] = 0
            futex.wake(self._generation_address)

    def _sleep(self, mark: int, deadline: float) -> None:
        group, ctl, words = self.group, self.group.ctl, self._words
        next_check = time.monotonic() + CHECK_EVERY_S
        try:
            while True:
                words[self._generation + 1] = 1          # say so, then look once more
                seen = int(words[self._generation])
                if (seen - mark) % WRAP < WRAP // 2:
                    return
                missing = self._missing(mark)
                if missing is None:                       # all here, nobody woke us: wake the others
                    self._release(mark)
                    return
                ctl[self._blocked] = missing
                now = time.monotonic()
                if now >= next_check or now >= deadline:
                    group.raise_failure(_Waiting(missing), deadline)
                    next_check = now + CHECK_EVERY_S
                futex.wait(self._generation_address, seen,
                           max(1e-4, min(NAP_S, next_check - now, deadline + 1.0 - now)))
        finally:
            ctl[self._blocked] = NOBODY
