"""Compact schedules: one worker's program and the rotations that give every other worker's.

A schedule built from a rule (ring, sharded, host, hierarchical, halving-doubling) is the same
program on every worker, shifted. Its table grows as N times the program (a ring: 2N(N - 1)
transfers, 8.6e9 at 65,536 workers); the compact form keeps the program and the group instead:

- **shape** ``(d_0, ..., d_{k-1})``: worker w has the digits of w in this mixed radix (last
  digit fastest), and the group element g = (g_0, ...) moves worker digits to (w_i + g_i) mod d_i.
  Helpers (node N and up) are fixed. A ring is shape (N,); hierarchical, (machines, local);
  halving-doubling on 2^k workers, (2,) * k (adding modulo 2 is XOR).
- **program**: the transfers of the group element 0 (those worker 0 anchors), each with its
  round, source, destination and op, and its segment as **chunk digits**: one per level of a
  nested split of the buffer (``levels``: (group dimension, parts)), -1 for "the whole of it";
  from level ``flat`` on, the digits index one split into the levels' product of chunks.
  Rotating by g adds g's digit of that dimension to the chunk digit, so rotated copies of a
  transfer move the rotated chunk. A level of dimension -1 does not rotate: its digit is the
  same in every copy (NCCL's rail rings: which chunk of a ring's machine-sized stretch, the
  part a rotation of machines leaves in place).
- **lanes**: where a schedule runs several paths at once (NCCL's channels), ``lane_level``
  names the level whose digit, rotated, is each transfer's lane in the expanded table.

Segments come from the same arithmetic as ``chunk_bounds``, so a size that N does not divide
keeps the compact form: its chunks differ by one element and fall in two size classes per
level. ``expand()`` gives today's ``Schedule`` table (for the runtime, the view, JSON);
``verify()`` checks the schedule without it (``core.compact_check``).

>>> from gradsync.algorithms import ring
>>> c = ring.compact(4, 100)
>>> len(c.program), c.transfer_count, c.equal_chunks
(6, 24, True)
>>> np.array_equal(c.expand().transfers, ring.schedule(4, 100).transfers)
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..errors import ScheduleError
from .schedule import TRANSFER_DTYPE, Schedule

PROGRAM_DTYPE = np.dtype([("round", np.int32), ("src", np.int32), ("dst", np.int32), ("op", np.uint8)])
COUNT_CLASSES = (None, "low", "high")   # exact counts, or every chunk at its level's smallest / largest size


def _cum(parts: int) -> np.ndarray:
    """The fractions ``chunk_bounds`` multiplies by, computed as it does (bit for bit)."""
    w = np.ones(parts)
    return np.concatenate([[0.0], np.cumsum(w)]) / w.sum()


@dataclass(frozen=True, eq=False)
class CompactSchedule:
    """One collective as a program of worker 0 plus the rotations that give the others.

    >>> from gradsync.algorithms import hierarchical
    >>> c = hierarchical.compact(8, 1000, local_size=4)
    >>> c.shape, c.transfer_count, c.rounds
    ((2, 4), 64, 8)
    """

    algorithm: str
    workers: int
    elements: int
    shape: tuple[int, ...]
    levels: tuple[tuple[int, int], ...]      # per chunk digit: (group dimension it rotates with, parts)
    program: np.ndarray                      # PROGRAM_DTYPE, sorted by round
    digits: np.ndarray                       # (len(program), len(levels)) chunk digits, -1: whole
    helpers: tuple[str, ...] = ()
    options: dict = field(default_factory=dict)
    lexsorted: bool = False                  # the builder's table is sorted by (round, src, dst)
    count_class: str | None = None           # None: exact; "low"/"high": a bound (see with_counts)
    flat: int | None = None                  # levels from this one on index one split into prod(parts)
                                             # chunks of the nested chunk (free digits: a run), not nested
    lane_level: int | None = None            # the level whose (rotated) digit is a transfer's lane

    def __post_init__(self):
        if int(np.prod(self.shape)) != self.workers or min(self.shape, default=1) < 1:
            raise ScheduleError(f"shape {self.shape} does not give {self.workers} workers")
        if self.digits.shape != (len(self.program), len(self.levels)):
            raise ScheduleError(f"digits of shape {self.digits.shape}, expected {(len(self.program), len(self.levels))}")
        if len(self.program) > 1 and (np.diff(self.program["round"]) < 0).any():
            raise ScheduleError("the program must be sorted by round")
        if self.count_class not in COUNT_CLASSES:
            raise ScheduleError(f"count_class must be one of {COUNT_CLASSES}, got {self.count_class!r}")
        if any(not -1 <= dim < len(self.shape) for dim, _ in self.levels):
            raise ScheduleError(f"levels {self.levels}: each rotates with a dimension of {self.shape} or -1 (none)")
        if self.lane_level is not None and not 0 <= self.lane_level < len(self.levels):
            raise ScheduleError(f"lane_level must name one of the {len(self.levels)} levels, got {self.lane_level!r}")

    @property
    def nodes(self) -> int:
        return self.workers + len(self.helpers)

    @property
    def rounds(self) -> int:
        return int(self.program["round"].max()) + 1 if len(self.program) else 0

    @property
    def transfer_count(self) -> int:
        """Transfers of the expanded table (every rotation of every program transfer)."""
        return len(self.program) * self.workers

    @property
    def compute(self) -> np.ndarray:
        from .schedule import COMPUTE_DTYPE
        return np.empty(0, COMPUTE_DTYPE)

    @property
    def codec(self):
        return None

    # --- chunks ----------------------------------------------------------------------------
    def _split(self):
        """The nested levels' parts, and the flat levels' (one split inside the nested chunk)."""
        parts = [p for _, p in self.levels]
        f = len(parts) if self.flat is None else self.flat
        return parts[:f], parts[f:]

    def level_sizes(self) -> list[tuple[int, int]]:
        """Per level, the smallest and largest chunk size there: ``[(25, 25)]`` for a ring of 4
        workers over 100 elements."""
        nested, flat = self._split()
        lo = hi = self.elements
        out = []
        for parts in nested:
            lo, hi = lo // parts, -(-hi // parts)
            out.append((lo, hi))
        width = 1
        for parts in flat:                            # a run of chunks of one split: 1 / width of it
            width *= parts
            out.append((lo // width, -(-hi // width)))
        return out

    @property
    def equal_chunks(self) -> bool:
        """Whether every level splits its chunks evenly: then every rotation of a transfer moves
        as many elements as the transfer itself (always, for a bound: ``with_counts``)."""
        if self.count_class is not None:
            return True
        nested, flat = self._split()
        size = self.elements
        for parts in nested + [int(np.prod(flat))]:
            if size % parts:
                return False
            size //= parts
        return True

    def with_counts(self, count_class: str) -> "CompactSchedule":
        """The same program with every chunk at its level's smallest (``"low"``) or largest
        (``"high"``) size: two schedules of equal chunks that bracket this one's time."""
        return CompactSchedule(self.algorithm, self.workers, self.elements, self.shape, self.levels, self.program,
                               self.digits, self.helpers, self.options, self.lexsorted, count_class, self.flat,
                               self.lane_level)

    def segments(self, digits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Offsets and counts of chunk ``digits`` (rows of ``digits``' form), as the builders'
        ``chunk_bounds`` give them, or every chunk at its class's bound (``count_class``)."""
        nested, flat = self._split()
        offset = np.zeros(len(digits), np.int64)
        size = np.full(len(digits), self.elements, np.int64)
        for k, parts in enumerate(nested):
            d = digits[:, k]
            offset, size = self._cut(offset, size, d >= 0, np.maximum(d, 0), 1, parts)
        if flat:                                      # the flat levels' digits pick a run of chunks
            first, width = np.zeros(len(digits), np.int64), np.ones(len(digits), np.int64)
            for k, parts in enumerate(flat, start=len(nested)):
                d = digits[:, k]
                first, width = first * parts + np.maximum(d, 0), np.where(d >= 0, width, width * parts)
            offset, size = self._cut(offset, size, np.ones(len(digits), bool), first, width, int(np.prod(flat)))
        if self.count_class is not None:
            bounds = [(self.elements, self.elements)] + self.level_sizes()
            pick = 0 if self.count_class == "low" else 1
            size = np.array([b[pick] for b in bounds], np.int64)[(digits >= 0).sum(axis=1)]
        return offset, size

    @staticmethod
    def _cut(offset, size, where, first, width, parts):
        """Chunks first..first + width - 1 of each segment split ``chunk_bounds``' way into ``parts``."""
        cum = _cum(parts)
        lo = np.floor(cum[first] * size + 1e-9).astype(np.int64)
        hi = np.floor(cum[first + width] * size + 1e-9).astype(np.int64)
        return np.where(where, offset + lo, offset), np.where(where, hi - lo, size)

    # --- the group -------------------------------------------------------------------------
    def rotate(self, nodes: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Nodes moved by group elements ``g`` (rows of digits, broadcast against ``nodes``);
        helpers stay."""
        shape = np.array(self.shape, np.int64)
        strides = np.concatenate([np.cumprod(shape[::-1])[::-1][1:], [1]])
        nodes = np.asarray(nodes, np.int64)
        worker = nodes < self.workers
        w = np.where(worker, nodes, 0)
        out = np.zeros(np.broadcast_shapes(w.shape, g.shape[:-1]), np.int64)
        for i, d in enumerate(self.shape):
            out = out + ((w // strides[i] % d + g[..., i]) % d) * strides[i]
        return np.where(worker, out, nodes)

    def rotate_digits(self, digits: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Chunk digits moved by group elements ``g`` (-1 stays -1; a level of dimension -1 stays)."""
        out = np.empty(np.broadcast_shapes(digits.shape[:-1], g.shape[:-1]) + (len(self.levels),), np.int64)
        for k, (dim, parts) in enumerate(self.levels):
            d = digits[..., k]
            out[..., k] = d if dim < 0 else np.where(d >= 0, (d + g[..., dim]) % parts, -1)
        return out

    def elements_of(self, strides: tuple[int, ...]) -> np.ndarray:
        """The group elements with digit i in 0..strides[i] - 1 (coset representatives of the
        subgroup of multiples of ``strides``), in worker order, as rows of digits."""
        grids = np.meshgrid(*(np.arange(s) for s in strides), indexing="ij")
        return np.stack([g.ravel() for g in grids], axis=-1).astype(np.int64) if grids else np.zeros((1, 0), np.int64)

    def block(self, strides: tuple[int, ...], lanes: bool = False):
        """The program rotated by every element of ``elements_of(strides)``: the transfers whose
        copies under the subgroup of multiples of ``strides`` give the whole schedule, as a
        TRANSFER_DTYPE table ordered program row first (with ``lanes``, and each one's lane)."""
        g = self.elements_of(strides)[None, :, :]
        p = self.program[:, None]
        out = np.empty((len(self.program), g.shape[1]), TRANSFER_DTYPE)
        out["round"], out["op"] = p["round"], p["op"]
        out["src"], out["dst"] = self.rotate(p["src"], g), self.rotate(p["dst"], g)
        moved = self.rotate_digits(self.digits[:, None, :], g).reshape(out.size, len(self.levels))
        offset, count = self.segments(moved)
        out["offset"], out["count"] = offset.reshape(out.shape), count.reshape(out.shape)
        if not lanes:
            return out.reshape(-1)
        lane = None if self.lane_level is None else moved[:, self.lane_level].astype(np.int16)
        return out.reshape(-1), lane

    # --- the table -------------------------------------------------------------------------
    @cached_property
    def _expanded(self) -> tuple[Schedule, np.ndarray]:
        table, lane = self.block(self.shape, lanes=True)
        row = np.repeat(np.arange(len(self.program)), self.workers)
        if self.lexsorted:
            order = np.lexsort((table["dst"], table["src"], table["round"]))
            table, row = table[order], row[order]
            lane = None if lane is None else lane[order]
        if (table["count"] <= 0).any():
            raise ScheduleError("a compact schedule's transfers must all move something")
        schedule = Schedule(self.algorithm, self.workers, self.elements, table, helpers=self.helpers,
                            options=dict(self.options), lane=lane)
        return schedule, row

    def expand(self) -> Schedule:
        """Today's table: every rotation of every program transfer, in the builder's order.

        >>> from gradsync.algorithms import sharded
        >>> len(sharded.compact(4, 8).expand().transfers)
        24
        """
        return self._expanded[0]

    @property
    def transfers(self) -> np.ndarray:
        """The expanded table (for readers that need every transfer; large at large N)."""
        return self.expand().transfers

    def flow_of_transfer(self, strides: tuple[int, ...]) -> np.ndarray:
        """Per transfer of ``expand()``, the row of ``block(strides)`` it is a rotation of."""
        row = self._expanded[1]
        table = self.expand().transfers
        anchor = np.where(self.program["src"][row] < self.workers, self.program["src"][row],
                          self.program["dst"][row]).astype(np.int64)
        moved = np.where(table["src"] < self.workers, table["src"], table["dst"]).astype(np.int64)
        # the group element that moved the anchor, reduced to its coset representative
        shape = np.array(self.shape, np.int64)
        place = np.concatenate([np.cumprod(shape[::-1])[::-1][1:], [1]])
        index = np.zeros(len(table), np.int64)
        for i, d in enumerate(self.shape):
            digit = (moved // place[i] % d - anchor // place[i] % d) % d % strides[i]
            index = index * strides[i] + digit
        return row * int(np.prod(strides)) + index

    def verify(self) -> None:
        """``core.schedule.verify`` without expanding the table (``core.compact_check``)."""
        from .compact_check import verify
        verify(self)

    def to_dict(self) -> dict:
        """A JSON-ready description: the program, its chunk digits and the group."""
        return {"format": "gradsync.compact/1", "algorithm": self.algorithm, "workers": self.workers,
                "elements": self.elements, "shape": list(self.shape), "levels": [list(x) for x in self.levels],
                "helpers": list(self.helpers), "options": self.options, "lexsorted": self.lexsorted, "flat": self.flat,
                "lane_level": self.lane_level,
                "program": {n: self.program[n].tolist() for n in PROGRAM_DTYPE.names},
                "digits": self.digits.tolist()}

    @classmethod
    def from_dict(cls, data: dict) -> "CompactSchedule":
        """Rebuild from ``to_dict`` output (lists or arrays); ScheduleError if malformed."""
        try:
            if data.get("format") != "gradsync.compact/1":
                raise ScheduleError(f"not a compact schedule: format {data.get('format')!r}")
            cols = data["program"]
            table = np.empty(len(cols["round"]), PROGRAM_DTYPE)
            for name in PROGRAM_DTYPE.names:
                table[name] = cols[name]
            levels = tuple((int(d), int(p)) for d, p in data["levels"])
            digits = np.asarray(data["digits"], np.int64).reshape(len(table), len(levels))
            return cls(str(data["algorithm"]), int(data["workers"]), int(data["elements"]),
                       tuple(int(d) for d in data["shape"]), levels, table, digits, tuple(data.get("helpers", ())),
                       dict(data.get("options") or {}), bool(data.get("lexsorted", False)),
                       flat=data.get("flat"), lane_level=data.get("lane_level"))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ScheduleError(f"malformed compact schedule: {type(exc).__name__}: {exc}") from None


def program(round, src, dst, op, digits) -> tuple[np.ndarray, np.ndarray]:
    """A program table and its chunk digits (one column per level) from broadcastable columns,
    sorted by round: ``program([1, 0], 0, 1, 0, [[2], [3]])[1].tolist() == [[3], [2]]``."""
    round, src, dst, op = np.broadcast_arrays(*(np.asarray(x) for x in (round, src, dst, op)))
    table = np.empty(round.shape, PROGRAM_DTYPE)
    for name, col in zip(PROGRAM_DTYPE.names, (round, src, dst, op)):
        table[name] = col
    digits = np.asarray(digits, np.int64)
    digits = np.broadcast_to(digits, (len(table), digits.shape[-1])) if digits.ndim == 2 else digits.reshape(len(table), 1)
    order = np.argsort(table["round"], kind="stable")
    return table[order], digits[order]
