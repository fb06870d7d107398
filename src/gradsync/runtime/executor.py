"""Execute a schedule in one rank of a process group: the real all-reduce.

Per round, a rank posts all its receives, then all its sends (posting a send before the
receive from the same peer serializes the two directions over Gloo), waits for all of them
within the collective's deadline, then adds received segments in place (REDUCE) or lets
COPY receives land directly in the buffer when nothing in the round reads what they
overwrite. The next round's receives are posted before this round's sends wherever that is
safe: Gloo's sender holds its data until the receiver's ready notice arrives, and a notice
sent at the start of its own round costs a round trip each round (on a shaped link, behind
the receiver's outgoing data). Helper nodes (the host) run inside rank 0's process. Coded
transfers (CERAR) take their packets from the codec's per-worker object and run in pieces
that overlap consecutive rounds. No per-element Python anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
import torch

from ..emulate import _reads_race_writes
from ..schedule import CODED, COPY, REDUCE, Schedule

HOST_RANK = 0   # the process that runs helper nodes (the host CPU beside worker 0)
PIECE_BYTES = 1 << 20   # REDUCE transfers are cut in pieces of at least this, so that adds
PIECES = 8              # overlap the transfer; at most PIECES of them, as each message costs
MAX_PIECES = 64         # Gloo a rendezvous. Tags are transfer index * MAX_PIECES + piece.


@dataclass(frozen=True)
class Op:
    peer: int          # the other rank
    tag: int           # the transfer's index in the schedule: unique, known to both ends
    node: int          # this rank's node that sends or receives (a worker, or a helper)
    offset: int
    count: int
    op: int


@dataclass(frozen=True)
class RoundPlan:
    round: int
    recvs: tuple[Op, ...]
    sends: tuple[Op, ...]
    local: tuple[tuple[int, int, int, int, int], ...]   # (src node, dst node, offset, count, op)
    direct_copy: bool                                    # COPY receives may land in place
    scratch: int                                         # elements of temporary receive space
    early: bool = False       # receives may be posted during this rank's previous round


def rank_of(schedule: Schedule, node: np.ndarray) -> np.ndarray:
    return np.where(node < schedule.workers, node, HOST_RANK)


@lru_cache(maxsize=256)
def plan(schedule: Schedule, rank: int, ops: tuple = (REDUCE, COPY, CODED)) -> tuple[RoundPlan, ...]:
    """What ``rank`` does in each round of ``schedule``, for transfers of the given ``ops``
    (cached: a training loop plans once)."""
    t = schedule.transfers
    src_rank, dst_rank = rank_of(schedule, t["src"]), rank_of(schedule, t["dst"])
    chosen = np.isin(t["op"], ops)
    plans = []
    for r in range(schedule.rounds):
        lo, hi = schedule.round_starts[r], schedule.round_starts[r + 1]
        idx = np.arange(lo, hi)[chosen[lo:hi]]
        src_rank_r, dst_rank_r = src_rank[idx], dst_rank[idx]
        mine_in = idx[(dst_rank_r == rank) & (src_rank_r != rank)]
        mine_out = idx[(src_rank_r == rank) & (dst_rank_r != rank)]
        local = idx[(src_rank_r == rank) & (dst_rank_r == rank)]
        if not (len(mine_in) or len(mine_out) or len(local)):
            continue
        recvs = tuple(Op(int(src_rank[i]), int(i), int(t["dst"][i]), int(t["offset"][i]), int(t["count"][i]),
                         int(t["op"][i])) for i in mine_in)
        sends = tuple(Op(int(dst_rank[i]), int(i), int(t["src"][i]), int(t["offset"][i]), int(t["count"][i]),
                         int(t["op"][i])) for i in mine_out)
        direct = not _reads_race_writes(t[idx])
        scratch = sum(o.count for o in recvs if o.op == REDUCE or (o.op == COPY and not direct))
        plans.append(RoundPlan(r, recvs, sends, tuple((int(t["src"][i]), int(t["dst"][i]), int(t["offset"][i]),
                                                      int(t["count"][i]), int(t["op"][i])) for i in local),
                               direct, scratch))
    for k in range(1, len(plans)):
        plans[k] = replace(plans[k], early=_may_post_early(plans[k], plans[k - 1]))
    return tuple(plans)


def _may_post_early(this: RoundPlan, previous: RoundPlan) -> bool:
    """Whether ``this`` round's receives can be posted while ``previous`` runs: receives into
    scratch always can (rounds alternate between two scratch spaces); receives in place only
    if nothing the previous round reads or writes on this rank overlaps them."""
    landing = [(o.node, o.offset, o.offset + o.count) for o in this.recvs if o.op == COPY and this.direct_copy]
    if not landing:
        return True
    touched = [(o.node, o.offset, o.offset + o.count) for o in previous.recvs + previous.sends]
    touched += [(node, off, off + cnt) for src, dst, off, cnt, _ in previous.local for node in (src, dst)]
    if not touched:
        return True
    a, b = np.array(landing), np.array(touched)
    overlap = ((a[:, None, 0] == b[None, :, 0]) & (a[:, None, 1] < b[None, :, 2]) & (b[None, :, 1] < a[:, None, 2]))
    return not overlap.any()


def node_buffers(schedule: Schedule, rank: int, flat: torch.Tensor) -> dict[int, torch.Tensor]:
    """The buffers of the nodes this rank runs: its worker's, plus the helpers' on HOST_RANK."""
    buffers = {rank: flat}
    if rank == HOST_RANK:
        for h in range(len(schedule.helpers)):
            buffers[schedule.workers + h] = torch.zeros_like(flat)
    return buffers


def execute(schedule: Schedule, flat: torch.Tensor, transport, deadline: float) -> torch.Tensor:
    """Run ``schedule`` for this rank on the contiguous 1-D ``flat``; return the result tensor.

    Exact schedules work in place on ``flat``; coded ones return the decoded estimate.
    """
    if schedule.codec is not None:
        return _execute_coded(schedule, flat, transport, deadline)
    run_rounds(schedule, node_buffers(schedule, transport.rank, flat), transport, deadline)
    return flat


def run_rounds(schedule: Schedule, buffers: dict, transport, deadline: float,
               ops: tuple = (REDUCE, COPY)) -> None:
    """Run this rank's part of the ``ops`` transfers of ``schedule`` on ``buffers`` (node -> tensor)."""
    rank = transport.rank
    flat = buffers[rank]
    rounds = plan(schedule, rank, ops)
    spaces = [_scratch(schedule, rank, flat.dtype, flat.device, max((p.scratch for p in rounds[k::2]), default=0), k)
              for k in (0, 1)]
    piece = piece_elements(flat)
    posted = _post_receives(rounds[0], buffers, spaces[0], piece, transport) if rounds else []
    for i, p in enumerate(rounds):
        arriving, posted = posted, None      # (pending, op, target, data) per piece
        following = rounds[i + 1] if i + 1 < len(rounds) else None
        if following is not None and following.early:
            posted = _post_receives(following, buffers, spaces[(i + 1) % 2], piece, transport)
        sending = []
        for o in p.sends:
            cuts = _pieces(o.count, piece) if o.op == REDUCE or not p.direct_copy else [(0, o.count)]
            for k, (a, b) in enumerate(cuts):
                seg = buffers[o.node][o.offset + a:o.offset + b]
                sending.append(transport.send(seg, o.peer, o.tag * MAX_PIECES + k))
        local = [(dst, off, cnt, op, buffers[src][off:off + cnt].clone()) for src, dst, off, cnt, op in p.local]
        for pending, op, target, data in arriving:    # add each piece while the next ones arrive
            transport.wait([pending], deadline)
            if target is not None:
                target.add_(data) if op == REDUCE else target.copy_(data)
        transport.wait(sending, deadline)
        for dst, off, cnt, op, data in local:
            target = buffers[dst][off:off + cnt]
            target.add_(data) if op == REDUCE else target.copy_(data)
        if following is not None and posted is None:
            posted = _post_receives(following, buffers, spaces[(i + 1) % 2], piece, transport)


def _post_receives(p: RoundPlan, buffers: dict, scratch: torch.Tensor, piece: int, transport) -> list:
    """Post round ``p``'s receives: in place, or into ``scratch`` in pieces to add on arrival."""
    arriving, used = [], 0
    for o in p.recvs:
        if o.op == COPY and p.direct_copy:
            target = buffers[o.node][o.offset:o.offset + o.count]
            arriving.append((transport.recv(target, o.peer, o.tag * MAX_PIECES), o.op, None, None))
            continue
        for k, (a, b) in enumerate(_pieces(o.count, piece)):
            data = scratch[used + a:used + b]
            target = buffers[o.node][o.offset + a:o.offset + b]
            arriving.append((transport.recv(data, o.peer, o.tag * MAX_PIECES + k), o.op, target, data))
        used += o.count
    return arriving


def piece_elements(flat: torch.Tensor) -> int:
    """The least piece a transfer of ``flat``'s elements is cut into (PIECE_BYTES of them)."""
    return max(1, PIECE_BYTES // flat.element_size())


def _pieces(count: int, piece: int) -> list[tuple[int, int]]:
    """Cut ``count`` elements in at most PIECES near-equal pieces of at least about ``piece``."""
    parts = min(PIECES, max(1, count // piece))
    bounds = [count * k // parts for k in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


@lru_cache(maxsize=64)
def _scratch(schedule: Schedule, rank: int, dtype, device, elements: int, slot: int = 0) -> torch.Tensor:
    """Receive space kept across calls (two slots: even and odd rounds); a training loop
    allocates it once."""
    return torch.empty(elements, dtype=dtype, device=device)


@lru_cache(maxsize=64)
def _design(schedule: Schedule):
    from ..coding import cerar
    return cerar.Design.from_dict(schedule.codec)


def _execute_coded(schedule: Schedule, flat: torch.Tensor, transport, deadline: float) -> torch.Tensor:
    """CERAR in pieces: piece k of round t's packet leaves as soon as piece k of round t - 1
    has arrived, so the rounds overlap instead of waiting for each other in lock step."""
    from ..coding import cerar

    if flat.numel() == 0:
        return flat
    worker = cerar.Worker(_design(schedule), transport.rank, flat)
    rounds = plan(schedule, transport.rank)
    assert all(o.op == CODED for p in rounds for o in p.recvs + p.sends)
    cuts = _pieces(worker.m, piece_elements(flat))

    def post(p, k):          # piece k of round p's receive (the codec's buffers for t, t + 1 differ)
        a, b = cuts[k]
        return [transport.recv(worker.receive(p.round)[a:b], o.peer, o.tag * MAX_PIECES + k) for o in p.recvs]

    pending = {0: [post(rounds[0], k) for k in range(len(cuts))]} if rounds else {}   # round -> pieces
    sending = []
    for i, p in enumerate(rounds):
        if i:
            worker.received(rounds[i - 1].round)
        following, now_sending = [], []
        for k, (a, b) in enumerate(cuts):
            if i:
                transport.wait(pending[i - 1][k], deadline)      # piece k of round i - 1 is here
            piece = worker.packet(p.round, a, b)                 # reads it: done with it
            if i + 1 < len(rounds):
                following.append(post(rounds[i + 1], k))         # which may reuse that buffer
            now_sending += [transport.send(piece, o.peer, o.tag * MAX_PIECES + k) for o in p.sends]
        transport.wait(sending, deadline)
        sending = now_sending
        pending.pop(i - 1, None)
        if following:
            pending[i + 1] = following
    last = pending.get(len(rounds) - 1, [])
    transport.wait([x for piece in last for x in piece] + sending, deadline)
    if rounds:
        worker.received(rounds[-1].round)
    return worker.result()
