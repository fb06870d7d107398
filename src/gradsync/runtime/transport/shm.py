"""The shared-memory transport: ranks of one host exchange messages through one segment.

Loopback TCP moves 2.5-3 GB/s on this kind of machine while a memory copy moves 10-19 GB/s;
Open MPI, NCCL, DeepSpeed and vLLM all move intra-host messages through shared memory for
that reason. Here every ordered pair of ranks (src -> dst) has a channel in one segment:

- a *notice queue*, written by dst: "I have posted a receive for tag T of n bytes";
- a ring of ``slots`` *frames* of ``slot_bytes``, written by src: (tag, offset, n) + data.

A send is matched with a notice, then copied frame by frame into the ring: the one copy a
send makes. Only posted receives get frames, so, as on Gloo and the in-memory transport, a
message moves once both ends are posted, and a collective that works there works here. The
receiver leaves frames in the ring until it waits for their receive: the executor's REDUCE
then adds them straight from the ring into its buffer (``reduce_from``), a COPY or a plain
``wait`` copies them into the receive's tensor (its one copy). A rank with nothing to do
takes every frame of a full ring, so a sender never stays blocked on a receiver that waits
for something else. Both queues are single-producer single-consumer rings with monotonic
counters; on x86 (stores are seen in order) a counter published after the data it covers
is enough.

Nobody moves data in the background: ``post`` and ``wait`` progress every pending operation
of the group. A waiting rank spins 50 us, then blocks on its *doorbell*, a FIFO it reads
with ``select``: it sets its "sleeping" word, looks once more, and sleeps until a peer that
moved something for it writes a byte (at most 2 ms, so a ring missed in the race between
the word and the look costs 2 ms, not a hang). With 4 ranks on 2 cores the waiting ones
leave the cores to the ones copying. Every 10 ms a blocked rank checks its peers' processes
(pid and start time; zombies count as dead): a dead peer is a ``PeerError`` naming it at
once. The first rank to see a failure (a death, a rank that left, or the deadline: then the
end of the chain of who waits for whom, each rank publishing the peer it waits for) records
it in the segment, so every survivor names the same rank.

The segment is a file in /dev/shm, mode 0600, named ``gradsync-<uid>-<pid>-<128 random
bits>`` (its doorbells in a 0700 directory beside it). The ranks first learn which of them
share a host (``runtime.hosts``); the first rank of a host creates the segment and passes its
name through the group's torch.distributed store, every rank of the host maps it and reports,
and the creator unlinks it as soon as all have reported. In a group spanning several hosts
(``host_group``, used by ``MixedTransport``) each host has its own segment, and ranks are
named by their rank in the group. The mapping lives on until the processes exit,
whatever way they exit, so nothing is left in /dev/shm even if they are killed; a segment
left by a crash during those milliseconds (its creator's pid dead) is removed by the next
group set up on the host, or by any survivor that meets the failure.
"""

from __future__ import annotations

import atexit
import datetime
import mmap
import os
import secrets
import select
import shutil
import threading
import time
from collections import deque

import numpy as np
import torch

from ...errors import ConfigError, MismatchError, PeerError

SHM_DIR = "/dev/shm"
PREFIX = "gradsync-"
MAGIC = 0x67726473686D3031          # "grdshm01"
DATA_BUDGET = 512 << 20             # the most frame space one group's segment holds
BELLS = ".bells"                    # the segment's directory of doorbells, one FIFO per rank
NOTICES = 256                       # posted receives a channel can announce at once
SPIN_S = 50e-6                      # spin this long before blocking on the doorbell (1 ms: 4x slower, loaded)
NAP_S = 2e-3                        # the longest block: bounds the cost of a missed ring
CHECK_EVERY_S = 0.01                # liveness checks while blocked

# control words (int64) of the segment
_HEADER, _RANK_WORDS = 8, 8         # [magic, size, slot_bytes, slots, notices, failed, why]; per rank a cache line
_PID, _START, _BLOCKED, _CLOSED, _SLEEPING = 0, 1, 2, 3, 4
_FAILED, _WHY = 5, 6                # in the header: the failed rank (-1: none) and how
_DIED, _LEFT, _SILENT, _REMOTE = 1, 2, 3, 4     # _REMOTE: a rank of another host, named by the engine
_ACROSS = -2                        # a _BLOCKED word: waiting for a rank of another host
_DATA_TAIL, _DATA_HEAD, _NOTICE_TAIL, _NOTICE_HEAD, _QUEUES = 0, 8, 16, 24, 32   # one cache line each


def layout(size: int) -> tuple[int, int]:
    """(slot_bytes, slots) per channel for a group of ``size``: 1 MB x 8 up to DATA_BUDGET in
    all, fewer and smaller frames for large groups.

    >>> layout(4), layout(64)
    ((1048576, 8), (65536, 2))
    """
    pairs = max(1, size * (size - 1))
    slots = int(min(8, max(2, DATA_BUDGET // (pairs << 20))))
    slot_bytes = min(1 << 20, DATA_BUDGET // (pairs * slots))
    return max(64 << 10, slot_bytes // 4096 * 4096), slots


class _Op:
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


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks, or None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def sweep(directory: str = SHM_DIR) -> list[str]:
    """Remove this user's gradsync segments whose creator has died (a crash between creating
    a segment and unlinking it); return their names. ``sweep("/nonexistent")`` is ``[]``."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    mine = f"{PREFIX}{os.getuid()}-"
    for name in names:
        if not name.startswith(mine):
            continue
        try:
            pid = int(name[len(mine):].split("-")[0])
        except ValueError:
            continue
        if _start_time(pid) is None:
            path = os.path.join(directory, name)
            try:
                shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
                removed.append(name)
            except OSError:
                pass
    return removed


class SharedGroup:
    """One process group's segment and this rank's side of its channels; every collective of
    the group on shared memory goes through it, one at a time (they share the group's
    progress engine). Made by ``shared_group`` (all the group's ranks) or ``host_group`` (the
    ranks of this host, in a group spanning several). ``rank``, ``size`` and every peer here
    are local (0..size-1); ``ranks[i]`` is local rank i's rank in the process group, which
    messages and ``PeerError.peer`` name, and the segment records a failed rank by."""

    def __init__(self, rank: int, size: int, mm: mmap.mmap, name: str, bells: list[int],
                 ranks: list[int] | None = None):
        self.rank, self.size, self.name, self.mm, self.bells = rank, size, name, mm, bells
        self.ranks = list(range(size)) if ranks is None else list(ranks)
        head = np.frombuffer(mm, dtype=np.int64, count=_HEADER)
        self.slot_bytes, self.slots, self.notices = int(head[2]), int(head[3]), int(head[4])
        self.channel_words = _QUEUES + 2 * self.notices + 4 * self.slots
        words = _HEADER + _RANK_WORDS * size + size * (size - 1) * self.channel_words
        self.data_start = -(-words * 8 // 4096) * 4096
        self.ctl = np.frombuffer(mm, dtype=np.int64, count=words)
        self.data = torch.frombuffer(mm, dtype=torch.uint8)
        self.peers = [p for p in range(size) if p != rank]
        n = size
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
        self.failure: PeerError | None = None
        self.closed = False

    # --- layout -------------------------------------------------------------------------

    def _rank_word(self, r: int, field: int) -> int:
        return _HEADER + _RANK_WORDS * r + field

    def _channel(self, src: int, dst: int) -> int:
        index = src * (self.size - 1) + (dst if dst < src else dst - 1)
        return _HEADER + _RANK_WORDS * self.size + index * self.channel_words

    def _frame(self, src: int, dst: int, k: int) -> int:
        index = src * (self.size - 1) + (dst if dst < src else dst - 1)
        return self.data_start + (index * self.slots + k) * self.slot_bytes

    # --- posting ------------------------------------------------------------------------

    def post(self, ops) -> list[_Op]:
        if self.failure is not None:
            raise self.failure
        out = []
        for kind, tensor, peer, tag in ops:
            op = _Op(kind, peer, tag, tensor, self.slot_bytes)
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

    def _match(self, op: _Op, nbytes: int) -> None:
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
        ctl, me = self.ctl, self.rank
        for p in self.peers:
            inbound, outbound = self._channel(p, me), self._channel(me, p)
            moved = False
            if self.to_announce[p]:
                moved |= self._announce(p, inbound)
            if self.expecting[p] and self.data_head[p] < ctl[inbound + _DATA_TAIL] and (self.wanted[p] or flush):
                moved |= self._receive(p, inbound, flush)
            if self.notice_head[p] < ctl[outbound + _NOTICE_TAIL]:
                moved |= self._read_notices(p, outbound)
            if self.active[p]:
                moved |= self._send(p, outbound)
            if moved:
                any_moved = True
                if ctl[self._rank_word(p, _SLEEPING)]:      # p blocks on its doorbell: ring it
                    try:
                        os.write(self.bells[p], b"\0")
                    except BlockingIOError:                 # full: it has plenty to wake to
                        pass
        return any_moved

    def _announce(self, p: int, base: int) -> bool:
        ctl, queue = self.ctl, self.to_announce[p]
        tail, head = self.notice_tail[p], int(ctl[base + _NOTICE_HEAD])
        if tail - head >= self.notices:
            return False
        while queue and tail - head < self.notices:
            tag, nbytes = queue.popleft()
            entry = base + _QUEUES + 2 * (tail % self.notices)
            ctl[entry], ctl[entry + 1] = tag, nbytes
            tail += 1
        ctl[base + _NOTICE_TAIL] = self.notice_tail[p] = tail
        return True

    def _read_notices(self, p: int, base: int) -> bool:
        ctl = self.ctl
        head, tail = self.notice_head[p], int(ctl[base + _NOTICE_TAIL])
        while head < tail:
            entry = base + _QUEUES + 2 * (head % self.notices)
            tag, nbytes = int(ctl[entry]), int(ctl[entry + 1])
            waiting = self.unmatched[p].get(tag)
            if waiting:
                self._match(waiting.popleft(), nbytes)
                if not waiting:
                    del self.unmatched[p][tag]
            else:
                self.offers[p].setdefault(tag, deque()).append(nbytes)
            head += 1
        ctl[base + _NOTICE_HEAD] = self.notice_head[p] = head
        return True

    def _send(self, p: int, base: int) -> bool:
        ctl, active, slots, size = self.ctl, self.active[p], self.slots, self.slot_bytes
        tail, head = self.data_tail[p], int(ctl[base + _DATA_HEAD])
        if tail - head >= slots:
            return False
        frames = base + _QUEUES + 2 * self.notices
        while active and tail - head < slots:
            op = active[0]
            k = tail % slots
            offset = op.moved * size
            n = min(size, op.nbytes - offset)
            start = self._frame(self.rank, p, k)
            if n:
                self.data[start:start + n].copy_(op.buf[offset:offset + n])
            ctl[frames + 4 * k], ctl[frames + 4 * k + 1], ctl[frames + 4 * k + 2] = op.tag, offset, n
            tail += 1
            ctl[base + _DATA_TAIL] = self.data_tail[p] = tail     # published after the data
            op.moved += 1
            if op.moved == op.frames:
                op.done = True
                active.popleft()
                op.tensor = op.buf = None
        return True

    def _receive(self, p: int, base: int, flush: bool) -> bool:
        ctl, slots = self.ctl, self.slots
        head, tail = self.data_head[p], int(ctl[base + _DATA_TAIL])
        frames = base + _QUEUES + 2 * self.notices
        if not (flush and tail - head >= slots):     # up to the last frame someone waits for
            last = head
            for i in range(head, tail):
                queue = self.posted.get((p, int(ctl[frames + 4 * (i % slots)])))
                if queue and queue[0].wanted:
                    last = i + 1
            if last == head:
                return False
            tail = last
        while head < tail:
            k = head % slots
            tag, offset, n = int(ctl[frames + 4 * k]), int(ctl[frames + 4 * k + 1]), int(ctl[frames + 4 * k + 2])
            queue = self.posted.get((p, tag))
            assert queue, f"rank {self.rank}: a frame from rank {p} with tag {tag} matches no posted receive"
            op = queue[0]
            if n:
                start = self._frame(p, self.rank, k)
                if op.target is not None:
                    size = op.tensor.element_size()
                    op.target[offset // size:(offset + n) // size].add_(self.data[start:start + n].view(op.tensor.dtype))
                    self.added_in_place += n
                else:
                    op.buf[offset:offset + n].copy_(self.data[start:start + n])
                    op.landed.append((offset, n))
            head += 1
            ctl[base + _DATA_HEAD] = self.data_head[p] = head
            op.moved += 1
            if op.moved == op.frames:
                op.done = True
                queue.popleft()
                if not queue:
                    del self.posted[(p, tag)]
                self.expecting[p] -= 1
        return True

    def idle(self) -> bool:
        """Whether nothing of this rank is in flight here: no send left to write, no receive
        open (then no peer of the host needs this rank to progress)."""
        return not (self.posted or any(self.active) or any(self.unmatched) or any(self.to_announce))

    # --- waiting ------------------------------------------------------------------------

    def wait(self, pending: list[_Op], deadline: float, outside=None) -> None:
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
        sleeping = self._rank_word(self.rank, _SLEEPING)
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
                self.ctl[self._rank_word(self.rank, _BLOCKED)] = _ACROSS if waiting is None else waiting.peer
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
                self.ctl[self._rank_word(self.rank, _BLOCKED)] = -1

    def reduce_from(self, op: _Op, target: torch.Tensor, deadline: float) -> None:
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

    def _check(self, op: _Op | None, deadline: float) -> PeerError | None:
        """The group's failure if a peer died or left, or the deadline has passed. The first
        rank to see a failure records it in the segment, so every survivor names that rank
        (not one that gave up on it first and left). ``op`` None: this rank waits only for
        ranks of other hosts (their engine names those)."""
        ctl = self.ctl
        if ctl[_FAILED] < 0:
            gone = next((r for r in self.peers if not self.alive(r)), None)
            if gone is not None:
                self._record(self.ranks[gone], _LEFT if ctl[self._rank_word(gone, _CLOSED)] else _DIED)
            elif op is not None and time.monotonic() >= deadline:
                end = self._end_of_chain(op.peer)
                # a rank waiting across hosts learns who failed there from the engine: give it a second
                if end is not None or time.monotonic() >= deadline + 1.0:
                    self._record(self.ranks[op.peer if end is None else end], _SILENT)
        if ctl[_FAILED] < 0:
            return None
        failed, why = int(ctl[_FAILED]), int(ctl[_WHY])
        how = {_LEFT: "left the group", _SILENT: "did not answer before the timeout",
               _REMOTE: "failed (seen by a rank of this host that waited for it across hosts)"}.get(why, "failed")
        if why == _DIED and failed in self.ranks:
            how = f"died (process {int(ctl[self._rank_word(self.ranks.index(failed), _PID)])} is gone)"
        doing = "" if op is None else \
            f" to {'receive from' if op.kind == 'recv' else 'send to'} rank {self.ranks[op.peer]}"
        return PeerError(f"rank {self.ranks[self.rank]}: rank {failed} {how} while this rank waited{doing}",
                         peer=failed, op="recv" if op is None else op.kind)

    def _record(self, rank: int, why: int) -> None:
        """Record the group's failed rank (its rank in the process group) and how."""
        if self.ctl[_FAILED] < 0:      # two ranks at once: either may win, both name a failed rank
            self.ctl[_WHY] = why
            self.ctl[_FAILED] = rank

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
            self._record(error.peer, _REMOTE)
        self.failure = error
        _remove(self.name)

    def _fail(self, error: PeerError) -> None:
        self.failure = error
        _remove(self.name)             # rank 0 may have died before unlinking them
        raise error

    def alive(self, r: int) -> bool:
        """Whether rank ``r``'s process lives and has not left the group."""
        ctl = self.ctl
        if ctl[self._rank_word(r, _CLOSED)]:
            return False
        return _start_time(int(ctl[self._rank_word(r, _PID)])) == int(ctl[self._rank_word(r, _START)])

    def _end_of_chain(self, peer: int) -> int | None:
        """Follow who waits for whom from ``peer``: the last rank is the one holding all up
        (None: a rank waiting for another host, where this host cannot see)."""
        seen = {self.rank}
        while peer not in seen:
            seen.add(peer)
            nxt = int(self.ctl[self._rank_word(peer, _BLOCKED)])
            if nxt == _ACROSS:
                return None
            if nxt < 0:
                return peer
            peer = nxt
        return peer

    def close(self) -> None:
        """Tell the peers this rank has left (a peer still waiting for it fails at once)."""
        if not self.closed:
            self.closed = True
            self.ctl[self._rank_word(self.rank, _CLOSED)] = 1


# --- setting a group up ---------------------------------------------------------------------

_GROUPS: dict = {}             # (id(process group), whole group?) -> (process group, SharedGroup or why not)
_GROUPS_LIMIT = 16             # groups remembered; the oldest is closed beyond
_GROUPS_LOCK = threading.Lock()
_setups: dict[str, int] = {}


def _create(size: int) -> tuple[str, mmap.mmap]:
    slot_bytes, slots = layout(size)
    channel_words = _QUEUES + 2 * NOTICES + 4 * slots
    words = _HEADER + _RANK_WORDS * size + size * (size - 1) * channel_words
    nbytes = -(-words * 8 // 4096) * 4096 + size * (size - 1) * slots * slot_bytes
    free = os.statvfs(SHM_DIR)
    if free.f_bavail * free.f_frsize < nbytes:       # touching pages past a full tmpfs is SIGBUS, not an error
        raise OSError(f"{SHM_DIR} has {free.f_bavail * free.f_frsize >> 20} MB free, the segment needs "
                      f"{nbytes >> 20} MB")
    name = f"{PREFIX}{os.getuid()}-{os.getpid()}-{secrets.token_hex(16)}"
    os.mkdir(os.path.join(SHM_DIR, name + BELLS), 0o700)
    for r in range(size):
        os.mkfifo(os.path.join(SHM_DIR, name + BELLS, str(r)), 0o600)
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, nbytes)
        mm = mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)
    head = np.frombuffer(mm, dtype=np.int64, count=_HEADER + _RANK_WORDS * size)
    head[:6] = [MAGIC, size, slot_bytes, slots, NOTICES, -1]
    head[_HEADER + _BLOCKED::_RANK_WORDS] = -1
    del head
    return name, mm


def _open(name: str, size: int) -> mmap.mmap:
    if not name.startswith(PREFIX) or "/" in name:
        raise ValueError(f"not a gradsync segment name: {name!r}")
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    try:
        mm = mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    head = np.frombuffer(mm, dtype=np.int64, count=2)
    if int(head[0]) != MAGIC or int(head[1]) != size:
        del head
        mm.close()
        raise ValueError("the segment is not this group's")
    return mm


def _setup(store, key: str, rank: int, size: int, timeout: float, ranks: list[int]) -> SharedGroup | str:
    """Every rank of one host's part of a group (``ranks``: their ranks in the group; ``rank``
    and ``size`` local), together: one segment all can map? Returns the ``SharedGroup``, or
    why not (the same answer on every rank)."""
    _setups[key] = n = _setups.get(key, 0) + 1
    prefix = f"gradsync/shm/{key}/{n}"
    wait = datetime.timedelta(seconds=timeout)

    def everyone(what: str) -> list[str]:
        keys = [f"{prefix}/{what}/{r}" for r in range(size)]
        try:
            store.wait(keys, wait)
            return [store.get(k).decode() for k in keys]
        except Exception:          # a rank never came (or rank 0, the store's host, died)
            raise _absent(store, keys, ranks[rank], ranks) from None

    mm, name, problem, bells = None, "", "", []
    try:
        if rank == 0:
            sweep()
            name, mm = _create(size)
            store.set(f"{prefix}/name", name)
        else:
            name = _segment_name(store, f"{prefix}/name", wait, ranks[rank], ranks[0])
            if name.startswith("!"):
                raise OSError(name[1:])
            mm = _open(name, size)
        bells = [os.open(os.path.join(SHM_DIR, name + BELLS, str(r)), os.O_RDWR | os.O_NONBLOCK)
                 for r in range(size)]
        ctl = np.frombuffer(mm, dtype=np.int64, count=_HEADER + _RANK_WORDS * size)
        ctl[_HEADER + _RANK_WORDS * rank + _START] = _start_time(os.getpid()) or 0
        ctl[_HEADER + _RANK_WORDS * rank + _PID] = os.getpid()
        del ctl
    except (OSError, ValueError) as exc:
        problem = str(exc) if name.startswith("!") else f"rank {ranks[rank]} could not map the segment: {exc}"
        if rank == 0:
            store.set(f"{prefix}/name", "!" + problem)
    reports = []
    try:
        store.set(f"{prefix}/opened/{rank}", problem or "ok")
        reports = everyone("opened")
    finally:
        if name and (rank == 0 or not reports):     # every rank has them open, or gave up (rank 0 may be dead)
            _remove(name)
    problems = [p for p in reports if p != "ok"]
    if problems:
        for fd in bells:
            os.close(fd)
        return problems[0]
    return SharedGroup(rank, size, mm, name, bells, ranks)


def _remove(name: str) -> None:
    """Unlink a segment and its doorbells (open mappings and descriptors live on)."""
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except OSError:
        pass
    shutil.rmtree(os.path.join(SHM_DIR, name + BELLS), ignore_errors=True)


def _absent(store, keys: list[str], rank: int, ranks: list[int]) -> PeerError:
    """The PeerError of a set-up some rank never joined: the first whose key is missing
    (``rank`` and the missing named by their ranks in the group)."""
    try:
        missing = [ranks[int(k.rsplit("/", 1)[1])] for k in keys if not store.check([k])]
    except Exception:
        missing = None
    if missing is None:
        return PeerError(f"rank {rank}: rank 0 is unreachable (it hosts the rendezvous store) while setting up "
                         f"shared memory", peer=0, op="setup")
    peer = missing[0] if missing else None
    return PeerError(f"rank {rank}: rank(s) {missing} did not join the shared-memory set-up before the timeout",
                     peer=peer, op="setup")


def _segment_name(store, key: str, wait, rank: int, creator: int) -> str:
    """The segment's name, which its creator (the host's first rank) publishes."""
    try:
        store.wait([key], wait)
        return store.get(key).decode()
    except Exception:
        raise PeerError(f"rank {rank}: rank {creator} did not publish the shared-memory segment before the "
                        f"timeout", peer=creator, op="setup") from None


def shared_group(group=None, timeout: float = 60.0) -> SharedGroup | str:
    """The ``SharedGroup`` of a torch.distributed process group (set up on first use, by every
    rank together), or a sentence saying why its ranks cannot share memory.

    Example, in each rank after ``dist.init_process_group``: ``shared_group()`` is a
    ``SharedGroup`` when all ranks run on this host.
    """
    return _cached(group, True, timeout)


def host_group(group=None, timeout: float = 60.0) -> SharedGroup | str:
    """The ``SharedGroup`` of the ranks of ``group`` that run on this rank's host (set up on
    first use, by every rank of the group together, each host its own segment), or a sentence
    saying why not (this rank alone on its host, or a segment that could not be shared).

    Example, in each rank of a group of 2 hosts x 2 ranks: ``host_group().ranks`` is [0, 1]
    on the first host and [2, 3] on the second.
    """
    return _cached(group, False, timeout)


def _cached(group, whole: bool, timeout: float) -> SharedGroup | str:
    import torch.distributed as dist

    from .hosts import host_map
    from .distributed import group_name

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    with _GROUPS_LOCK:
        entry = _GROUPS.get((id(pg), whole))
        if entry is not None and entry[0] is pg:
            return entry[1]
    found = host_map(group, timeout)
    rank, size, key = dist.get_rank(group), dist.get_world_size(group), group_name(group)
    members = list(range(size)) if whole else found.ranks_on(found.host[rank])
    store = dist.distributed_c10d._get_default_store()
    if whole and found.hosts > 1:
        result = f"the ranks run on {found.hosts} hosts ({', '.join(found.names)})"
    elif len(members) == 1:
        result = f"rank {rank} is alone on its host"
    else:
        result = _setup(store, key if whole else f"{key}@{found.host[rank]}", members.index(rank), len(members),
                        timeout, members)
    with _GROUPS_LOCK:
        _GROUPS[(id(pg), whole)] = (pg, result)
        while len(_GROUPS) > _GROUPS_LIMIT:
            _, old = _GROUPS.pop(next(iter(_GROUPS)))
            if isinstance(old, SharedGroup):
                old.close()
    return result


@atexit.register
def _leave_all():
    for _, shared in list(_GROUPS.values()):
        if isinstance(shared, SharedGroup):
            shared.close()


class ShmTransport:
    """The transport protocol over shared memory, for one collective of a group whose ranks
    share a host. Raises ``ConfigError`` when they cannot (``shared_group`` says why).

    Example, in each rank after ``dist.init_process_group("gloo", ...)`` on one host::

        transport = ShmTransport()
        transport.wait([transport.send(torch.ones(4), peer=1, tag=0)], time.monotonic() + 10)
    """

    def __init__(self, group=None, timeout: float = 60.0, shared: SharedGroup | None = None):
        from .distributed import group_name

        if shared is None:
            shared = shared_group(group, timeout)
        if isinstance(shared, str):
            raise ConfigError(f"transport 'shm' needs every rank on one host, sharing one segment: {shared}")
        self.shared, self.rank, self.size, self.group = shared, shared.rank, shared.size, group
        key = group_name(group)
        self.group_key = f"torch/{key}"            # the same progress engine as Gloo's on this group
        self.failure_key = f"gradsync/failure/{key}"

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

    def gather(self, data, deadline, tag=0):
        """Every rank's ``data`` (same-size bytes), by rank."""
        from .distributed import GATHER_TAG

        out = [data if r == self.rank else torch.empty_like(data) for r in range(self.size)]
        peers = [r for r in range(self.size) if r != self.rank]
        self.wait(self.post([("recv", out[r], r, GATHER_TAG + tag) for r in peers]
                            + [("send", data, r, GATHER_TAG + tag) for r in peers]), deadline)
        return out

    def close(self):
        pass
