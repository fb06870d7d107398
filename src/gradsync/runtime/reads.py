"""Running a schedule by direct reads of the peers' shared buffers, on one host.

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
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

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


def run(plan_of, buffers, flat: torch.Tensor, deadline: float, signature: bytes | None = None,
        flight=None) -> torch.Tensor:
    """All-reduce ``flat`` (this rank's data, contiguous) in place by reads; return it.

    ``plan_of(elements)`` gives the ``ReadProgram`` for a piece of that many elements (a
    message larger than a slot runs in pieces); ``signature``: the collective's digest, which
    every rank checks against every other's after the first barrier (``MismatchError``).

    Example, in each rank of a group on one host:
    ``run(lambda n: program("one_shot", 4, n, "{}", rank), buffers, grad, deadline)``.
    """
    per_piece = max(1, buffers.capacity // flat.element_size())
    total = flat.numel()
    for first in range(0, max(total, 1), per_piece):
        piece = flat if total <= per_piece else flat[first:first + per_piece]
        m = piece.numel()
        run_piece(plan_of(m), buffers, piece.dtype, lambda region: region(0, m).copy_(piece),
                  lambda a, b: piece if a == 0 and b == m else piece[a:b], deadline,
                  signature if first == 0 else None, flight)
    return flat


def run_piece(prog: ReadProgram, buffers, dtype: torch.dtype, fill, target, deadline: float,
              signature: bytes | None = None, flight=None) -> None:
    """One pass of ``prog`` through the next slots of ``buffers``: ``fill(region)`` puts this
    rank's data into its slot (``region(start, stop)``: those elements of it, as ``dtype``),
    ``target(start, stop)`` is where the result of a read of elements [start, stop) goes;
    ``signature``: checked after the first barrier. A program of no rounds (nothing to move)
    takes no slots: every pass that takes slots must meet the others at a barrier, which is
    what lets the parities alternate."""
    if not prog.rounds:
        return
    buffers.begin(dtype)
    rank, view = buffers.rank, buffers.view
    if signature is not None:
        buffers.publish_digest(signature)
    fill(lambda start, stop: view(rank, start, stop))
    for index, reads in enumerate(prog.rounds):
        if flight is not None:
            flight.round = index
        buffers.barrier(deadline)
        if signature is not None and index == 0:
            buffers.check_digests()
        for read in reads:
            a, b = read.start, read.stop
            out = target(a, b)
            if read.op == REDUCE:
                rows = view(None, a, b) if read.everyone else buffers.rows(read.sources + (rank,), a, b)
                torch.sum(rows, dim=0, dtype=dtype, out=out)
            else:
                out.copy_(view(read.sources[0], a, b))
            if read.publish:
                view(rank, a, b).copy_(out)


class ReadCollective:
    """One all-reduce run by reads on the group's shared buffers; started like ``Collective``.

    Args:
        schedule: the algorithm's schedule of the whole message (for the flight recorder).
        plan_of: ``plan_of(elements) -> ReadProgram`` for a piece of that many elements.
        buffers: the group's ``SharedBuffers``; transport, deadline: as for ``Collective``.
        flat: this rank's data, flat and contiguous (worked on in place).
        finish: the ``Finish`` applied to the result; signature: the digest the ranks compare.

    Example: ``ReadCollective(schedule, plan_of, buffers, transport, deadline, flat, finish, sig).start().wait()``.
    """

    def __init__(self, schedule: Schedule, plan_of, buffers, transport, deadline: float, flat: torch.Tensor,
                 finish, signature: bytes | None, trace=None):
        self.schedule, self.plan_of, self.shared, self.transport = schedule, plan_of, buffers, transport
        self.deadline, self.finish, self.signature, self.trace = deadline, finish, signature, trace
        self.buffers = {transport.rank: flat}
        self.flight = None
        self.recipe = None       # a Recipe for the same call again, where build made one

    def start(self, inline: bool = False) -> torch.futures.Future:
        from .progress import start

        return start(self, self.transport, inline)

    def complete(self, future: torch.futures.Future) -> None:
        try:
            result = self.run()
        except BaseException as exc:       # the future carries it to whoever waits
            future.set_exception(exc)
            return
        future.set_result(result)

    def run(self) -> torch.Tensor:
        """Run it to the end in this thread; return the result, or raise the collective's error."""
        from .flight import RECORDER

        try:
            self.flight = RECORDER.begin(self)
            flat = self.buffers[self.transport.rank]
            rec = None if self.trace is None else self.trace.begin(self.transport.rank, self.describe())
            if flat.requires_grad:        # a parameter, all-reduced in place as with dist
                with torch.no_grad():
                    run(self.plan_of, self.shared, flat, self.deadline, self.signature, self.flight)
            else:                         # a gradient: no grad mode to switch (it costs as much as a small sum)
                run(self.plan_of, self.shared, flat, self.deadline, self.signature, self.flight)
            if rec is not None:
                rec.end(self.transport, self.deadline)
            result = self.finish.apply(flat, self.transport.rank)
        except BaseException as exc:
            if self.flight is not None:
                RECORDER.end(self.flight, exc)
            self.transport.close()
            raise
        RECORDER.end(self.flight)
        self.transport.close()
        return result

    def describe(self) -> dict:
        """What this collective is, for traces and the flight recorder."""
        flat = self.buffers[self.transport.rank]
        return {"algorithm": self.schedule.algorithm, "bytes": flat.numel() * flat.element_size(),
                "dtype": str(flat.dtype).removeprefix("torch."), "workers": self.schedule.workers,
                "rounds": self.schedule.rounds, "by": "reads"}


@dataclass(frozen=True, eq=False)
class Recipe:
    """What the checks of a call on shared buffers decided (the algorithm, its read program,
    the digest, the group's buffers), kept so that the same call again (same group object,
    tensor shape and dtype, algorithm, options: ``api``'s key) starts at once: a training loop
    all-reducing the same bucket pays the checks once, not at every step (they cost about
    100 us here, against 16 us for a 4 KB all-reduce by reads between two ranks).

    Example: ``recipe.run(grad)`` all-reduces ``grad`` as the first call did.
    """

    schedule: Schedule
    plan_of: object
    buffers: object
    transport: object
    op: str
    timeout: float
    signature: bytes | None
    engine: object           # the group's progress engine (``progress.progress_for``)

    def usable(self) -> bool:
        """Whether the group it was made for is still open and has not failed."""
        group = self.buffers.group
        return not group.closed and group.failure is None

    def start(self, tensor: torch.Tensor) -> torch.futures.Future:
        """Start the call on ``tensor`` on the group's progress engine; its future."""
        return self._collective(tensor).start(inline=False)

    def run(self, tensor: torch.Tensor) -> torch.Tensor:
        """Make the call on ``tensor`` and wait for it: in this thread when the group's engine
        has nothing queued (as ``progress.start`` does, without a future to hand over)."""
        collective, engine = self._collective(tensor), self.engine
        if engine.on_thread() or not engine.busy():
            with engine.running:
                return collective.run()
        return collective.start(inline=True).wait()

    def _collective(self, tensor: torch.Tensor) -> ReadCollective:
        from .collective import Finish

        return ReadCollective(self.schedule, self.plan_of, self.buffers, self.transport,
                              time.monotonic() + self.timeout, tensor.view(-1),
                              Finish(tensor, self.op, self.schedule.workers), self.signature)
