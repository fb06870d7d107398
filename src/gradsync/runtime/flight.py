"""The flight recorder: the last collectives of this process, written out when one fails or hangs.

Every collective this process runs leaves an entry in a bounded ring (``LIMIT``, the last 64):
its sequence number in its group, algorithm, size, dtype, the phase it reached (agree, run,
done, failed), the round, the peer it was waiting on, and when it started and ended. It costs
an attribute write per step; nothing is written anywhere until one of these happens:

- a collective ends in ``PeerError`` (a dead or stalled peer, a timeout) or ``MismatchError``;
- the process receives SIGUSR1 (a hang: ``kill -USR1 <pid>`` on every rank, then read the files).

Then, if a directory is set (``GRADSYNC_FLIGHT_DIR``, or ``configure(dir)``), the entries go to
``<dir>/rank<r>.json``, one file per rank, and ``gradsync doctor <dir>`` reads them all.

Example, in each rank::

    gradsync.runtime.flight.configure("/tmp/flight")   # or GRADSYNC_FLIGHT_DIR=/tmp/flight
    gradsync.all_reduce(grad)                           # a PeerError leaves /tmp/flight/rank<r>.json
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

from .state import GROUPS_LIMIT

LIMIT = 64
ENV = "GRADSYNC_FLIGHT_DIR"


class Entry:
    """One collective as the recorder keeps it; the collective updates ``phase`` and ``round``."""

    __slots__ = ("sequence", "group", "rank", "size", "algorithm", "elements", "itemsize", "dtype", "rounds",
                 "phase", "round", "started", "ended", "error", "peer", "transport")

    def as_dict(self) -> dict:
        waiting = getattr(self.transport, "waiting_for", None) if self.phase != "done" else None
        return {"sequence": self.sequence, "group": self.group, "rank": self.rank, "size": self.size,
                "algorithm": self.algorithm, "bytes": self.elements * self.itemsize,
                "dtype": str(self.dtype).removeprefix("torch."), "rounds": self.rounds, "phase": self.phase,
                "round": self.round, "started": self.started, "ended": self.ended, "error": self.error,
                "error_peer": self.peer,
                "waiting_on": None if waiting is None else {"peer": waiting.peer, "kind": waiting.kind}}


class FlightRecorder:
    """The last ``limit`` collectives of this process: a fixed ring of entries written in place
    (a collective costs a few attribute writes, no allocation). An entry still running when
    the ring comes round to it again is left to its collective and replaced in the ring."""

    def __init__(self, limit: int = LIMIT):
        self.limit = limit
        self._ring: list[Entry] = []
        self._slots = itertools.count()          # the next slot, modulo limit (next() is atomic)
        self._last = -1                          # the slot taken last
        self._sequences: dict[str, int] = {}      # group key -> collectives begun (at most GROUPS_LIMIT keys)
        self._lock = threading.Lock()
        self.directory: str | None = None

    def begin(self, group: str, rank: int, size: int, algorithm: str, elements: int, itemsize: int, dtype,
              rounds: int = 0, transport=None) -> Entry:
        """A collective starts: its entry, phase "run" (the collective sets "agree" while it agrees).

        Example: ``e = RECORDER.begin("torch/world", 0, 2, "ring", 1024, 4, torch.float32, 2)``.
        """
        # no lock: a group's collectives run one at a time (its sequence is never raced), and two
        # groups' taking one slot at once can only cost an entry of the record, never a collective
        sequence = self._sequences.get(group, 0) + 1
        if sequence == 1 and len(self._sequences) >= GROUPS_LIMIT:
            self._sequences.pop(next(iter(self._sequences)), None)
        self._sequences[group] = sequence
        slot = next(self._slots) % self.limit
        self._last = slot
        ring = self._ring
        if slot >= len(ring):
            e = Entry()
            ring.append(e)
        else:
            e = ring[slot]
            if e.phase in ("run", "agree"):       # still running: leave it to its collective
                e = ring[slot] = Entry()
        e.sequence, e.group, e.rank, e.size, e.transport = sequence, group, rank, size, transport
        e.algorithm, e.elements, e.itemsize, e.dtype, e.rounds = algorithm, elements, itemsize, dtype, rounds
        e.phase, e.round, e.started, e.ended, e.error, e.peer = "run", -1, time.time(), None, None, None
        return e

    def end(self, entry: Entry, error: BaseException | None = None) -> str | None:
        """The collective ended; on a PeerError or MismatchError, write the record (if a
        directory is set) and return its path."""
        entry.ended = time.time()
        if error is None:
            entry.phase, entry.transport = "done", None       # the transport is kept only to say whom it waited on
            return None
        from ..errors import MismatchError, PeerError

        entry.phase, entry.error = "failed", f"{type(error).__name__}: {error}"
        entry.peer = getattr(error, "peer", None)
        if isinstance(error, (PeerError, MismatchError)):
            return self.dump(type(error).__name__)
        return None

    def entries(self) -> list[dict]:
        """The entries, oldest first."""
        with self._lock:
            ring = list(self._ring)
        if len(ring) == self.limit:               # full: oldest first, from the slot to be taken next
            start = (self._last + 1) % self.limit
            ring = ring[start:] + ring[:start]
        return [e.as_dict() for e in ring]

    def dump(self, reason: str, directory: str | None = None) -> str | None:
        """Write this process's entries to ``<directory>/rank<r>.json`` (default: the configured
        directory or GRADSYNC_FLIGHT_DIR); None when no directory is set or nothing was recorded."""
        directory = directory or self.directory or os.environ.get(ENV)
        entries = self.entries()
        if not directory or not entries:
            return None
        rank, size = entries[-1]["rank"], entries[-1]["size"]
        record = {"format": "gradsync.flight/1", "rank": rank, "size": size, "pid": os.getpid(),
                  "host": socket.gethostname(), "reason": reason, "written": time.time(), "collectives": entries}
        path = Path(directory) / f"rank{rank}.json"
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(record, indent=1))
            os.replace(tmp, path)            # a reader never sees half a file
        except OSError:
            return None                      # the recorder must not turn a failure into another
        return str(path)


RECORDER = FlightRecorder()


def configure(directory: str | os.PathLike, on_signal: bool = True) -> None:
    """Write flight records to ``directory`` on failures, and on SIGUSR1 when ``on_signal``
    (installed only from the main thread, and only if SIGUSR1 has no handler yet).

    Example: ``configure("/tmp/flight")``; then ``kill -USR1 <pid>`` writes /tmp/flight/rank<r>.json.
    """
    RECORDER.directory = str(directory)
    if on_signal:
        install_signal()


def watch_signal() -> bool:
    """Install the SIGUSR1 handler if GRADSYNC_FLIGHT_DIR is set (read now) and it is not yet
    installed; gradsync's entry points call it (``all_reduce``, the DDP hook, the KVStore,
    the local launcher's workers), so nothing is installed at import. Returns whether it is."""
    return SIGNAL.installed or (bool(os.environ.get(ENV)) and install_signal())


class _Signal:
    """The SIGUSR1 handler's state: whether it is installed, and the socket pair that carries
    the signal to the watcher thread (kept as long as the process)."""

    def __init__(self):
        self.installed = False
        self.sockets: list = []


SIGNAL = _Signal()


def install_signal() -> bool:
    """Dump the record on SIGUSR1, even while the main thread is blocked in a collective's wait:
    the signal's byte reaches a watcher thread through the wakeup fd, which writes the files.
    Returns whether it is installed (not from another thread, not over someone's handler)."""
    if SIGNAL.installed:
        return True
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, signal.SIG_IGN, None):   # ignored: the launcher's
        return False
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    try:
        previous = signal.set_wakeup_fd(writer.fileno())
    except ValueError:
        return False
    if previous != -1:                       # someone else (an event loop) owns the wakeup fd
        signal.set_wakeup_fd(previous)
        signal.signal(signal.SIGUSR1, lambda *_: RECORDER.dump("SIGUSR1"))
    else:
        signal.signal(signal.SIGUSR1, lambda *_: None)     # the watcher does the work
        threading.Thread(target=_watch, args=(reader,), name="gradsync-flight", daemon=True).start()
        SIGNAL.sockets.extend([reader, writer])
    SIGNAL.installed = True
    return True


def _watch(reader) -> None:
    while True:
        data = reader.recv(64)
        if not data:
            return
        if signal.SIGUSR1 in data:
            RECORDER.dump("SIGUSR1")
