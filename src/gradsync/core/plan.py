"""A plan: one rank's part of a schedule, compiled so that rounds overlap.

A schedule says what moves in each round, as if every round waited for the one before. A
plan says, for one rank, in which order to post its sends and receives so that they need
not: every transfer is cut into **pieces**, and a piece of a send leaves as soon as the
received pieces it reads have arrived and been applied, while later pieces of the previous
round are still on the wire (a pipelined ring: piece k of round t leaves once piece k of
round t - 1 is in). What a piece waits for is derived from the schedule's data flow
(overlapping segments of the same node), never from the algorithm's name.

The plan is a list of **steps**, one per (round, piece position) in which this rank sends.
Before a step's sends, the first ``applies`` receives (in plan order: by round, then piece)
have been waited for and applied. Receives are posted a round ahead, into **scratch**
(REDUCE, or COPY when landing in place would be unsafe) or straight into the buffer (COPY,
when nothing reads or writes that segment between posting and arrival). A receive is applied
only after the sends that read its segment are complete (its ``after_sends``).

``compile_plan`` checks what it builds (``check``): no send piece leaves before every
earlier-round piece it reads was applied, every receive is posted before it is awaited, and
no two receives share scratch while both are live.

>>> from gradsync.algorithms import ring
>>> p = compile_plan(ring.schedule(4, 4_000_000), rank=1, itemsize=4, piece=250_000)
>>> len(p.steps), len(p.sends), p.scratch <= 2 * 4_000_000 // 4
(24, 24, True)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np

from .schedule import CODED, COPY, REDUCE, Schedule

HOST_RANK = 0           # the process that runs helper nodes (the host CPU beside worker 0)
PIECE_BYTES = 4 << 20         # pieces of at least this (GRADSYNC_PIECE_BYTES, read at each compile, instead) ...
CODED_PIECE_BYTES = 1 << 20   # ... or this for coded packets, whose encoding each piece overlaps
PIECES = 8              # ... and at most this many: each message costs the engine a rendezvous
MAX_PIECES = 64         # tags are transfer index * MAX_PIECES + piece


@dataclass(frozen=True)
class Piece:
    """One message of this rank: a piece of a transfer, sent or received."""

    round: int
    peer: int          # the other rank
    tag: int           # unique in the schedule, known to both ends
    node: int          # this rank's node that sends or receives (a worker or a helper)
    offset: int        # segment of that node's buffer (CODED: of the packet)
    count: int
    op: int            # REDUCE, COPY or CODED
    position: int      # which piece of its transfer (0 .. pieces - 1)
    scratch: int = -1  # receives: where the piece lands in scratch; -1: in the buffer itself


@dataclass(frozen=True)
class Local:
    """A transfer between two nodes of this rank (worker 0 and the host), done in memory."""

    src: int
    dst: int
    offset: int
    count: int
    op: int


@dataclass(frozen=True)
class Step:
    round: int
    applies: int                    # receives[:applies] are applied before the sends
    waits: tuple[int, ...]          # sends complete before posting this step's in-place receives
    sends: tuple[int, ...]          # indices into Plan.sends
    posts: tuple[int, ...]          # indices into Plan.receives, posted with the sends, first
    local: tuple[Local, ...] = ()   # done after every send of the round is complete


@dataclass(frozen=True)
class Plan:
    """What one rank posts, in order; see the module docstring."""

    rank: int
    sends: tuple[Piece, ...]
    receives: tuple[Piece, ...]
    after_sends: tuple[tuple[int, ...], ...]   # per receive: sends to complete before applying it
    first_posts: tuple[int, ...]               # receives posted before the first step
    steps: tuple[Step, ...]
    drain_waits: tuple[int, ...]               # sends complete before the last in-place posts
    drain_posts: tuple[int, ...]               # receives posted only at the end
    scratch: int                               # elements of receive space
    tag_bits: int                              # every tag is below 2 ** tag_bits


def rank_of(schedule: Schedule, node: np.ndarray) -> np.ndarray:
    """The rank that runs each node: workers run themselves, helpers run on HOST_RANK."""
    return np.where(node < schedule.workers, node, HOST_RANK)


def piece_bounds(count: int, piece: int) -> list[tuple[int, int]]:
    """Cut ``count`` elements into at most PIECES near-equal pieces of at least ``piece``.

    >>> piece_bounds(10, 3)
    [(0, 3), (3, 6), (6, 10)]
    """
    parts = min(PIECES, max(1, count // max(1, piece)))
    bounds = [count * k // parts for k in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def piece_elements(itemsize: int) -> int:
    """The least piece of exact transfers, in elements of ``itemsize`` bytes (PIECE_BYTES of them,
    or GRADSYNC_PIECE_BYTES when set)."""
    return max(1, int(os.environ.get("GRADSYNC_PIECE_BYTES", PIECE_BYTES)) // itemsize)


def _overlaps(a: Piece, b: Piece) -> bool:
    return a.node == b.node and a.offset < b.offset + b.count and b.offset < a.offset + a.count


def _cut(schedule: Schedule, index: np.ndarray, peer_of: np.ndarray, node_of: np.ndarray,
         piece: int, coded_piece: int) -> list[Piece]:
    t = schedule.transfers
    out = []
    for i in index.tolist():
        least = coded_piece if t["op"][i] == CODED else piece
        for k, (a, b) in enumerate(piece_bounds(int(t["count"][i]), least)):
            out.append(Piece(int(t["round"][i]), int(peer_of[i]), i * MAX_PIECES + k, int(node_of[i]),
                             int(t["offset"][i]) + a, b - a, int(t["op"][i]), k))
    return out


def compile_plan(schedule: Schedule, rank: int, itemsize: int, ops: tuple = (REDUCE, COPY, CODED),
                 piece: int | None = None) -> Plan:
    """Compile ``rank``'s part of the ``ops`` transfers of ``schedule`` (elements of ``itemsize``
    bytes) into a checked plan. ``piece``: the least piece in elements (default PIECE_BYTES, or
    CODED_PIECE_BYTES for coded transfers).

    >>> from gradsync.algorithms import central
    >>> p = compile_plan(central.schedule(3, 10), rank=1, itemsize=4)
    >>> [(s.round, s.peer) for s in p.sends], [(r.round, r.scratch) for r in p.receives]
    ([(0, 0)], [(1, -1)])
    """
    coded_piece = max(1, CODED_PIECE_BYTES // itemsize) if piece is None else piece
    piece = piece_elements(itemsize) if piece is None else piece
    sends, receives, local_rounds = _pieces(schedule, rank, ops, piece, coded_piece)
    keys, step_sends, applies = _steps(sends, receives, local_rounds)
    after_sends = tuple(tuple(k for k, s in enumerate(sends) if s.round <= r.round and _overlaps(r, s))
                        for r in receives)
    posted_at, waits = _post_points(receives, sends, keys, step_sends, applies, local_rounds, after_sends)
    applied_at = [next((n for n, a in enumerate(applies) if a > j), len(keys)) for j in range(len(receives))]
    receives = _allocate_scratch(receives, posted_at, applied_at)
    last_of_round = {rnd: n for n, (rnd, _) in enumerate(keys)}
    steps = tuple(Step(rnd, int(applies[n]), tuple(sorted(waits.get(n, ()))), tuple(step_sends[n]),
                       tuple(j for j, p in enumerate(posted_at) if p == n),
                       tuple(local_rounds.get(rnd, ())) if last_of_round[rnd] == n else ())
                  for n, (rnd, _) in enumerate(keys))
    plan = Plan(rank, tuple(sends), tuple(receives), after_sends,
                tuple(j for j, p in enumerate(posted_at) if p == -1), steps,
                tuple(sorted(waits.get(len(keys), ()))),
                tuple(j for j, p in enumerate(posted_at) if p == len(keys)),
                max((r.scratch + r.count for r in receives if r.scratch >= 0), default=0),
                int(len(schedule.transfers) * MAX_PIECES).bit_length())
    check(plan, applied_at)
    return plan


def _pieces(schedule: Schedule, rank: int, ops: tuple, piece: int,
            coded_piece: int) -> tuple[list[Piece], list[Piece], dict[int, list[Local]]]:
    """This rank's ``ops`` transfers, in schedule order by round: the sends and the receives cut
    into pieces (receives in plan order), and the in-memory transfers by round."""
    t = schedule.transfers
    src, dst = rank_of(schedule, t["src"]), rank_of(schedule, t["dst"])
    chosen = np.isin(t["op"], ops)
    order = np.lexsort((np.arange(len(t)), t["round"]))
    mine = order[chosen[order]]
    sends = _cut(schedule, mine[(src[mine] == rank) & (dst[mine] != rank)], dst, t["src"], piece, coded_piece)
    receives = _cut(schedule, mine[(dst[mine] == rank) & (src[mine] != rank)], src, t["dst"], piece, coded_piece)
    receives.sort(key=lambda r: (r.round, r.position))          # plan order: by round, then piece
    locals_ = mine[(src[mine] == rank) & (dst[mine] == rank)]
    local_rounds: dict[int, list[Local]] = {}
    for i in locals_.tolist():
        local_rounds.setdefault(int(t["round"][i]), []).append(
            Local(int(t["src"][i]), int(t["dst"][i]), int(t["offset"][i]), int(t["count"][i]), int(t["op"][i])))
    return sends, receives, local_rounds


def _steps(sends: list[Piece], receives: list[Piece], local_rounds: dict[int, list[Local]]):
    """The steps' keys (round, piece position), each step's sends, and how many receives (in plan
    order) each step has applied before its sends."""
    # Steps: one per (round, piece position) with sends, plus one per round with only local work.
    keys = sorted({(s.round, s.position) for s in sends} | {(r, 0) for r in local_rounds})
    step_of = {key: n for n, key in enumerate(keys)}
    step_sends: list[list[int]] = [[] for _ in keys]
    for n, s in enumerate(sends):
        step_sends[step_of[(s.round, s.position)]].append(n)

    # What each step must have applied: earlier-round receives overlapping what it sends.
    needed = [0] * len(keys)
    for n, (rnd, _) in enumerate(keys):
        reads = [sends[k] for k in step_sends[n]]
        if rnd in local_rounds:       # in-memory work: everything before this round, in place
            needed[n] = sum(r.round < rnd for r in receives)
        for j, r in enumerate(receives):
            if r.round < rnd and r.op != CODED and any(_overlaps(r, s) for s in reads):
                needed[n] = max(needed[n], j + 1)
            elif r.round == rnd - 1 and r.op == CODED and r.position <= keys[n][1]:
                needed[n] = max(needed[n], j + 1)     # a packet is computed from the last one received
    applies = list(np.maximum.accumulate(needed)) if keys else []
    return keys, step_sends, applies


def _post_points(receives, sends, keys, step_sends, applies, local_rounds, after_sends):
    """Where each receive is posted: -1 before the first step, n with step n's sends, or
    len(keys) at the end; and the sends each step (or the end) waits for before posting.

    A receive is posted a round ahead: with the step of the previous round at its piece
    position. A COPY receive lands in place if, from its posting to its arrival, nothing of
    this rank reads or writes that segment: sends reading it must be of a round before the
    posting step's (they are then waited for before posting, and are long done), and receives
    writing it must be applied before. Otherwise it is posted in place at the first later step
    where that holds (at N = 2 the all-gather's receive, whose segment this rank sent the round
    before, at the next round's step, once that send is done), before the step that needs it;
    or at the end if nothing needs it (a broadcast's leaf); else it lands in scratch.
    """
    posted_at, waits, ideals = [], {}, []
    for j, r in enumerate(receives):
        ideal = -1
        for n, (rnd, pos) in enumerate(keys):        # latest step of round r - 1 at or before this piece
            if rnd < r.round - 1 or (rnd == r.round - 1 and pos <= r.position):
                ideal = n
        point = ideal
        if r.op == COPY and not local_rounds:
            needed = next((n for n, a in enumerate(applies) if a > j), len(keys))
            # the earliest step from the ideal one on, before it is needed: a receive posted
            # late is announced behind this rank's own sends (see the executor's post)
            later = list(range(ideal + 1, needed)) + ([len(keys)] if needed == len(keys) else [])
            for candidate in [ideal] + later:
                conflict = _landing_conflict(j, r, receives, sends, keys, step_sends, applies, candidate,
                                             after_sends)
                if conflict is not None:
                    point = candidate
                    if conflict:
                        waits.setdefault(candidate, set()).update(conflict)
                    receives[j] = r           # stays in place (scratch -1)
                    break
            else:
                receives[j] = _in_scratch(r)
        elif r.op != CODED:
            receives[j] = _in_scratch(r)
        posted_at.append(point)
        ideals.append(ideal)
    # Engines that match messages by their order between two ranks, not by tag (NCCL), need
    # the receives from a peer posted in the order the peer sends them: a receive deferred to
    # the end is brought back to its round, in scratch, if a later one from that peer is not.
    order_kept = False
    while not order_kept:
        order_kept, latest = True, {}
        for j, r in enumerate(receives):
            point, k = latest.get(r.peer, (-1, None))
            if posted_at[j] < point:
                receives[k], posted_at[k] = _in_scratch(receives[k]), ideals[k]
                order_kept = False
                break
            latest[r.peer] = (posted_at[j], j)
    return posted_at, waits


def _in_scratch(r: Piece) -> Piece:
    return replace(r, scratch=0)      # its offset is allocated later


def _landing_conflict(j, r, receives, sends, keys, step_sends, applies, at, after_sends):
    """If receive ``j`` can land in place when posted at ``at``: the sends to wait for first
    (possibly none); None if it cannot."""
    before = {k for n in range(min(at + 1, len(keys))) for k in step_sends[n]}
    done_applies = applies[at] if 0 <= at < len(applies) else (len(receives) if at >= len(keys) else 0)
    now = keys[at][0] if 0 <= at < len(keys) else r.round     # the round posting it
    wait = set()
    for k in after_sends[j]:
        s = sends[k]
        if k not in before or s.round >= min(r.round, now):
            return None                 # read while the data lands, or just posted: no waiting on it
        wait.add(k)
    for i, other in enumerate(receives[:j]):
        if other.round < r.round and _overlaps(other, r) and i >= done_applies:
            return None                 # an earlier write to this segment is not applied yet
    return wait


def _allocate_scratch(receives, posted_at, applied_at) -> list[Piece]:
    """First-fit scratch offsets: a receive holds its space from posting to being applied."""
    live: list[tuple[int, int, int]] = []      # (start, end, freed after step)
    for j in sorted(range(len(receives)), key=lambda j: (posted_at[j], j)):
        r = receives[j]
        if r.scratch < 0:
            continue
        live = [x for x in live if x[2] > posted_at[j]]      # freed once applied before this post
        start = 0
        for a, b, _ in sorted(live):
            if start + r.count <= a:
                break
            start = max(start, b)
        live.append((start, start + r.count, applied_at[j]))
        receives[j] = replace(r, scratch=start)
    return receives


def check(plan: Plan, applied_at: list[int]) -> None:
    """Assert the plan's invariants (broken logic, not bad input)."""
    posted = {j: -1 for j in plan.first_posts}
    for n, step in enumerate(plan.steps):
        for k in step.sends:
            s = plan.sends[k]
            for j, r in enumerate(plan.receives):
                if r.round < s.round and r.op != CODED and _overlaps(r, s):
                    assert j < step.applies, f"send {s} leaves before receive {r} is applied"
        posted.update({j: n for j in step.posts})
    posted.update({j: len(plan.steps) for j in plan.drain_posts})
    assert sorted(posted) == list(range(len(plan.receives))), "a receive is never posted"
    end = len(plan.steps)
    latest: dict[int, int] = {}
    for j, r in enumerate(plan.receives):
        assert posted[j] >= latest.get(r.peer, -1), f"receive {r} is posted before an earlier one from its peer"
        latest[r.peer] = posted[j]
    for j, r in enumerate(plan.receives):
        assert posted[j] < applied_at[j] or posted[j] == applied_at[j] == end, \
            f"receive {r} is awaited before it is posted"
    spans = [(posted[j], applied_at[j], r.scratch, r.scratch + r.count) for j, r in enumerate(plan.receives)
             if r.scratch >= 0]
    for i, (p0, a0, s0, e0) in enumerate(spans):
        for p1, a1, s1, e1 in spans[i + 1:]:
            assert not (s0 < e1 and s1 < e0 and p0 < a1 and p1 < a0), "two live receives share scratch"
