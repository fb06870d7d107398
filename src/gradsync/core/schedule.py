"""The schedule: one collective described as plain data.

Vocabulary, used in names everywhere:

- **worker**: one of the N participants holding a gradient (nodes 0..N-1). A schedule may add
  **helper** nodes after them (node N, N+1, ...) that hold no gradient, like the host CPU.
- **buffer**: each node's array of ``elements`` numbers; a helper's starts at zero.
- **segment**: a contiguous range ``[offset, offset + count)`` of the buffer.
- **chunk**: the segment one worker is responsible for (ring: 1/N of the buffer).
- **round**: one step of the collective. In a round every node sends a snapshot of segments
  of its buffer (as it was after the previous round) and applies what it receives.
- **transfer**: one message of a round: ``src`` sends ``count`` elements at ``offset``; the
  receiver either adds them into its buffer (``REDUCE``) or overwrites (``COPY``).
- **compute**: local work in multiply-adds a node does in a round beyond its reductions
  (encoding, decoding); the simulator charges it.
- **lane**: optionally, which of several concurrent paths a transfer belongs to (NCCL calls
  them channels: the rings of a multi-channel ring, the trees of a double binary tree). Lanes
  are one small integer per transfer (``Schedule.lane``, None when a schedule has one path);
  no reader needs them to run or time a schedule, they say which ring a transfer is part of
  (the browser colours each lane). gradsync says lane because the simulator's *channels* are
  the directions of links.

A worker moves to its next round when the transfers of its previous round are done, so
rounds are a per-worker order, not a global barrier.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..errors import ScheduleError

REDUCE, COPY, CODED = 0, 1, 2
OP_NAMES = ("reduce", "copy", "coded")

TRANSFER_DTYPE = np.dtype([("round", np.int32), ("src", np.int32), ("dst", np.int32),
                           ("offset", np.int64), ("count", np.int64), ("op", np.uint8)])
COMPUTE_DTYPE = np.dtype([("round", np.int32), ("node", np.int32), ("madds", np.int64)])
LANE_DTYPE = np.dtype(np.int16)


def chunk_bounds(elements: int, parts: int, weights=None) -> np.ndarray:
    """Return ``parts + 1`` offsets splitting ``elements`` into near-equal (or weighted) chunks.

    >>> chunk_bounds(10, 4).tolist()
    [0, 2, 5, 7, 10]
    """
    w = np.ones(parts) if weights is None else np.asarray(weights, dtype=float)
    cum = np.concatenate([[0.0], np.cumsum(w)]) / w.sum()
    return np.floor(cum * elements + 1e-9).astype(np.int64)


def transfers(round, src, dst, offset, count, op, out=None) -> np.ndarray:
    """Build a transfer table from broadcastable columns, dropping empty transfers; or fill
    ``out``, a table of the columns' broadcast shape, keeping them (large schedules build one
    table in parts this way, without concatenating copies).

    >>> len(transfers(0, [1, 2], 0, 0, [5, 0], REDUCE))
    1
    """
    cols = np.broadcast_arrays(*(np.asarray(c) for c in (round, src, dst, offset, count, op)))
    table = np.empty(cols[0].shape, TRANSFER_DTYPE) if out is None else out
    for name, col in zip(TRANSFER_DTYPE.names, cols):
        table[name] = col                 # broadcast in place: no flattened copy of each column
    if out is not None:
        return out
    table = table.reshape(-1)
    empty = table["count"] <= 0
    return table[~empty] if empty.any() else table


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class Schedule:
    """One all-reduce as data: rounds of transfers between nodes, plus local compute.

    Build it with an algorithm module (``gradsync.algorithms.ring.schedule(4, 100)``) rather
    than by hand. Transfers are a numpy table sorted by round (see ``TRANSFER_DTYPE``).

    >>> from gradsync.algorithms import ring
    >>> s = ring.schedule(4, 100)
    >>> s.rounds, len(s.transfers)
    (6, 24)
    """

    algorithm: str
    workers: int
    elements: int
    transfers: np.ndarray
    helpers: tuple[str, ...] = ()
    compute: np.ndarray = field(default_factory=lambda: np.empty(0, COMPUTE_DTYPE))
    options: dict = field(default_factory=dict)
    codec: dict | None = None  # for CODED transfers: the name and parameters of the codec
    lane: np.ndarray | None = None   # per transfer, its lane (NCCL's channel), or None: one lane

    def __post_init__(self):
        rounds = self.transfers["round"]
        lane = None if self.lane is None else np.asarray(self.lane, LANE_DTYPE).reshape(-1)
        if lane is not None and len(lane) != len(rounds):
            raise ScheduleError(f"lane: expected one per transfer ({len(rounds)}), got {len(lane)}")
        if len(rounds) > 1 and (rounds[1:] < rounds[:-1]).any():   # most builders emit them in order
            order = np.argsort(rounds, kind="stable")
            object.__setattr__(self, "transfers", self.transfers[order])
            lane = None if lane is None else lane[order]
        object.__setattr__(self, "lane", None if lane is None else _frozen(lane))
        object.__setattr__(self, "transfers", _frozen(self.transfers))
        object.__setattr__(self, "compute", _frozen(self.compute))
        object.__setattr__(self, "helpers", tuple(self.helpers))

    @property
    def nodes(self) -> int:
        return self.workers + len(self.helpers)

    @property
    def rounds(self) -> int:
        last = [a["round"].max() for a in (self.transfers, self.compute) if len(a)]
        return int(max(last)) + 1 if last else 0

    @cached_property
    def round_starts(self) -> np.ndarray:
        """Index of the first transfer of each round (length rounds + 1)."""
        return np.searchsorted(self.transfers["round"], np.arange(self.rounds + 1))

    def round(self, r: int) -> np.ndarray:
        """The transfers of round ``r``."""
        return self.transfers[self.round_starts[r]:self.round_starts[r + 1]]

    def elements_sent(self) -> np.ndarray:
        """Elements each node sends over the whole collective (length ``nodes``)."""
        return np.bincount(self.transfers["src"], weights=self.transfers["count"],
                           minlength=self.nodes).astype(np.int64)

    # --- serialization -------------------------------------------------------------------
    def to_dict(self) -> dict:
        """A JSON-ready dict; transfers are stored column by column (and their lanes, if any)."""
        out = {
            "format": "gradsync.schedule/1",
            "algorithm": self.algorithm, "workers": self.workers, "elements": self.elements,
            "helpers": list(self.helpers), "options": self.options, "codec": self.codec,
            "transfers": {n: self.transfers[n].tolist() for n in TRANSFER_DTYPE.names},
            "compute": {n: self.compute[n].tolist() for n in COMPUTE_DTYPE.names},
        }
        if self.lane is not None:
            out["lane"] = self.lane.tolist()
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict) -> "Schedule":
        """Rebuild a schedule from ``to_dict`` output; raises ``ScheduleError`` if malformed."""
        try:
            if data.get("format") != "gradsync.schedule/1":
                raise ScheduleError(f"not a gradsync schedule: format {data.get('format')!r}")

            def table(cols, dtype):
                lengths = {len(cols[n]) for n in dtype.names}
                if len(lengths) > 1:
                    raise ScheduleError(f"columns of different lengths: {sorted(lengths)}")
                out = np.empty(lengths.pop() if lengths else 0, dtype)
                for n in dtype.names:
                    out[n] = cols[n]
                return out

            return cls(algorithm=str(data["algorithm"]), workers=int(data["workers"]),
                       elements=int(data["elements"]), helpers=tuple(data.get("helpers", ())),
                       transfers=table(data["transfers"], TRANSFER_DTYPE),
                       compute=table(data["compute"], COMPUTE_DTYPE),
                       options=dict(data.get("options") or {}), codec=data.get("codec"),
                       lane=None if data.get("lane") is None else np.asarray(data["lane"], LANE_DTYPE))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ScheduleError(f"malformed schedule: {type(exc).__name__}: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        return cls.from_dict(json.loads(text))


def _fail(msg: str, t=None):
    if t is not None:
        msg = (f"round {t['round']}: transfer {t['src']} -> {t['dst']} "
               f"[{t['offset']}, {t['offset'] + t['count']}) {OP_NAMES[t['op']]}: {msg}")
    raise ScheduleError(msg)


def verify(schedule: Schedule) -> None:
    """Check a schedule; raise ``ScheduleError`` naming the first problem found.

    Checks that every transfer's endpoints and segment exist; that no node writes one element
    twice in a round with a COPY involved (the result would depend on arrival order); that no
    node sends a segment before anything has arrived in it (a helper's empty buffer); and,
    executing the schedule symbolically, that no input is ever added twice and that every
    worker ends holding every worker's input exactly once. CODED transfers carry encoded
    packets whose meaning belongs to a codec, so only their structure is checked here.

    A compact schedule (``core.compact``) is checked from its program and group, without
    expanding it (``core.compact_check``).

    >>> from gradsync.algorithms import ring
    >>> verify(ring.schedule(5, 13)), verify(ring.compact(5, 13))
    (None, None)
    """
    if hasattr(schedule, "expand"):        # a compact schedule
        schedule.verify()
        return
    s, t = schedule, schedule.transfers
    if s.workers < 1 or s.elements < 0:
        _fail(f"need workers >= 1 and elements >= 0, got {s.workers} and {s.elements}")
    bad = ((t["src"] < 0) | (t["src"] >= s.nodes) | (t["dst"] < 0) | (t["dst"] >= s.nodes)
           | (t["src"] == t["dst"]) | (t["count"] <= 0) | (t["op"] > CODED) | (t["round"] < 0))
    if s.codec is None:
        bad |= (t["offset"] < 0) | (t["offset"] + t["count"] > s.elements) | (t["op"] == CODED)
    if bad.any():
        _fail(f"endpoints must be distinct nodes in 0..{s.nodes - 1}, segments inside "
              f"0..{s.elements}, CODED only with a codec", t[np.argmax(bad)])
    if s.codec is not None:
        from .. import coding
        coding.verify(s)
        return
    _check_write_conflicts(t)
    _execute_symbolically(s)


def _check_write_conflicts(t: np.ndarray) -> None:
    order = np.lexsort((t["offset"], t["dst"], t["round"]))
    a, b = t[order[:-1]], t[order[1:]]
    clash = ((a["round"] == b["round"]) & (a["dst"] == b["dst"])
             & (b["offset"] < a["offset"] + a["count"]) & ((a["op"] == COPY) | (b["op"] == COPY)))
    if clash.any():
        _fail("another transfer of the same round writes the same elements of this node "
              "with a copy", b[np.argmax(clash)])


def intervals(schedule: Schedule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The elementary intervals no transfer splits: their ``cuts`` (offsets, first 0, last
    ``elements``), and for each transfer the index of its ``first`` interval and one past its
    ``last``.

    >>> from gradsync.algorithms import ring
    >>> intervals(ring.schedule(2, 10))[0].tolist()
    [0, 5, 10]
    """
    t = schedule.transfers
    cuts = np.unique(np.concatenate([[0, schedule.elements], t["offset"], t["offset"] + t["count"]]))
    return cuts, np.searchsorted(cuts, t["offset"]), np.searchsorted(cuts, t["offset"] + t["count"])


def _symbolic_state(s: Schedule, ops=(REDUCE, COPY)):
    """Run the schedule on sets of worker inputs (bit-packed); return the cuts and what each
    node holds in each elementary interval. Raises ScheduleError on the first bad transfer."""
    t = s.transfers
    cuts, first, last = intervals(s)
    nwords = (s.workers + 7) // 8
    own = np.packbits(np.eye(s.workers, dtype=bool), axis=1)          # worker w holds bit w
    held = np.zeros((s.nodes, max(len(cuts) - 1, 0), nwords), np.uint8)
    held[:s.workers] = own[:, None, :]
    chosen = np.isin(t["op"], ops)
    for r in range(s.rounds):
        lo, hi = s.round_starts[r], s.round_starts[r + 1]
        idx = [i for i in range(lo, hi) if chosen[i]]
        payloads = [held[t["src"][i], first[i]:last[i]].copy() for i in idx]
        for i, payload in zip(idx, payloads):
            if not payload.any(axis=-1).all():
                _fail("sends elements that hold no input yet (read before arrival)", t[i])
            dst = held[t["dst"][i], first[i]:last[i]]
            if t["op"][i] == COPY:
                dst[...] = payload
            else:
                overlap = np.unpackbits(dst & payload, axis=-1, count=s.workers).any(axis=0)
                if overlap.any():
                    _fail(f"worker {np.flatnonzero(overlap)[0]}'s input would be counted twice", t[i])
                dst |= payload
    full = np.packbits(np.ones(s.workers, dtype=bool))
    return cuts, held, (held == full).all(axis=-1)


def _execute_symbolically(s: Schedule) -> None:
    cuts, held, done = _symbolic_state(s)
    done = done[:s.workers]
    if not done.all():
        w, iv = np.argwhere(~done)[0]
        missing = np.flatnonzero(~np.unpackbits(held[w, iv], count=s.workers).astype(bool))
        _fail(f"worker {w} ends without the input of worker(s) {missing[:8].tolist()} "
              f"in elements [{cuts[iv]}, {cuts[iv + 1]})")


def complete_segments(schedule: Schedule) -> dict[int, list[tuple[int, int]]]:
    """Where each node holds the complete sum once the schedule's REDUCE transfers have run:
    the segments it owns in a key-value store built on this schedule.

    >>> from gradsync.algorithms import ring
    >>> complete_segments(ring.schedule(2, 10))
    {0: [(5, 5)], 1: [(0, 5)]}
    """
    cuts, _, done = _symbolic_state(schedule, ops=(REDUCE,))
    out = {}
    for node in range(schedule.nodes):
        iv = np.flatnonzero(done[node])
        if len(iv):
            # merge adjacent intervals into segments
            runs = np.split(iv, np.flatnonzero(np.diff(iv) != 1) + 1)
            out[node] = [(int(cuts[g[0]]), int(cuts[g[-1] + 1] - cuts[g[0]])) for g in runs]
    return out


def carried_inputs(schedule: Schedule) -> np.ndarray:
    """How many workers' inputs each transfer carries (the fewest over its elements); for the
    browser's view of partial sums. Coded schedules carry mixtures: -1. Counts, not sets: run
    ``verify`` for correctness; this is vectorized per round for speed.

    >>> from gradsync.algorithms import ring
    >>> carried_inputs(ring.schedule(3, 6)).tolist()
    [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3, 3]
    """
    t = schedule.transfers
    carried = np.full(len(t), -1, np.int64)
    if schedule.codec is not None or not len(t):
        return carried
    cuts, first, last = intervals(schedule)
    counts = np.zeros((schedule.nodes, len(cuts) - 1), np.int64)
    counts[:schedule.workers] = 1
    width = last - first
    for r in range(schedule.rounds):
        lo, hi = schedule.round_starts[r], schedule.round_starts[r + 1]
        if lo == hi:
            continue
        w = width[lo:hi]
        which = np.repeat(np.arange(lo, hi), w)                      # transfer of each (transfer, interval)
        iv = np.arange(w.sum()) - np.repeat(np.cumsum(w) - w, w) + first[which]
        payload = counts[t["src"][which], iv]                        # snapshot before any write
        carried[lo:hi] = np.minimum.reduceat(payload, np.cumsum(w) - w)
        copy = t["op"][which] == COPY
        counts[t["dst"][which][copy], iv[copy]] = payload[copy]
        np.add.at(counts, (t["dst"][which][~copy], iv[~copy]), payload[~copy])
    return carried
