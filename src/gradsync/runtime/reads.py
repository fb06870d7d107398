"""A schedule as direct reads of the peers' shared buffers, on one host.

On one host every rank can read every other rank's memory, so a transfer src -> dst need not
be a message: dst reads the segment from src's slot of the shared buffers
(``transport.shm.buffers``). A schedule runs that way when no round reads a segment that its
owner writes in the same round (``compile_reads`` refuses one that does): each rank copies its
data into its slot, then for each round meets the others at a barrier and makes its reads,
one vectorized ``torch.sum`` per segment it reduces (its own value and every source at once)
or one copy per segment it takes. A result goes back into the rank's slot only when a later
round reads it (from this rank, or this rank itself reduces into it again). ``one_shot`` is
one round: a barrier and one sum of all N slots; ``sharded`` read this way is the two-shot
all-reduce (each rank sums its 1/N from all slots, then copies every other 1/N). A message
larger than a slot runs in pieces, each its own pass (own parity) over the same program.

``compile_reads`` turns one rank's part of a schedule into its reads, round by round;
``packed`` gives them as the int64 words the C executor runs (``transport.shm.native``), so the
shared-buffer all-reduce is the algorithm's own schedule, read, not a second copy of it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .. import algorithms
from ..core.schedule import COPY, REDUCE, Schedule
from ..errors import ScheduleError


@dataclass(frozen=True)
class Read:
    """One read this rank makes in a round: elements [start, stop) from ``sources``.

    REDUCE: this rank's value of the segment plus every source's (``everyone``: the sources
    and this rank are the whole group, so one sum over the slots' rows). COPY: the one source's
    value. ``publish``: the result also goes into this rank's slot (a later round reads it)."""

    op: int
    start: int
    stop: int
    sources: tuple[int, ...]
    everyone: bool
    publish: bool


@dataclass(frozen=True)
class ReadProgram:
    """This rank's reads of a schedule, round by round (a barrier before each round)."""

    algorithm: str
    workers: int
    elements: int
    rank: int
    rounds: tuple[tuple[Read, ...], ...]


def compile_reads(schedule: Schedule, rank: int) -> ReadProgram:
    """This rank's part of ``schedule`` as reads; ``ScheduleError`` if some round reads a
    segment from a worker that publishes a new value of it in that same round (the read could
    see half of each).

    >>> from gradsync.algorithms import sharded
    >>> p = compile_reads(sharded.schedule(4, 8), rank=1)
    >>> [(r.op, r.start, r.stop, r.sources, r.publish) for r in p.rounds[0]]
    [(0, 2, 4, (0, 2, 3), True)]
    """
    t = schedule.transfers
    if schedule.helpers or schedule.codec is not None:
        raise ScheduleError(f"{schedule.algorithm} cannot run by reads: only workers' plain transfers can")
    rounds = []
    for r in range(schedule.rounds):
        now, later = t[t["round"] == r], t[t["round"] > r]
        published = {}          # (dst, offset, count) -> whether the result goes back into dst's slot
        for x in now:
            key = (int(x["dst"]), int(x["offset"]), int(x["count"]))
            if key not in published:
                published[key] = _needed_later(later, *key)
        _check_hazards(schedule.algorithm, r, now, published)
        reads = []
        mine = now[now["dst"] == rank]
        for start, count, op in sorted({(int(x["offset"]), int(x["count"]), int(x["op"])) for x in mine}):
            rows = mine[(mine["offset"] == start) & (mine["count"] == count) & (mine["op"] == op)]
            sources = tuple(sorted(int(s) for s in rows["src"]))
            if op == COPY and len(sources) != 1:
                raise ScheduleError(f"{schedule.algorithm}: round {r} copies [{start}, {start + count}) into "
                                    f"worker {rank} from {len(sources)} workers")
            everyone = op == REDUCE and len(sources) == schedule.workers - 1
            reads.append(Read(op, start, start + count, sources, everyone, published[(rank, start, count)]))
        rounds.append(tuple(reads))
    return ReadProgram(schedule.algorithm, schedule.workers, schedule.elements, rank, tuple(rounds))


def _needed_later(later, node: int, start: int, count: int) -> bool:
    """Whether a later round reads [start, start + count) from ``node``, or ``node`` reduces into it again."""
    near = later[(later["offset"] < start + count) & (later["offset"] + later["count"] > start)]
    return bool(((near["src"] == node) | ((near["dst"] == node) & (near["op"] == REDUCE))).any())


def _check_hazards(name: str, r: int, now, published: dict) -> None:
    """No transfer of round ``r`` reads a segment that its source publishes in round ``r``."""
    for (node, start, count), publish in published.items():
        if not publish:
            continue
        readers = now[(now["src"] == node) & (now["offset"] < start + count) & (now["offset"] + now["count"] > start)]
        if len(readers):
            raise ScheduleError(f"{name} cannot run by reads: in round {r} worker {int(readers[0]['dst'])} reads "
                                f"[{start}, {start + count}) from worker {node}, which writes it in the same round")


@functools.lru_cache(maxsize=64)
def program(algorithm: str, workers: int, elements: int, frozen_options: str, rank: int) -> ReadProgram:
    """The read program of a registered algorithm (cached by value, like compiled plans).

    >>> program("one_shot", 2, 4, "{}", 0).rounds[0][0].everyone
    True
    """
    import json

    return compile_reads(algorithms.get(algorithm).schedule(workers, elements, **json.loads(frozen_options)), rank)


ONE_SHOT_MAX = 64 << 10     # one barrier and N reads of the whole message beat two barriers up to here


def choose(nbytes: int, workers: int) -> str:
    """``algorithm="auto"`` on one host's shared buffers: one-shot for small messages (one
    barrier), two-shot (``sharded`` by reads) for large ones (each rank reads 2/N as much).

    >>> choose(4096, 4), choose(16 << 20, 4)
    ('one_shot', 'sharded')
    """
    return "one_shot" if nbytes <= ONE_SHOT_MAX or workers <= 2 and nbytes <= 4 * ONE_SHOT_MAX else "sharded"




@functools.lru_cache(maxsize=64)
def packed(algorithm: str, workers: int, elements: int, rank: int) -> bytes:
    """The read program of a registered algorithm as the C executor takes it: int64 words,
    the rounds, then per round its reads, then per read: op (0 reduce, 1 copy), start, stop,
    publish, complete (the sources and this rank are everyone), the number of sources, then
    the sources in rank order (a reduce's include this rank, whose value it adds in its turn).

    >>> import numpy as np
    >>> np.frombuffer(packed("one_shot", 2, 4, 0), np.int64).tolist()
    [1, 1, 0, 0, 4, 0, 1, 2, 0, 1]
    """
    import numpy as np

    prog = program(algorithm, workers, elements, "{}", rank)
    words = [len(prog.rounds)]
    for reads in prog.rounds:
        words.append(len(reads))
        for read in reads:
            sources = tuple(sorted(read.sources + (rank,))) if read.op == REDUCE else read.sources
            words += [0 if read.op == REDUCE else 1, read.start, read.stop, int(read.publish), int(read.everyone),
                      len(sources), *sources]
    return np.asarray(words, dtype=np.int64).tobytes()
