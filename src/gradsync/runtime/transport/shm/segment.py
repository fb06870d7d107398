"""A group's segment: the file in /dev/shm, where each of its words is, and its life.

The segment is int64 control words, then the frames' data from the next page boundary:

- the header, one cache line: ``MAGIC_WORD`` .. ``NOTICES_WORD`` (how it is laid out), then
  ``FAILED`` (the group's failed rank and how, in one word written by one compare-and-swap:
  ``(why << 32) | rank``, -1: none; ``failure_word``), a spare word, and
  ``REGION_WORD`` (the shared buffers' slot size); then, on a line of its own, ``GENERATION``:
  the last barrier of the shared buffers every rank reached (low 32 bits, a futex word the
  waiting ranks sleep on; high 32 bits: someone sleeps on it);
- per rank, one cache line: ``PID`` and ``START`` (its process and that process's start time),
  ``BLOCKED`` (the rank it waits for: ``NOBODY``, or ``ACROSS`` for a rank of another host),
  ``CLOSED`` (it has left), ``SLEEPING`` (it sleeps on its doorbell: ring it), ``ARRIVED``
  (the last barrier it reached on the shared buffers; low 32 bits) and ``BELL`` (its doorbell:
  a counter whose low 32 bits are the futex word it sleeps on while it waits for messages;
  a peer that moved something for it adds one and wakes it);
- per ordered pair src -> dst, a channel: its four counters (``DATA_TAIL``, ``DATA_HEAD``,
  ``NOTICE_TAIL``, ``NOTICE_HEAD``, one cache line each), then ``notices`` notice entries
  written by dst (``NOTICE_TAG``, ``NOTICE_BYTES``), then ``slots`` frame headers written by
  src (``FRAME_TAG``, ``FRAME_OFFSET``, ``FRAME_BYTES``); ``Layout`` says where each starts;
- after the frames, from a page boundary, the *shared buffers*: per rank two slots of
  ``region_bytes`` (the even and the odd collective use alternate slots, so one collective's
  copy-in never overwrites what a slower rank still reads of the one before), which every rank
  of the host reads directly (``buffers``); a slot's first ``SLOT_HEADER`` bytes hold the
  digest of the collective its rank runs in it, its data follows. Pages of a tmpfs file take memory only once touched.
"""

from __future__ import annotations

import mmap
import os
import secrets
import shutil
from dataclasses import dataclass

import numpy as np

SHM_DIR = "/dev/shm"
PREFIX = "gradsync-"
MAGIC = 0x67726473686D3033          # "grdshm03"
DATA_BUDGET = 512 << 20             # the most frame space one group's segment holds
REGION_BUDGET = 256 << 20           # the most shared-buffer space (both parities, every rank)
REGION_MAX = 32 << 20               # the largest slot: bigger collectives go through it in pieces
SLOT_HEADER = 64                    # a slot's digest, before its data (one cache line)
NOTICES = 256                       # posted receives a channel can announce at once
PAGE = 4096

# the header's words
MAGIC_WORD, SIZE_WORD, SLOT_BYTES_WORD, SLOTS_WORD, NOTICES_WORD, FAILED, SPARE, REGION_WORD, GENERATION = range(9)
HEADER_WORDS = 16
# each rank's words, from its first
PID, START, BLOCKED, CLOSED, SLEEPING, ARRIVED, BELL = range(7)
RANK_WORDS = 8
# how the FAILED rank failed (REMOTE: a rank of another host, named by the engine)
DIED, LEFT, SILENT, REMOTE = 1, 2, 3, 4
# BLOCKED's values besides a rank
NOBODY, ACROSS = -1, -2
# a channel's words, from its first: the counters, one cache line each, then the queues
DATA_TAIL, DATA_HEAD, NOTICE_TAIL, NOTICE_HEAD, QUEUES = 0, 8, 16, 24, 32
NOTICE_WORDS, NOTICE_TAG, NOTICE_BYTES = 2, 0, 1                      # a notice entry
FRAME_WORDS, FRAME_TAG, FRAME_OFFSET, FRAME_BYTES = 4, 0, 1, 2        # a frame header


def failure_word(rank: int, why: int) -> int:
    """The FAILED word naming ``rank`` (its rank in the process group) and how it failed.

    >>> failure_word(3, DIED) >> 32, failure_word(3, DIED) & 0xFFFFFFFF
    (1, 3)
    """
    return (why << 32) | rank


def layout(size: int) -> tuple[int, int]:
    """(slot_bytes, slots) per channel for a group of ``size``: 1 MB x 8 up to DATA_BUDGET in
    all, fewer and smaller frames for large groups.

    >>> layout(4), layout(64)
    ((1048576, 8), (65536, 2))
    """
    pairs = max(1, size * (size - 1))
    slots = int(min(8, max(2, DATA_BUDGET // (pairs << 20))))
    slot_bytes = min(1 << 20, DATA_BUDGET // (pairs * slots))
    return max(64 << 10, slot_bytes // PAGE * PAGE), slots


def region_bytes(size: int) -> int:
    """Each rank's shared-buffer slot for a group of ``size``: 32 MB up to REGION_BUDGET for
    both parities of every rank, at least 1 MB.

    >>> region_bytes(4) >> 20, region_bytes(64) >> 20
    (32, 2)
    """
    per = REGION_BUDGET // (2 * max(1, size))
    return max(1 << 20, min(REGION_MAX, per) // PAGE * PAGE)


@dataclass(frozen=True)
class Layout:
    """Where everything is in the segment of a group of ``size`` ranks (word indices, but
    ``data_start`` and ``frame``, in bytes).

    >>> lay = Layout.for_size(2)
    >>> lay.channel(0, 1), lay.channel(1, 0) - lay.channel(0, 1), lay.data_start, lay.frame(1, 0, 2)
    (32, 576, 12288, 10498048)
    >>> lay.region(1, 1) - lay.region(0, 0) == 3 * lay.region_bytes
    True
    """

    size: int
    slot_bytes: int
    slots: int
    notices: int = NOTICES
    region_bytes: int = 1 << 20

    @classmethod
    def for_size(cls, size: int) -> "Layout":
        return cls(size, *layout(size), region_bytes=region_bytes(size))

    @classmethod
    def read(cls, mm: mmap.mmap) -> "Layout":
        """The layout a segment's header states."""
        head = np.frombuffer(mm, dtype=np.int64, count=HEADER_WORDS)
        return cls(int(head[SIZE_WORD]), int(head[SLOT_BYTES_WORD]), int(head[SLOTS_WORD]), int(head[NOTICES_WORD]),
                   int(head[REGION_WORD]))

    @property
    def frames(self) -> int:
        """Where a channel's frame headers start, from its first word."""
        return QUEUES + NOTICE_WORDS * self.notices

    @property
    def channel_words(self) -> int:
        return self.frames + FRAME_WORDS * self.slots

    @property
    def words(self) -> int:
        return HEADER_WORDS + RANK_WORDS * self.size + self.size * (self.size - 1) * self.channel_words

    @property
    def data_start(self) -> int:
        return -(-self.words * 8 // PAGE) * PAGE

    @property
    def region_start(self) -> int:
        return self.data_start + self.size * (self.size - 1) * self.slots * self.slot_bytes

    @property
    def nbytes(self) -> int:
        return self.region_start + 2 * self.size * self.region_bytes

    def region(self, r: int, parity: int) -> int:
        """The first byte of rank ``r``'s shared-buffer slot of ``parity`` (0 or 1)."""
        return self.region_start + (parity * self.size + r) * self.region_bytes

    def rank_word(self, r: int, field: int) -> int:
        """Rank ``r``'s word ``field`` (``PID`` ... ``SLEEPING``)."""
        return HEADER_WORDS + RANK_WORDS * r + field

    def _pair(self, src: int, dst: int) -> int:
        return src * (self.size - 1) + (dst if dst < src else dst - 1)

    def channel(self, src: int, dst: int) -> int:
        """The first word of channel src -> dst."""
        return HEADER_WORDS + RANK_WORDS * self.size + self._pair(src, dst) * self.channel_words

    def frame(self, src: int, dst: int, k: int) -> int:
        """The first byte of slot ``k``'s data in channel src -> dst."""
        return self.data_start + (self._pair(src, dst) * self.slots + k) * self.slot_bytes


def _state_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks, or None if it is gone or a zombie."""
    fields = _state_fields(pid)
    return None if not fields or fields[0] in ("Z", "X") else int(fields[19])


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP, a debugger's trap): state T or t in /proc."""
    fields = _state_fields(pid)
    return bool(fields) and fields[0] in ("T", "t")


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
        if start_time(pid) is None:
            path = os.path.join(directory, name)
            try:
                shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
                removed.append(name)
            except OSError:
                pass
    return removed


def create(size: int) -> tuple[str, mmap.mmap]:
    """A new segment for ``size`` ranks: its name and this process's mapping."""
    lay = Layout.for_size(size)
    free = os.statvfs(SHM_DIR)
    if free.f_bavail * free.f_frsize < lay.nbytes:     # touching pages past a full tmpfs is SIGBUS, not an error
        raise OSError(f"{SHM_DIR} has {free.f_bavail * free.f_frsize >> 20} MB free, the segment needs "
                      f"{lay.nbytes >> 20} MB")
    name = f"{PREFIX}{os.getuid()}-{os.getpid()}-{secrets.token_hex(16)}"
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, lay.nbytes)
        mm = mmap.mmap(fd, lay.nbytes)
    finally:
        os.close(fd)
    head = np.frombuffer(mm, dtype=np.int64, count=lay.rank_word(size, 0))
    head[[MAGIC_WORD, SIZE_WORD, SLOT_BYTES_WORD, SLOTS_WORD, NOTICES_WORD, FAILED, REGION_WORD]] = \
        [MAGIC, size, lay.slot_bytes, lay.slots, lay.notices, NOBODY, lay.region_bytes]
    head[lay.rank_word(0, BLOCKED)::RANK_WORDS] = NOBODY
    del head
    return name, mm


def open_segment(name: str, size: int) -> mmap.mmap:
    """Map the segment ``name`` that another rank created for this group of ``size``."""
    if not name.startswith(PREFIX) or "/" in name:
        raise ValueError(f"not a gradsync segment name: {name!r}")
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    try:
        mm = mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    head = np.frombuffer(mm, dtype=np.int64, count=HEADER_WORDS)
    if int(head[MAGIC_WORD]) != MAGIC or int(head[SIZE_WORD]) != size:
        del head
        mm.close()
        raise ValueError("the segment is not this group's")
    return mm


def check_in(mm: mmap.mmap, rank: int) -> None:
    """Write this process and its start time into rank ``rank``'s words, for the peers' checks."""
    lay = Layout.read(mm)
    words = np.frombuffer(mm, dtype=np.int64, count=lay.rank_word(lay.size, 0))
    words[lay.rank_word(rank, START)] = start_time(os.getpid()) or 0
    words[lay.rank_word(rank, PID)] = os.getpid()
    del words


def remove(name: str) -> None:
    """Unlink a segment (open mappings live on)."""
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except OSError:
        pass
