"""Execute a schedule in one rank of a process group: the real all-reduce.

Per round, a rank posts all its receives, then all its sends (posting a send before the
receive from the same peer serializes the two directions over Gloo), waits for all of them
within the collective's deadline, then adds received segments in place (REDUCE) or lets
COPY receives land directly in the buffer when nothing in the round reads what they
overwrite. Helper nodes (the host) run inside rank 0's process. Coded transfers (CERAR) take
their packets from the codec's per-worker object. No per-element Python anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    return tuple(plans)


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
    scratch = _scratch(schedule, rank, flat.dtype, flat.device, max((p.scratch for p in rounds), default=0))
    piece = max(1, PIECE_BYTES // flat.element_size())
    for p in rounds:
        arriving, sending, used = [], [], 0          # (pending, op, target, data) per piece
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


def _pieces(count: int, piece: int) -> list[tuple[int, int]]:
    """Cut ``count`` elements in at most PIECES near-equal pieces of at least about ``piece``."""
    parts = min(PIECES, max(1, count // piece))
    bounds = [count * k // parts for k in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


@lru_cache(maxsize=64)
def _scratch(schedule: Schedule, rank: int, dtype, device, elements: int) -> torch.Tensor:
    """Receive space kept across calls: a training loop allocates it once."""
    return torch.empty(elements, dtype=dtype, device=device)


@lru_cache(maxsize=64)
def _design(schedule: Schedule):
    from ..coding import cerar
    return cerar.Design.from_dict(schedule.codec)


def _execute_coded(schedule: Schedule, flat: torch.Tensor, transport, deadline: float) -> torch.Tensor:
    from ..coding import cerar

    if flat.numel() == 0:
        return flat
    worker = cerar.Worker(_design(schedule), transport.rank, flat)
    for p in plan(schedule, transport.rank):
        pending = [transport.recv(worker.receive(p.round), o.peer, o.tag * MAX_PIECES) for o in p.recvs]
        packets = [worker.packet(p.round) for _ in p.sends]
        pending += [transport.send(pk, o.peer, o.tag * MAX_PIECES) for pk, o in zip(packets, p.sends)]
        transport.wait(pending, deadline)
        worker.received(p.round)
    assert all(o.op == CODED for p in plan(schedule, transport.rank) for o in p.recvs + p.sends)
    return worker.result()
