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
def plan(schedule: Schedule, rank: int) -> tuple[RoundPlan, ...]:
    """What ``rank`` does in each round of ``schedule`` (cached: a training loop plans once)."""
    t = schedule.transfers
    src_rank, dst_rank = rank_of(schedule, t["src"]), rank_of(schedule, t["dst"])
    plans = []
    for r in range(schedule.rounds):
        lo, hi = schedule.round_starts[r], schedule.round_starts[r + 1]
        idx = np.arange(lo, hi)
        mine_in = idx[(dst_rank[lo:hi] == rank) & (src_rank[lo:hi] != rank)]
        mine_out = idx[(src_rank[lo:hi] == rank) & (dst_rank[lo:hi] != rank)]
        local = idx[(src_rank[lo:hi] == rank) & (dst_rank[lo:hi] == rank)]
        if not (len(mine_in) or len(mine_out) or len(local)):
            continue
        recvs = tuple(Op(int(src_rank[i]), int(i), int(t["dst"][i]), int(t["offset"][i]), int(t["count"][i]),
                         int(t["op"][i])) for i in mine_in)
        sends = tuple(Op(int(dst_rank[i]), int(i), int(t["src"][i]), int(t["offset"][i]), int(t["count"][i]),
                         int(t["op"][i])) for i in mine_out)
        direct = not _reads_race_writes(t[lo:hi])
        scratch = sum(o.count for o in recvs if o.op == REDUCE or (o.op == COPY and not direct))
        plans.append(RoundPlan(r, recvs, sends, tuple((int(t["src"][i]), int(t["dst"][i]), int(t["offset"][i]),
                                                      int(t["count"][i]), int(t["op"][i])) for i in local),
                               direct, scratch))
    return tuple(plans)


def execute(schedule: Schedule, flat: torch.Tensor, transport, deadline: float) -> torch.Tensor:
    """Run ``schedule`` for this rank on the contiguous 1-D ``flat``; return the result tensor.

    Exact schedules work in place on ``flat``; coded ones return the decoded estimate.
    """
    rank = transport.rank
    if schedule.codec is not None:
        return _execute_coded(schedule, flat, transport, deadline)
    buffers = {rank: flat}
    if rank == HOST_RANK:
        for h in range(len(schedule.helpers)):
            buffers[schedule.workers + h] = torch.zeros_like(flat)
    rounds = plan(schedule, rank)
    scratch = flat.new_empty(max((p.scratch for p in rounds), default=0))
    for p in rounds:
        pending, landed, used = [], [], 0
        for o in p.recvs:
            if o.op == COPY and p.direct_copy:
                target = buffers[o.node][o.offset:o.offset + o.count]
            else:
                target = scratch[used:used + o.count]
                used += o.count
                landed.append((o, target))
            pending.append(transport.recv(target, o.peer, o.tag))
        for o in p.sends:
            pending.append(transport.send(buffers[o.node][o.offset:o.offset + o.count], o.peer, o.tag))
        local = [(dst, off, cnt, op, buffers[src][off:off + cnt].clone()) for src, dst, off, cnt, op in p.local]
        transport.wait(pending, deadline)
        for o, data in landed:
            target = buffers[o.node][o.offset:o.offset + o.count]
            target.add_(data) if o.op == REDUCE else target.copy_(data)
        for dst, off, cnt, op, data in local:
            target = buffers[dst][off:off + cnt]
            target.add_(data) if op == REDUCE else target.copy_(data)
    return flat


def _execute_coded(schedule: Schedule, flat: torch.Tensor, transport, deadline: float) -> torch.Tensor:
    from ..coding import cerar

    if flat.numel() == 0:
        return flat
    worker = cerar.Worker(cerar.Design.from_dict(schedule.codec), transport.rank, flat)
    for p in plan(schedule, transport.rank):
        pending = [transport.recv(worker.receive(p.round), o.peer, o.tag) for o in p.recvs]
        packets = [worker.packet(p.round) for _ in p.sends]
        pending += [transport.send(pk, o.peer, o.tag) for pk, o in zip(packets, p.sends)]
        transport.wait(pending, deadline)
        worker.received(p.round)
    assert all(o.op == CODED for p in plan(schedule, transport.rank) for o in p.recvs + p.sends)
    return worker.result()
