"""Reduce-scatter, all-gather and broadcast as halves of an all-reduce schedule.

An exact schedule's REDUCE transfers leave the complete sum of each segment at some node (its
owner; ``core.schedule.complete_segments``): that half alone is a reduce-scatter. Its COPY
transfers start from the owners and hand every segment to every worker: an all-gather. When a
single node owns everything after the REDUCE half (tree, central), the COPY half alone is a
broadcast from it. So these collectives are the same verified, simulated, costed schedules as
the all-reduce, run with only one kind of transfer (as ``integrations.kvstore`` does).

torch.distributed fixes who holds what: rank ``r`` of a reduce-scatter ends with the sum of
chunk ``r`` of the input, an all-gather's chunk ``r`` comes from rank ``r``, a broadcast starts
at ``root``. A schedule's owners follow their own order (a ring's node ``w`` owns chunk
``w + 1``). Where every worker owns one contiguous chunk, the ranks are relabelled: torch rank
``r`` plays the node that owns chunk ``r`` (``Relabelled``), and the collective runs in the
caller's tensors. Otherwise each rank's chunk is scattered into the segments its node owns.
"""

from __future__ import annotations

import dataclasses
import json
import time
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import torch

from .. import algorithms, dtypes
from ..core.plan import compile_plan
from ..core.schedule import COPY, REDUCE, Schedule, complete_segments
from ..errors import ConfigError
from .agree import Agreement, digest, seen_before
from .collective import Collective, Done
from .compile import frozen
from .transport.hosts import local_size

KINDS = ("reduce_scatter", "all_gather", "broadcast")
PROBE_ELEMENTS = 8          # per worker, for ``produces``


class Layout(NamedTuple):
    """Where torch's chunks live in a schedule's buffer.

    schedule: the schedule (its algorithm renamed "<algorithm>/<kind>" for traces and records).
    node_of_rank: torch rank -> the node it plays.
    segments: torch rank -> the buffer segments (offset, count) holding its chunk, in order.
    in_place: every rank's chunk is the contiguous ``[r * c, (r + 1) * c)``: no scattering.
    """

    schedule: Schedule
    node_of_rank: tuple
    segments: tuple
    in_place: bool


@lru_cache(maxsize=256)
def layout(algorithm: str, kind: str, workers: int, elements: int, frozen_options: str = "{}") -> Layout | None:
    """The layout of ``kind`` ("reduce_scatter", "all_gather", "broadcast") built from
    ``algorithm`` for ``workers`` ranks and ``elements`` in all; None when its halves cannot
    produce it (an owner that is a helper node, unequal shares, shared ownership).

    >>> layout("ring", "reduce_scatter", 4, 8).node_of_rank
    (3, 0, 1, 2)
    >>> layout("tree", "reduce_scatter", 4, 8) is None, layout("tree", "broadcast", 4, 8).node_of_rank
    (True, (0, 1, 2, 3))
    """
    spec = algorithms.get(algorithm)
    if not spec.exact:
        return None
    schedule = algorithms.build(algorithm, workers, elements, **json.loads(frozen_options))
    owned = complete_segments(schedule)
    if kind == "broadcast":
        whole = [n for n, segs in owned.items() if n < workers and segs == [(0, elements)]]
        if len(whole) != 1 or elements == 0:
            return None
        # torch rank 0 plays the owner; the broadcast relabels again from its root (``roots``)
        order = (whole[0],) + tuple(n for n in range(workers) if n != whole[0])
        return Layout(_renamed(schedule, kind), order, ((0, elements),) * workers, True)
    share = elements // workers
    if elements % workers or any(n >= workers for n in owned) or len(owned) != workers:
        return None
    if sum(c for segs in owned.values() for _, c in segs) != elements:
        return None                 # a segment owned twice, or one owned by nobody
    if any(sum(c for _, c in segs) != share for segs in owned.values()):
        return None
    renamed = _renamed(schedule, kind)
    chunks = {segs[0][0] // share: n for n, segs in owned.items() if len(segs) == 1 and segs[0][0] % share == 0}
    if len(chunks) == workers and spec.machine_option is not None:
        # a machine-aware schedule keeps every rank on its own node (relabelling would move
        # ranks across machines and send its local phases over the network): its buffer's
        # chunks move instead, so that node r's is chunk r
        return Layout(by_rank(renamed, chunks, share), tuple(range(workers)),
                      tuple(((r * share, share),) for r in range(workers)), True)
    if len(chunks) == workers:
        order = tuple(chunks[r] for r in range(workers))
        return Layout(renamed, order, tuple(((r * share, share),) for r in range(workers)), True)
    order = tuple(range(workers))
    return Layout(renamed, order, tuple(tuple(owned[n]) for n in order), False)


def by_rank(schedule: Schedule, owner_of_chunk: dict, share: int) -> Schedule:
    """``schedule`` with its buffer's chunks of ``share`` elements moved so that the chunk node
    ``owner_of_chunk[c]`` owns after the REDUCE half lies at chunk ``owner_of_chunk[c]``: the same
    transfers between the same nodes, each cut where it crosses a chunk's edge.

    >>> s = algorithms.build("hierarchical", 4, 8, local_size=2)
    >>> owners = {o[0][0] // 2: n for n, o in complete_segments(s).items()}
    >>> sorted(complete_segments(by_rank(s, owners, 2)).items())
    [(0, [(0, 2)]), (1, [(2, 2)]), (2, [(4, 2)]), (3, [(6, 2)])]
    """
    t = schedule.transfers
    first = t["offset"] // share
    pieces = (t["offset"] + t["count"] - 1) // share - first + 1
    cut = np.repeat(t, pieces)
    chunk = np.repeat(first, pieces) + np.arange(len(cut)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    start = np.maximum(cut["offset"], chunk * share)
    end = np.minimum(cut["offset"] + cut["count"], (chunk + 1) * share)
    moved = np.array([owner_of_chunk[c] for c in range(len(owner_of_chunk))], dtype=np.int64)
    cut["offset"] = moved[chunk] * share + start - chunk * share
    cut["count"] = end - start
    lane = None if schedule.lane is None else np.repeat(schedule.lane, pieces)
    return dataclasses.replace(schedule, transfers=cut, lane=lane)


def _renamed(schedule: Schedule, kind: str) -> Schedule:
    return dataclasses.replace(schedule, algorithm=f"{schedule.algorithm}/{kind}")


@lru_cache(maxsize=256)
def produces(algorithm: str, workers: int) -> tuple[str, ...]:
    """Which of ``KINDS`` the halves of ``algorithm`` give for ``workers`` ranks.

    >>> produces("ring", 4), produces("tree", 4)
    (('reduce_scatter', 'all_gather'), ('broadcast',))
    """
    if workers < 2:
        return KINDS
    return tuple(k for k in KINDS if layout(algorithm, k, workers, PROBE_ELEMENTS * workers) is not None)


class Relabelled:
    """A transport on which this process plays node ``node_of_rank[rank]`` of a schedule: peers
    are named by node, sent to the torch rank that plays them. Everything else (its group,
    keys, failure notices) is the inner transport's, so errors name torch ranks.

    >>> from gradsync.runtime.transport.memory import MemoryTransport
    >>> Relabelled(MemoryTransport.group(2)[0], (1, 0)).rank
    1
    """

    def __init__(self, inner, node_of_rank: tuple):
        self.inner = inner
        self.rank_of_node = {n: r for r, n in enumerate(node_of_rank)}
        self.rank, self.size = node_of_rank[inner.rank], inner.size

    def __getattr__(self, name):          # group_key, failure_key, group, waiting_for, reduce_from, ...
        return getattr(self.inner, name)

    def send(self, tensor, peer, tag):
        return self.inner.send(tensor, self.rank_of_node[peer], tag)

    def recv(self, tensor, peer, tag):
        return self.inner.recv(tensor, self.rank_of_node[peer], tag)

    def post(self, ops):
        return self.inner.post([(kind, t, self.rank_of_node[p], tag) for kind, t, p, tag in ops])

    def wait(self, pending, deadline):
        return self.inner.wait(pending, deadline)

    def gather(self, data, deadline, tag=0):
        by_rank = self.inner.gather(data, deadline, tag)
        return [by_rank[self.rank_of_node[n]] for n in range(self.size)]

    def close(self):
        self.inner.close()


@dataclasses.dataclass(frozen=True, eq=False)
class Deliver:
    """What a half does with its buffer at the end (the collective's ``finish``): copy the
    segments of ``segments`` into ``out`` in order, divide by ``divide`` first (``op="avg"``)."""

    out: torch.Tensor
    segments: tuple = ()
    divide: int = 1

    def apply(self, result: torch.Tensor, rank: int) -> torch.Tensor:
        if self.segments:
            parts = [result[o:o + c] for o, c in self.segments]
            self.out.view(-1).copy_(parts[0] if len(parts) == 1 else torch.cat(parts))
        if self.divide > 1:
            self.out.div_(self.divide)
        return self.out


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, algorithm: str, transport, deadline: float,
                   op: str = "sum", options: dict | None = None, trace=None):
    """The collective that sums every rank's ``input`` (N chunks of ``output.numel()``) and
    leaves chunk ``r`` of the sum in rank ``r``'s ``output``, by ``algorithm``'s REDUCE half;
    ``input`` is left as it was. ``op``: "sum" or "avg". ``trace``: a ``tracing.Trace`` to
    record it in (every rank passes one, or none). Start it: ``.start().wait()``.

    Example, in each of N ranks: ``reduce_scatter(out, x, "ring", transport, deadline).start().wait()``.
    """
    _check_pair(output, input, transport.size, "reduce_scatter")
    found, options = _layout(algorithm, "reduce_scatter", transport, input.numel(), deadline, options)
    node = found.node_of_rank[transport.rank]
    if transport.size == 1:
        output.copy_(input.view(output.shape))
        return Done(output.div_(1), transport)
    buffer = torch.empty(input.numel(), dtype=input.dtype, device=input.device)
    if found.in_place:
        buffer.copy_(input.reshape(-1))
    else:                                   # each rank's chunk into its node's segments
        flat, share = input.reshape(-1), output.numel()
        for r, segs in enumerate(found.segments):
            at = r * share
            for o, c in segs:
                buffer[o:o + c].copy_(flat[at:at + c])
                at += c
    finish = Deliver(output, found.segments[transport.rank], transport.size if op == "avg" else 1)
    return _collective(found, algorithm, "reduce_scatter", REDUCE, buffer, transport, node, deadline, finish,
                       op, options, trace)


def all_gather(output: torch.Tensor, input: torch.Tensor, algorithm: str, transport, deadline: float,
               options: dict | None = None, trace=None):
    """The collective that puts rank ``r``'s ``input`` at chunk ``r`` of every rank's
    ``output``, by ``algorithm``'s COPY half. Start it: ``.start().wait()``.

    Example, in each of N ranks: ``all_gather(out, x, "ring", transport, deadline).start().wait()``.
    """
    _check_pair(input, output, transport.size, "all_gather")
    found, options = _layout(algorithm, "all_gather", transport, output.numel(), deadline, options)
    node, share = found.node_of_rank[transport.rank], input.numel()
    if transport.size == 1:
        output.view(-1).copy_(input.reshape(-1))
        return Done(output, transport)
    if found.in_place and output.is_contiguous():
        buffer, finish = output.view(-1), None
        buffer[transport.rank * share:(transport.rank + 1) * share].copy_(input.reshape(-1))
    else:
        buffer = torch.empty(output.numel(), dtype=output.dtype, device=output.device)
        at = 0
        for o, c in found.segments[transport.rank]:
            buffer[o:o + c].copy_(input.reshape(-1)[at:at + c])
            at += c
        finish = Deliver(output, tuple(s for segs in found.segments for s in segs))
    return _collective(found, algorithm, "all_gather", COPY, buffer, transport, node, deadline, finish,
                       "copy", options, trace)


def broadcast(tensor: torch.Tensor, root: int, algorithm: str, transport, deadline: float,
              options: dict | None = None, trace=None):
    """The collective that copies ``root``'s ``tensor`` into every rank's, by the COPY half of
    an ``algorithm`` whose REDUCE half gathers everything at one node (tree, central).

    Example, in each rank: ``broadcast(t, 0, "tree", transport, deadline).start().wait()``.
    """
    if not 0 <= root < transport.size:
        raise ConfigError(f"broadcast root must be a rank in 0..{transport.size - 1}, got {root!r}")
    if transport.size == 1 or tensor.numel() == 0:
        return Done(tensor, transport)
    found, options = _layout(algorithm, "broadcast", transport, tensor.numel(), deadline, options)
    rest = [r for r in range(transport.size) if r != root]
    nodes = {root: found.node_of_rank[0], **{r: found.node_of_rank[1 + i] for i, r in enumerate(rest)}}
    found = found._replace(node_of_rank=tuple(nodes[r] for r in range(transport.size)))
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    finish = None if flat.data_ptr() == tensor.data_ptr() else Deliver(tensor, ((0, flat.numel()),))
    return _collective(found, algorithm, f"broadcast:{root}", COPY, flat, transport,
                       found.node_of_rank[transport.rank], deadline, finish, "copy", options, trace)


def _check_pair(small: torch.Tensor, big: torch.Tensor, workers: int, kind: str) -> None:
    if small.dtype != big.dtype or big.numel() != small.numel() * workers:
        raise ConfigError(f"{kind}: the full tensor must hold {workers} x the chunk's {small.numel()} elements of "
                          f"one dtype, got {big.numel()} {big.dtype} and {small.numel()} {small.dtype}")


def _layout(algorithm: str, kind: str, transport, elements: int, deadline: float, options: dict | None):
    """The layout, with the options the algorithm needs (hierarchical's machines); ConfigError
    when the algorithm's halves cannot give ``kind`` for this group."""
    spec = algorithms.get(algorithm)
    options = dict(options or {})
    spec.check_options(options)
    if spec.machine_option is not None and options.get(spec.machine_option) is None:
        group = getattr(transport, "group", False)
        options[spec.machine_option] = local_size(transport.size, group, max(1.0, deadline - time.monotonic()))
    found = layout(algorithm, kind, transport.size, elements, frozen(options))
    if found is None:
        able = ", ".join(a for a in algorithms.names(exact=True) if kind in produces(a, transport.size)) or "none"
        raise ConfigError(f"algorithm {algorithm!r} cannot give {kind} for {transport.size} ranks and {elements} "
                          f"elements; ones that can: {able}")
    return found, options


def _collective(found: Layout, algorithm: str, kind: str, op: int, buffer: torch.Tensor, transport, node: int,
                deadline: float, finish, reduce_op: str, options: dict, trace=None) -> Collective:
    schedule = found.schedule
    dtype = str(buffer.dtype).removeprefix("torch.")
    plan = _plan(algorithm, kind.partition(":")[0], schedule.workers, schedule.elements, dtype, frozen(options),
                 node, op)
    description = {"collective": kind, "elements": schedule.elements, "dtype": dtype, "algorithm": algorithm,
                   "options": options, "op": reduce_op, "device": buffer.device.type}
    if trace is not None:                  # a rank tracing alone would wait for a clock exchange
        description["traced"] = True
    signature = digest(description)
    before = not seen_before(transport.group_key, signature)
    relabelled = Relabelled(transport, found.node_of_rank)
    return Collective(schedule, plan, {node: buffer}, relabelled, deadline,
                      Agreement(relabelled, description, before, signature), finish,
                      salt=int.from_bytes(signature[:4], "little"), trace=trace)


@lru_cache(maxsize=256)
def _plan(algorithm: str, kind: str, workers: int, elements: int, dtype: str, frozen_options: str, node: int, op: int):
    """``node``'s plan of the half of ``kind``: compiled from the layout's schedule (whose
    chunks may have moved, ``by_rank``), once per bucket as ``compile.compiled`` does."""
    schedule = layout(algorithm, kind, workers, elements, frozen_options).schedule
    return compile_plan(schedule, node, dtypes.itemsize(dtype), (op,))
