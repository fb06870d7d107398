"""Measured traces of collectives: what each rank's thread did, when, on one clock for all ranks.

``Trace`` is handed to ``all_reduce(..., trace=t)`` on every rank; each collective records its
transfer events (``send``, ``recv wait``, ``send wait``, ``reduce``, ``copy``) as it runs them.
Without a trace the collective records into ``NO_RECORD``, whose calls do nothing.

Clocks: at the end of the first traced collective, every rank measures the offset of its
monotonic clock from rank 0's by ping-pong through the collective's transport (the exchange of
least round-trip time out of ``SYNC_ROUNDS``, Cristian's method), and every event of the trace
is shifted onto rank 0's clock, with time 0 where the first rank started its first traced
collective. The ranks'
``to_dict()`` outputs then merge into one file (``gradsync.tools.trace_files.merge``).

Example, in each rank::

    t = Trace()
    gradsync.all_reduce(grad, algorithm="ring", trace=t)
    t.save(f"rank{dist.get_rank()}.json")      # gradsync.tools.trace_files.merge joins the ranks' files
"""

from __future__ import annotations

import json
import threading
import time

import torch

from ..core import trace_events as fmt
from .transport.base import GATHER_TAG

SYNC_TAG = GATHER_TAG + 8       # inside the 16 tags the transports keep for their own exchanges
SYNC_ROUNDS = 5
EVENT_LIMIT = 1_000_000         # per trace; beyond, events are counted as dropped
now_ns = time.perf_counter_ns   # CLOCK_MONOTONIC on Linux: one clock for every process of a machine


class Trace:
    """This rank's record of the collectives it ran with ``trace=`` this object.

    ``to_dict()`` gives a Chrome trace (ui.perfetto.dev) of this rank on rank 0's clock;
    ``save(path)`` writes it. ``limit`` bounds the collectives and events kept together (later
    events are counted in ``dropped``), so a trace left on in a long loop does not grow without end.
    """

    def __init__(self, limit: int = EVENT_LIMIT):
        self.limit = limit
        self.rank: int | None = None
        self.offset_ns = 0            # add to this rank's clock to get rank 0's
        self.origin_ns: int | None = None   # time 0 of the trace, on rank 0's clock
        self.rtt_ns: int | None = None      # round trip of the exchange the offset came from
        self.dropped = 0
        self._collectives: list[dict] = []
        self._events: list[tuple] = []      # (collective index, name, t0, t1, args)
        self._lock = threading.Lock()

    @property
    def synced(self) -> bool:
        return self.origin_ns is not None

    def begin(self, rank: int, info: dict) -> "Recorder":
        """Start recording one collective (called by the collective); returns its recorder."""
        self.rank = rank
        with self._lock:
            if len(self._collectives) + len(self._events) >= self.limit:
                return Recorder(self, None)      # full: its events are counted as dropped
            self._collectives.append({"info": info, "t0": now_ns(), "t1": None})
            index = len(self._collectives) - 1
        return Recorder(self, index)

    def _add(self, event: tuple) -> None:
        if event[0] is not None and len(self._collectives) + len(self._events) < self.limit:
            self._events.append(event)
        else:
            self.dropped += 1

    def sync(self, transport, deadline: float) -> None:
        """Measure this rank's clock offset from rank 0's (every rank calls it together)."""
        if transport.size == 1:
            self.offset_ns, self.origin_ns, self.rtt_ns = 0, self._first_ns(), 0
            return
        stamp = torch.zeros(2, dtype=torch.int64)
        if transport.rank == 0:
            for peer in range(1, transport.size):
                for _ in range(SYNC_ROUNDS):
                    transport.wait([transport.recv(stamp, peer, SYNC_TAG)], deadline)
                    reply = torch.tensor([now_ns(), 0], dtype=torch.int64)
                    transport.wait([transport.send(reply, peer, SYNC_TAG + 1)], deadline)
            # time 0: the earliest first collective of any rank, on this clock
            firsts = [torch.zeros(2, dtype=torch.int64) for _ in range(transport.size)]
            transport.wait([transport.recv(firsts[p], p, SYNC_TAG + 2) for p in range(1, transport.size)], deadline)
            origin = min([self._first_ns()] + [int(f[0]) for f in firsts[1:]])
            reply = torch.tensor([origin, 0], dtype=torch.int64)
            transport.wait([transport.send(reply, p, SYNC_TAG + 3) for p in range(1, transport.size)], deadline)
            self.offset_ns, self.origin_ns, self.rtt_ns = 0, origin, 0
            return
        best = None
        for _ in range(SYNC_ROUNDS):
            t0 = now_ns()
            transport.wait([transport.send(torch.tensor([t0, 0], dtype=torch.int64), 0, SYNC_TAG)], deadline)
            transport.wait([transport.recv(stamp, 0, SYNC_TAG + 1)], deadline)
            t2 = now_ns()
            if best is None or t2 - t0 < best[0]:
                best = (t2 - t0, int(stamp[0]) - (t0 + t2) // 2)
        self.rtt_ns, self.offset_ns = best
        first = torch.tensor([self._first_ns() + self.offset_ns, 0], dtype=torch.int64)
        transport.wait([transport.send(first, 0, SYNC_TAG + 2)], deadline)
        transport.wait([transport.recv(stamp, 0, SYNC_TAG + 3)], deadline)
        self.origin_ns = int(stamp[0])

    def _first_ns(self) -> int:
        return self._collectives[0]["t0"] if self._collectives else now_ns()

    def to_dict(self) -> dict:
        """This rank's trace as a Chrome trace document (times on rank 0's clock, in us)."""
        rank = self.rank if self.rank is not None else 0
        origin = self.origin_ns if self.origin_ns is not None else self._first_ns()
        shift = self.offset_ns - origin

        def us(t):
            return (t + shift) / 1000.0

        with self._lock:
            collectives, events = list(self._collectives), list(self._events)
        out = fmt.metadata(rank, f"rank {rank}") + fmt.metadata(rank, "collective", tid=0)
        per, last = [[] for _ in collectives], [c["t0"] for c in collectives]
        for index, name, t0, t1, args in events:
            per[index].append(fmt.complete(name, "transfer", rank, us(t0), (t1 - t0) / 1000.0, args))
            last[index] = max(last[index], t1)
        for c, inner, end in zip(collectives, per, last):
            if c["t1"] is None:      # still running, or ended by an error: up to its last event
                c = {**c, "t1": end}
            out.append(fmt.complete(f"all_reduce {c['info'].get('algorithm')}", "collective", rank, us(c["t0"]),
                                    (c["t1"] - c["t0"]) / 1000.0, c["info"]))
            out += fmt.round_slices(inner, rank, us(c["t1"]))
            out += inner
        return fmt.document(out, "measured", rank=rank, offset_ns=self.offset_ns, rtt_ns=self.rtt_ns,
                            dropped=self.dropped)

    def save(self, path) -> None:
        """Write ``to_dict()`` as JSON to ``path``."""
        with open(path, "w") as fh:
            json.dump(self.to_dict(), fh)


class Recorder:
    """One collective's events; the collective calls ``now``, ``event``, ``spread`` and ``end``."""

    __slots__ = ("trace", "index")

    def __init__(self, trace: Trace, index: int):
        self.trace, self.index = trace, index

    @staticmethod
    def now() -> int:
        """The clock events are stamped with (``t0`` of ``event`` and ``spread``)."""
        return now_ns()

    def event(self, name: str, t0: int, args: dict) -> None:
        """A transfer event from ``t0`` (``now_ns()`` before it) to now."""
        self.trace._add((self.index, name, t0, now_ns(), args))

    def spread(self, name: str, t0: int, many: list[dict]) -> None:
        """Events that one call did together (a step's sends, posted at once): its time shared
        equally among them, one after another."""
        t1 = now_ns()
        step = (t1 - t0) // max(1, len(many))
        for k, args in enumerate(many):
            self.trace._add((self.index, name, t0 + k * step, t0 + (k + 1) * step, args))

    def end(self, transport, deadline: float) -> None:
        """The collective is done; on the first one, measure the clock offset."""
        if self.index is not None:
            self.trace._collectives[self.index]["t1"] = now_ns()
        if not self.trace.synced:
            self.trace.sync(transport, deadline)


class _NoRecord:
    """The recorder of an untraced collective: records nothing, costs a call. False in a test,
    so work done only for a trace (summing a decode's bytes per peer) can be skipped."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return False

    @staticmethod
    def now() -> int:
        return 0

    def event(self, name: str, t0: int, args: dict) -> None:
        pass

    def spread(self, name: str, t0: int, many: list[dict]) -> None:
        pass

    def end(self, transport, deadline: float) -> None:
        pass


NO_RECORD = _NoRecord()
