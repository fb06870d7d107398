"""The shared buffers of a group's segment: every rank's slot, readable by every rank of the
host, the barrier between the rounds that read them, and the collectives run on them.

A collective on shared buffers copies each rank's data into its slot, then runs rounds of
direct reads: no messages, no frames, no second copy. The work is done in C
(``native.c``: its opening comment states the protocol, word by word, and why it is correct on
x86 and ARM alike); this module hands it the segment's words and the tensors' addresses, cuts
messages larger than a slot into pieces, and turns a failed wait into the group's
``PeerError`` or a ``MismatchError``.

- all-reduce runs a *read program* (``runtime.reads``: compiled from the algorithm's own
  schedule, one_shot or sharded), piece by piece;
- reduce-scatter, all-gather and broadcast are the one round of reads they are (sharded's
  REDUCE round, its COPY round, copies from the root), in torch's order of ranks;
- a barrier is one meeting of the ranks.

Every collective checks, after its first barrier, that every rank published the same digest
(the same collective, shape and dtype): a rank that runs something else, or skipped one, is
named in a ``MismatchError`` on every rank.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from ....errors import MismatchError, PeerError
from . import _native
from .group import CHECK_EVERY_S, NAP_S, SharedGroup
from .segment import ARRIVED, BLOCKED, CLOSED, FAILED, GENERATION, PID, START

SPIN_S = 200e-6              # look this long (yielding the core between looks) before sleeping on the word
PIECE_BYTES = 4 << 20        # a slot's use per piece: the ranks' pieces stay in the last-level cache between
                             # copy-in, reduce and copy-out (GRADSYNC_SHM_PIECE_BYTES, read at set-up, changes it)
DTYPES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3, torch.int8: 4,
          torch.uint8: 5, torch.int16: 6, torch.int32: 7, torch.int64: 8, torch.bool: 9}
OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")
_FLOAT_ONLY = ("avg",)
_INT_ONLY = ("band", "bor", "bxor")


def reduces(dtype: torch.dtype, op: str) -> bool:
    """Whether the shared buffers can reduce ``dtype`` with ``op`` (else the engine does).

    >>> reduces(torch.float32, "avg"), reduces(torch.int64, "avg"), reduces(torch.complex64, "sum")
    (True, False, False)
    """
    if dtype not in DTYPES or op not in OPS:
        return False
    if op in _FLOAT_ONLY:
        return dtype.is_floating_point
    return not (op in _INT_ONLY and dtype.is_floating_point)


def _deadline_ns(deadline: float) -> int:
    return int(deadline * 1e9)


def digest_words(signature: bytes | None) -> tuple[int, int]:
    """A 16-byte digest as the two int64 words C compares (0, 0 for none).

    >>> digest_words(bytes(range(16)))[0] == int.from_bytes(bytes(range(8)), "little")
    True
    """
    if signature is None:
        return 0, 0
    return int.from_bytes(signature[:8], "little", signed=True), int.from_bytes(signature[8:16], "little", signed=True)


_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
_DTYPE_NAMES = {code: str(dtype).removeprefix("torch.") for dtype, code in DTYPES.items()}


def _what(word: int) -> str:
    """What a rank runs, from the word its collective wrote beside its digest.

    >>> _what((2 << 56) | (0 << 48) | 1000)
    'all_gather, shape [1000] per rank (flat), dtype float32'
    """
    collective, dtype, count = (word >> 56) & 0xFF, (word >> 48) & 0xFF, word & 0xFFFFFFFFFFFF
    if collective >= len(_COLLECTIVES):
        return "another collective"
    per = " (flat)" if collective == 0 else " per rank (flat)"
    return f"{_COLLECTIVES[collective]}, shape [{count}]{per}, dtype {_DTYPE_NAMES.get(dtype, '?')}"


class _Waiting:
    """What a wait looks like to ``SharedGroup``'s failure check (a receive from ``peer``)."""

    __slots__ = ("peer", "kind")

    def __init__(self, peer: int):
        self.peer, self.kind = peer, "recv"


class SharedBuffers:
    """This rank's view of its group's shared buffers. Made once per ``SharedGroup`` (its
    ``buffers``), used by one collective at a time (the group's progress engine sees to it).

    Example, in each rank of a group on one host::

        buffers = SharedBuffers.of(shared_group())
        buffers.all_reduce(grad, "sum", lambda m: reads.packed("one_shot", 4, m, rank), deadline)
    """

    def __init__(self, group: SharedGroup):
        lay = group.layout
        self.group, self.rank, self.size = group, group.rank, group.size
        words = [8 * FAILED, 8 * GENERATION]
        for r in range(group.size):
            words += [8 * lay.rank_word(r, f) for f in (ARRIVED, PID, START, CLOSED, BLOCKED)]
        # between looks the waiter yields its core: a peer that shares it (more ranks than cores,
        # or other work on the machine) runs at once; alone on its core, the yield returns at
        # once. Spinning on a pause instead took 0.7 ms per barrier here when the two ranks of a
        # pair had landed on one core (load average 8), against 7 us with the yield
        yield_core = os.environ.get("GRADSYNC_SHM_YIELD", "1") == "1"
        spin = float(os.environ.get("GRADSYNC_SHM_SPIN_US", 0)) * 1e-6 or SPIN_S
        self.native = _native.Group(group.address, group.rank, group.size, words, lay.region(0, 0),
                                    lay.region_bytes, int(spin * 1e9),
                                    int(NAP_S * 1e9), int(CHECK_EVERY_S * 1e9), yield_core)
        piece = int(os.environ.get("GRADSYNC_SHM_PIECE_BYTES", PIECE_BYTES))
        self.native.capacity = max(64, min(self.native.capacity, piece))
        self._digests = [np.ndarray((group.size, 3), np.int64, buffer=group.mm, offset=lay.region(0, parity),
                                    strides=(lay.region_bytes, 8)) for parity in (0, 1)]

    @property
    def capacity(self) -> int:
        """Bytes of data a slot holds (tests cut it, so that messages go in pieces)."""
        return self.native.capacity

    @capacity.setter
    def capacity(self, value: int) -> None:
        self.native.capacity = value

    @property
    def uses(self) -> int:
        """Collectives begun on the slots so far (each takes the next parity)."""
        return self.native.uses

    @classmethod
    def of(cls, group: SharedGroup) -> "SharedBuffers":
        """The group's shared buffers (made on first use, kept on the group: one per group)."""
        if getattr(group, "buffers", None) is None:
            group.buffers = cls(group)
        return group.buffers

    # --- the collectives (each raises the group's PeerError, or MismatchError) -----------------

    def all_reduce(self, flat: torch.Tensor, op: str, program_of, deadline: float,
                   signature: bytes | None = None) -> torch.Tensor:
        """All-reduce ``flat`` (contiguous, this rank's data) in place by the read program
        ``program_of(elements)`` gives for a piece of that many elements (``reads.packed``)."""
        d0, d1 = digest_words(signature)
        status = self.run_pieces(flat, DTYPES[flat.dtype], OPS.index(op), program_of, _deadline_ns(deadline), d0, d1,
                                 signature is not None)
        self.check(status, deadline)
        return flat

    def run_pieces(self, flat: torch.Tensor, dtype: int, op: int, program_of, deadline_ns: int, d0: int, d1: int,
                   check: bool = True):
        """All-reduce ``flat`` piece by piece, each piece as large as a slot holds; C's status
        of the first piece that failed, or None."""
        per = max(1, self.capacity // flat.element_size())
        total, address, size = flat.numel(), flat.data_ptr(), flat.element_size()
        for first in range(0, total, per):
            m = min(per, total - first)
            status = self.native.run_reads(address + first * size, m, dtype, op, deadline_ns, d0, d1,
                                           first == 0 and check, program_of(m))
            if status is not None:
                return status
        return None

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: str, deadline: float,
                       signature: bytes | None = None) -> torch.Tensor:
        """``out`` (contiguous) gets ``op`` over every rank of chunk ``rank`` of ``inp`` (N chunks)."""
        d0, d1 = digest_words(signature)
        self.check(self.native.reduce_scatter(out.data_ptr(), inp.data_ptr(), out.numel(), DTYPES[out.dtype],
                                               OPS.index(op), _deadline_ns(deadline), d0, d1), deadline)
        return out

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, deadline: float,
                   signature: bytes | None = None) -> torch.Tensor:
        """``out`` (contiguous, N chunks) gets every rank's ``inp`` in rank order."""
        d0, d1 = digest_words(signature)
        self.check(self.native.all_gather(out.data_ptr(), inp.data_ptr(), inp.numel(), DTYPES[inp.dtype],
                                           _deadline_ns(deadline), d0, d1), deadline)
        return out

    def broadcast(self, flat: torch.Tensor, root: int, deadline: float,
                  signature: bytes | None = None) -> torch.Tensor:
        """Every rank's ``flat`` (contiguous) gets local rank ``root``'s."""
        d0, d1 = digest_words(signature)
        self.check(self.native.broadcast(flat.data_ptr(), flat.numel(), DTYPES[flat.dtype], root,
                                          _deadline_ns(deadline), d0, d1), deadline)
        return flat

    def barrier(self, deadline: float) -> None:
        """Wait until every rank of the host has reached this barrier, or raise ``PeerError``."""
        self.check(self.native.barrier(_deadline_ns(deadline)), deadline)

    def release(self) -> None:
        """Drop every view of the mapping (before the group unmaps it): later calls raise."""
        self.native.close()
        self._digests = None

    # --- failures --------------------------------------------------------------------------

    def check(self, status, deadline: float) -> None:
        """Raise what C's ``status`` (None: done) means: the group's PeerError, or a MismatchError."""
        if status is None:
            return
        code, peer = status
        group = self.group
        if code == _native.MISMATCH:
            rows = self._digests[self.native.parity].tolist()
            mine = rows[self.rank][:2]
            differ = [r for r, row in enumerate(rows) if row[:2] != mine]
            said = "; ".join(f"rank {group.ranks[r]}: {_what(rows[r][2])}" for r in [self.rank] + differ)
            raise MismatchError(f"rank {group.ranks[self.rank]}: rank(s) {[group.ranks[r] for r in differ]} run a "
                                f"different collective on the shared buffers ({said}), nothing was summed")
        if group.failure is not None:        # recorded here before, or cancelled (an abort)
            raise group.failure
        waiting = _Waiting(peer if peer >= 0 else next(iter(group.peers), 0))
        group.raise_failure(waiting, deadline)
        if code == _native.TIMEOUT:        # the deadline passed waiting for ``peer``: it is the silent one
            group.raise_failure(waiting, time.monotonic() - 2.0)
        raise PeerError(f"rank {group.ranks[self.rank]}: the shared-memory group failed while this rank waited",
                        peer=None, op="recv")
