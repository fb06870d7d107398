"""Moving data through a group's segment: this rank's side of its channels (see ``shm``).

Every ordered pair src -> dst has a channel: a notice queue written by dst ("a receive for
tag T of n bytes is posted") and a ring of frames written by src. Both are single-producer
single-consumer rings with monotonic counters: a counter is published (a release store, through
``_native.store``) after the data it covers is written, and read (an acquire load,
``_native.load``) before that data is read, which keeps the order on ARM as on x86.
``Channels.progress`` moves whatever can move, for every peer (each channel's first word found
once, at set-up).
"""

from __future__ import annotations

import mmap
import threading
from collections import deque

import numpy as np
import torch

from ....errors import MismatchError, PeerError
from . import _native
from .segment import (BELL, DATA_HEAD, DATA_TAIL, FRAME_BYTES, FRAME_OFFSET, FRAME_TAG, FRAME_WORDS,
                      NOTICE_BYTES, NOTICE_HEAD, NOTICE_TAG, NOTICE_TAIL, NOTICE_WORDS, QUEUES, SLEEPING, Layout)


class Op:
    """One posted send or receive: its bytes, how many frames have moved, whether it is done."""

    __slots__ = ("kind", "peer", "tag", "buf", "nbytes", "frames", "moved", "done", "tensor", "target", "landed",
                 "wanted")

    def __init__(self, kind, peer, tag, tensor, slot_bytes):
        self.kind, self.peer, self.tag, self.tensor = kind, peer, tag, tensor
        self.buf = tensor.reshape(-1).view(torch.uint8)
        self.nbytes = self.buf.numel()
        self.frames = max(1, -(-self.nbytes // slot_bytes))
        self.moved = 0          # frames written (send) or received (recv)
        self.done = False
        self.target = None      # a receive to add into this (flat, typed) instead of landing
        self.landed = []        # (offset, bytes) of a receive copied to its tensor before that
        self.wanted = False     # a receive someone waits for now


class Channels:
    """This rank's side of every channel of one segment: posting, and moving data. ``rank``,
    ``size`` and every peer are local (0..size-1); ``ranks[i]`` is local rank i's rank in the
    process group, which messages name. ``SharedGroup`` adds waiting and failures."""

    def __init__(self, rank: int, size: int, mm: mmap.mmap, name: str, ranks: list[int] | None = None):
        self.rank, self.size, self.name, self.mm = rank, size, name, mm
        self.ranks = list(range(size)) if ranks is None else list(ranks)
        self.layout = lay = Layout.read(mm)
        self.slot_bytes, self.slots, self.notices = lay.slot_bytes, lay.slots, lay.notices
        self.ctl = np.frombuffer(mm, dtype=np.int64, count=lay.words)
        self.address = self.ctl.ctypes.data                 # the mapping's first byte
        with torch.inference_mode(False):    # written by later collectives, whatever the mode of the first
            self.data = torch.frombuffer(mm, dtype=torch.uint8)
        self.peers = [p for p in range(size) if p != rank]
        n = size
        # each peer's channels' first words, and the first bytes of their frames (-1: none, this rank)
        self.inbound = [lay.channel(p, rank) if p != rank else -1 for p in range(n)]     # p -> me
        self.outbound = [lay.channel(rank, p) if p != rank else -1 for p in range(n)]    # me -> p
        self.frames_in = [lay.frame(p, rank, 0) if p != rank else -1 for p in range(n)]
        self.frames_out = [lay.frame(rank, p, 0) if p != rank else -1 for p in range(n)]
        self.sleeping = [lay.rank_word(p, SLEEPING) for p in range(n)]
        self.bells = [self.address + 8 * lay.rank_word(p, BELL) for p in range(n)]    # futex words
        self.frame_headers = lay.frames                     # from a channel's first word
        self.notice_tail = [0] * n      # my notices to p (channel p -> me)
        self.data_head = [0] * n        # frames read from p (channel p -> me)
        self.notice_head = [0] * n      # p's notices read (channel me -> p)
        self.data_tail = [0] * n        # frames written to p (channel me -> p)
        self.to_announce = [deque() for _ in range(n)]      # receives whose notice is not written yet
        self.posted: dict = {}                              # (peer, tag) -> deque of receives
        self.expecting = [0] * n                            # receives from p not done
        self.wanted = [0] * n                               # receives from p someone waits for now
        self.added_in_place = self.added_after_copy = 0     # bytes reduce_from added from the channel, or not
        self.offers = [dict() for _ in range(n)]            # p's notices without a send yet: tag -> deque
        self.unmatched = [dict() for _ in range(n)]         # sends without a notice yet: tag -> deque
        self.active = [deque() for _ in range(n)]           # matched sends being written, in order
        self.failure: PeerError | None = None               # the group's, once met: posting raises it
        self.closed = False                                 # this rank has left the group
        self.buffers = None                                 # its SharedBuffers, made on first use
        self.unmapped = False                               # close() unmapped the segment
        self._unmap_lock = threading.Lock()

    # --- posting ------------------------------------------------------------------------

    def post(self, ops) -> list[Op]:
        if self.failure is not None:
            raise self.failure
        out = []
        for kind, tensor, peer, tag in ops:
            op = Op(kind, peer, tag, tensor, self.slot_bytes)
            if kind == "recv":
                self.posted.setdefault((peer, tag), deque()).append(op)
                self.expecting[peer] += 1
                self.to_announce[peer].append((tag, op.nbytes))
            else:
                offers = self.offers[peer].get(tag)
                if offers:
                    self._match(op, offers.popleft())
                else:
                    self.unmatched[peer].setdefault(tag, deque()).append(op)
            out.append(op)
        self.progress()
        return out

    def _match(self, op: Op, nbytes: int) -> None:
        if nbytes != op.nbytes:
            raise MismatchError(f"rank {self.ranks[self.rank]}: a message with tag {op.tag} to rank "
                                f"{self.ranks[op.peer]} has {op.nbytes} "
                                f"bytes here and {nbytes} bytes there: the ranks run different collectives")
        self.active[op.peer].append(op)

    # --- moving data --------------------------------------------------------------------

    def progress(self, flush: bool = False) -> bool:
        """Move whatever can move now, for every peer; return whether anything did. Frames
        are taken from a peer up to the last one someone waits for, or all of them when
        ``flush`` and its channel is full (the peer may be blocked on it): until then they
        stay in the channel, so that ``reduce_from`` can add them straight from there."""
        any_moved = False
        for p in self.peers:
            inbound, outbound = self.inbound[p], self.outbound[p]
            moved = False
            if self.to_announce[p]:
                moved |= self._announce(p, inbound)
            if self.expecting[p] and (self.wanted[p] or flush) and self.data_head[p] < self._load(inbound + DATA_TAIL):
                moved |= self._receive(p, inbound, flush)
            if self.notice_head[p] < self._load(outbound + NOTICE_TAIL):
                moved |= self._read_notices(p, outbound)
            if self.active[p]:
                moved |= self._send(p, outbound)
            if moved:
                any_moved = True
                if self._load(self.sleeping[p]):           # p sleeps on its doorbell: ring it
                    self.ring(p)
        return any_moved

    def _announce(self, p: int, base: int) -> bool:
        ctl, queue = self.ctl, self.to_announce[p]
        tail, head = self.notice_tail[p], self._load(base + NOTICE_HEAD)
        if tail - head >= self.notices:
            return False
        while queue and tail - head < self.notices:
            tag, nbytes = queue.popleft()
            entry = base + QUEUES + NOTICE_WORDS * (tail % self.notices)
            ctl[entry + NOTICE_TAG], ctl[entry + NOTICE_BYTES] = tag, nbytes
            tail += 1
        self._store(base + NOTICE_TAIL, tail)
        self.notice_tail[p] = tail
        return True

    def _read_notices(self, p: int, base: int) -> bool:
        ctl = self.ctl
        head, tail = self.notice_head[p], self._load(base + NOTICE_TAIL)
        while head < tail:
            entry = base + QUEUES + NOTICE_WORDS * (head % self.notices)
            tag, nbytes = int(ctl[entry + NOTICE_TAG]), int(ctl[entry + NOTICE_BYTES])
            waiting = self.unmatched[p].get(tag)
            if waiting:
                self._match(waiting.popleft(), nbytes)
                if not waiting:
                    del self.unmatched[p][tag]
            else:
                self.offers[p].setdefault(tag, deque()).append(nbytes)
            head += 1
        self._store(base + NOTICE_HEAD, head)
        self.notice_head[p] = head
        return True

    def _send(self, p: int, base: int) -> bool:
        ctl, active, slots, size = self.ctl, self.active[p], self.slots, self.slot_bytes
        tail, head = self.data_tail[p], self._load(base + DATA_HEAD)
        if tail - head >= slots:
            return False
        frames, data_at = base + self.frame_headers, self.frames_out[p]
        while active and tail - head < slots:
            op = active[0]
            k = tail % slots
            offset = op.moved * size
            n = min(size, op.nbytes - offset)
            start = data_at + k * size
            if n:
                self.data[start:start + n].copy_(op.buf[offset:offset + n])
            entry = frames + FRAME_WORDS * k
            ctl[entry + FRAME_TAG], ctl[entry + FRAME_OFFSET], ctl[entry + FRAME_BYTES] = op.tag, offset, n
            tail += 1
            self._store(base + DATA_TAIL, tail)                 # published after the data
            self.data_tail[p] = tail
            op.moved += 1
            if op.moved == op.frames:
                op.done = True
                active.popleft()
                op.tensor = op.buf = None
        return True

    def _receive(self, p: int, base: int, flush: bool) -> bool:
        ctl, slots = self.ctl, self.slots
        head, tail = self.data_head[p], self._load(base + DATA_TAIL)
        frames, data_at = base + self.frame_headers, self.frames_in[p]
        if not (flush and tail - head >= slots):     # up to the last frame someone waits for
            last = head
            for i in range(head, tail):
                queue = self.posted.get((p, int(ctl[frames + FRAME_WORDS * (i % slots) + FRAME_TAG])))
                if queue and queue[0].wanted:
                    last = i + 1
            if last == head:
                return False
            tail = last
        while head < tail:
            k = head % slots
            entry = frames + FRAME_WORDS * k
            tag, offset, n = int(ctl[entry + FRAME_TAG]), int(ctl[entry + FRAME_OFFSET]), int(ctl[entry + FRAME_BYTES])
            queue = self.posted.get((p, tag))
            assert queue, f"rank {self.rank}: a frame from rank {p} with tag {tag} matches no posted receive"
            op = queue[0]
            if n:
                start = data_at + k * self.slot_bytes
                if op.target is not None:
                    size = op.tensor.element_size()
                    op.target[offset // size:(offset + n) // size].add_(self.data[start:start + n].view(op.tensor.dtype))
                    self.added_in_place += n
                else:
                    op.buf[offset:offset + n].copy_(self.data[start:start + n])
                    op.landed.append((offset, n))
            head += 1
            self._store(base + DATA_HEAD, head)
            self.data_head[p] = head
            op.moved += 1
            if op.moved == op.frames:
                op.done = True
                queue.popleft()
                if not queue:
                    del self.posted[(p, tag)]
                self.expecting[p] -= 1
        return True

    def _load(self, word: int) -> int:
        """The shared word ``word``, read with acquire order (what it covers is read after)."""
        return _native.load(self.address + 8 * word)

    def _store(self, word: int, value: int) -> None:
        """Publish ``value`` at word ``word`` after everything written before it (release)."""
        _native.store(self.address + 8 * word, value)

    def ring(self, p: int) -> None:
        """Wake rank ``p`` if it sleeps on its doorbell (a futex word it waits on)."""
        _native.ring(self.bells[p])

    def idle(self) -> bool:
        """Whether nothing of this rank is in flight here: no send left to write, no receive
        open (then no peer of the host needs this rank to progress)."""
        return not (self.posted or any(self.active) or any(self.unmatched) or any(self.to_announce))
