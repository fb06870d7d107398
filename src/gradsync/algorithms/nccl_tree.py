"""NCCL's tree: a chain inside each machine, a double binary tree across machines.

Per channel c (one per GPU of a machine, so one per NIC, by default) and per tree t of the
double binary tree, a lane carries 1/(2C) of the buffer, pipelined in S segments:

- inside each machine the GPUs form a chain starting at local rank c (the head, whose NIC
  the channel uses): c, c + 1, ..., c + L - 1 (mod L), each GPU's parent the one before it;
- across machines the heads form NCCL's binary tree (``src/graph/trees.cc``,
  ``ncclGetBtree``: in-order, rank 0 the root above the highest power of two) for t = 0, and
  its mirror (M - 1 - m; its shift by one for odd M: ``ncclGetDtree``) for t = 1, so that a
  machine that is inner in one tree is a leaf in the other and every NIC carries the same.

Segments are reduced up the combined tree and broadcast down it, as ``tree.py`` pipelines
them: a GPU of height h (distance to its deepest leaf) sends segment k to its parent in round
k + h, the root's children get it back in round k + H and a GPU at depth d forwards it in round
k + H + d. Each tree's reduce and broadcast are lanes of their own (2 per tree: NCCL splits a
channel's threads between the two), each a track of rounds that runs apart from the others;
the root's broadcast of a segment waits for its reduce (the simulator keeps that order of the
data across tracks).

Cost (lock-step, from the same timing rule, not from the schedule): the sum over rounds of
alpha plus the busiest node's segments that round times the segment's bytes times beta
(beta_local on the chains, beta across machines). The bandwidth term tends to 2n / (C B)
per NIC and 2n / B_local on NVLink: a machine's GPUs together move each byte twice up and
down the chains.

>>> s = schedule(16, 4096, local_size=8, segments=2)
>>> s.rounds, len(s.transfers), int(s.lane.max()) + 1
(17, 960, 32)
"""

EXPLANATION = """\
NCCL's tree has two levels. Inside a machine the GPUs form a chain; across machines the chain
heads form a binary tree, and a second, mirrored tree carries the other half of the data, so
that every machine is inside one tree and a leaf of the other and all NICs work equally. The
data flows up in segments, each GPU adding its own, and back down as a broadcast, pipelined.
Only 2 log2 M network steps separate the leaves from the root, so at thousands of machines it
is far faster than a ring's 2 (N - 1) steps, for the same bytes per NIC."""


import functools
import math

import numpy as np

from ..core.schedule import COPY, REDUCE, Schedule, chunk_bounds, transfers
from ..errors import ConfigError
from ._common import Net, check_size
from .nccl_ring import _machines
from .spec import AlgorithmSpec, Option, is_int

SEGMENT_ELEMENTS = 1 << 18       # 1 MiB of float32 per segment: fine enough to pipeline
MAX_SEGMENTS = 256               # per lane: the pipeline's fill is then a few percent (depth 2 log2 M + 2 (L - 1))
TRANSFER_BUDGET = 1 << 20        # at most this many transfers: fewer, larger segments beyond


def btree(machines: int) -> np.ndarray:
    """NCCL's binary tree over ``machines`` (``ncclGetBtree``): the parent of each, -1 for the root.

    >>> btree(6).tolist()
    [-1, 2, 4, 2, 0, 4]
    """
    parent = np.full(machines, -1, np.int64)
    for rank in range(1, machines):
        bit = rank & -rank
        up = (rank ^ bit) | (bit << 1)
        parent[rank] = up if up < machines else rank ^ bit
    return parent


def dtree(machines: int) -> tuple[np.ndarray, np.ndarray]:
    """The double binary tree (``ncclGetDtree``): the btree, and its mirror (even M) or shift by
    one (odd M). ``dtree(4)[1].tolist()`` is [1, 3, 3, -1]."""
    first = btree(machines)
    if machines % 2:
        shifted = btree(machines)[(np.arange(machines) - 1) % machines]
        second = np.where(shifted < 0, -1, (shifted + 1) % machines)
    else:
        mirror = btree(machines)[machines - 1 - np.arange(machines)]
        second = np.where(mirror < 0, -1, machines - 1 - mirror)
    return first, second


def lanes(workers: int, local_size=None, channels=None) -> list[np.ndarray]:
    """The parent of every worker in each lane (channel c, tree t: lane 2c + t), -1 for the root.

    >>> [p.tolist() for p in lanes(4, 2)]
    [[-1, 0, 0, 2], [2, 0, -1, 2], [1, -1, 3, 1], [1, 3, 3, -1]]
    """
    machines, local, count = _machines(workers, local_size, channels)
    trees = dtree(machines)
    out = []
    for c in range(count):
        head = np.arange(machines) * local + c % local
        for across in trees:
            parent = np.full(workers, -1, np.int64)
            for i in range(1, local):                      # the chain c, c + 1, ... inside every machine
                node = np.arange(machines) * local + (c + i) % local
                parent[node] = np.arange(machines) * local + (c + i - 1) % local
            parent[head] = np.where(across >= 0, head[np.maximum(across, 0)], -1)
            out.append(parent)
    return out


@functools.lru_cache(maxsize=128)
def _trees(workers: int, local_size, channels) -> tuple:
    """Each lane's tree as (parent, height, depth), read-only: the cost model asks for the same
    trees at every size it prices, so they are worked out once per shape."""
    out = []
    for parent in lanes(workers, local_size, channels):
        height, depth = heights_depths(parent)
        for a in (parent, height, depth):
            a.setflags(write=False)
        out.append((parent, height, depth))
    return tuple(out)


def heights_depths(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each node's height (distance to its deepest leaf) and depth in the tree ``parent``.

    >>> [x.tolist() for x in heights_depths(np.array([-1, 0, 0, 1]))]
    [[2, 1, 0, 0], [0, 1, 1, 2]]
    """
    n = len(parent)
    depth = np.zeros(n, np.int64)
    has_parent = parent >= 0
    up = np.where(has_parent, parent, 0)
    levels = [np.flatnonzero(~has_parent)]
    while len(levels[-1]):                                 # level by level from the roots: O(n) each
        on = np.zeros(n, bool)
        on[levels[-1]] = True
        levels.append(np.flatnonzero(has_parent & on[up]))
        depth[levels[-1]] = len(levels) - 1
    height = np.zeros(n, np.int64)
    for nodes in reversed(levels[1:]):                     # deepest first: children before parents
        np.maximum.at(height, parent[nodes], height[nodes] + 1)
    return height, depth


def _segments(elements, lanes_count, workers, segments, budget=True):
    """Segments per lane: as given, else 1 MiB each, at most MAX_SEGMENTS and (``budget``: for a
    table to simulate) about TRANSFER_BUDGET transfers in all."""
    if segments is not None:
        if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
            raise ConfigError(f"segments must be an integer >= 1, got {segments!r}")
        return segments
    most = MAX_SEGMENTS if not budget else \
        max(1, min(MAX_SEGMENTS, TRANSFER_BUDGET // max(1, 2 * lanes_count * (workers - 1))))
    return int(min(most, max(1, -(-elements // (lanes_count * SEGMENT_ELEMENTS)))))


def schedule(workers: int, elements: int, local_size: int | None = None, channels: int | None = None,
             segments: int | None = None) -> Schedule:
    """Build NCCL's tree all-reduce for machines of ``local_size`` (default: one machine, one
    chain), ``channels`` chains per machine (default one per GPU when there are several
    machines), ``segments`` per lane (default: 1 MiB each, at most 256 and about a million transfers).

    >>> schedule(4, 100, segments=2).rounds
    7
    """
    workers, elements = check_size(workers, elements)
    trees = _trees(workers, local_size, channels)
    parents = [parent for parent, _, _ in trees]
    segments = _segments(elements, len(parents), workers, segments)
    lane_bounds = chunk_bounds(elements, len(parents))
    tables, lane_of = [], []
    for k, (parent, height, depth) in enumerate(trees):
        top = int(height.max(initial=0))
        child = np.flatnonzero(parent >= 0)
        bounds = lane_bounds[k] + chunk_bounds(int(lane_bounds[k + 1] - lane_bounds[k]), segments)
        seg = np.arange(segments)[:, None]
        offset, count = bounds[seg], bounds[seg + 1] - bounds[seg]
        for phase, table in enumerate((transfers(seg + height[child], child, parent[child], offset, count, REDUCE),
                                       transfers(seg + top + depth[parent[child]], parent[child], child, offset,
                                                 count, COPY))):
            tables.append(table)
            lane_of.append(np.full(len(table), 2 * k + phase, np.int16))
    table = np.concatenate(tables) if tables else transfers(0, 0, 1, 0, 0, REDUCE)
    lane = np.concatenate(lane_of) if lane_of else np.empty(0, np.int16)
    machines, local, count = _machines(workers, local_size, channels)
    return Schedule("nccl_tree", workers, elements, table, options={"local_size": local_size, "channels": count,
                                                                    "segments": segments}, lane=lane)


def cost(workers: int, nbytes: float, net: Net, itemsize: int = 4, local_size=None, channels=None, segments=None,
         **options) -> float:
    """Lock-step time from the timing rule (module docstring): per round, alpha plus the busiest
    node's segments on the chains times beta_local or across machines times beta. With posted
    sends (``net.posted``: a GPU machine) the rounds pipeline and the latencies are paid once
    along the tree's depth: up the chains and the tree and down again.
    ``round(cost(8, 8e6, Net(1e-6, 1 / 10e9), segments=8) * 1e3, 3)`` is 4.43."""
    if workers == 1:
        return 0.0
    trees = _trees(workers, local_size, channels)
    parents = [parent for parent, _, _ in trees]
    segments = _segments(max(1, int(nbytes // itemsize)), len(parents), workers, segments, budget=False)
    seg_bytes = nbytes / len(parents) / segments
    machines, local, _ = _machines(workers, local_size, channels)
    beta_local = net.beta if net.local_beta is None else net.local_beta
    alpha_local = net.local_alpha or net.alpha
    alpha = net.alpha if machines > 1 else alpha_local
    if net.posted:               # a pipeline: S segments behind a fill of its depth, latencies once along it
        inside, across, depth = _steady_loads(trees, local)
        per_segment = max(inside * beta_local, across * net.beta) * seg_bytes
        hops = int(math.log2(machines)) + 1 if machines > 1 else 0
        filling = min(1.0, 2 / len(parents))    # while it fills, a link carries the first segment of one
                                                 # channel's two trees, not every lane's
        return float((segments - 1 + depth * filling) * per_segment + 2 * ((local - 1) * alpha_local + hops * alpha))
    inside, across = _loads(trees, segments, local)
    per_round = np.maximum(inside * beta_local, across * net.beta) * seg_bytes \
        + _adds(trees, segments) * seg_bytes / itemsize * net.gamma
    return float(np.sum(per_round + alpha))


def _steady_loads(trees, local):
    """In the pipeline's steady state, the most segments one node moves each way per round on the
    chains and across machines (every lane: its children up and its parent down in, the reverse
    out), and the pipeline's depth (2 H rounds of the deepest lane)."""
    n = len(trees[0][0])
    machine = np.arange(n) // local
    load = np.zeros((2, n))
    depth = 0
    for parent, height, _ in trees:
        child = np.flatnonzero(parent >= 0)
        far = (machine[child] != machine[parent[child]]).astype(np.int64)
        np.add.at(load, (far, child), 1)              # a child's edge to its parent: one segment each way
        np.add.at(load, (far, parent[child]), 1)      # the parent's edge to the child, likewise
        depth = max(depth, 2 * int(height.max(initial=0)))
    return load[0].max(initial=0), load[1].max(initial=0), depth


def _rounds(trees, segments) -> int:
    return max(segments + 2 * int(height.max(initial=0)) - 1 for _, height, _ in trees)


def _loads(trees, segments, local):
    """Per round, the most segments one node sends or receives on the chains and across machines."""
    n, rounds = len(trees[0][0]), _rounds(trees, segments)
    out = np.zeros((2, 2, n, rounds), np.int64)              # (inside, across) x (send, receive)
    machine = np.arange(n) // local
    for parent, height, depth in trees:
        top = int(height.max(initial=0))
        child = np.flatnonzero(parent >= 0)
        far = (machine[child] != machine[parent[child]]).astype(np.int64)
        for first, src, dst in ((height[child], child, parent[child]), (top + depth[parent[child]], parent[child], child)):
            r = first[:, None] + np.arange(segments)[None, :]
            for end, node in ((0, src), (1, dst)):
                np.add.at(out, (far[:, None], end, node[:, None], r), 1)
    load = out.max(axis=1).max(axis=1)                       # busiest direction, then node
    return load[0], load[1]


def _adds(trees, segments):
    """Per round, the most segments one node adds in one lane (those it receives going up; its
    lanes are separate tracks, as NCCL's channels run on separate SMs)."""
    most = np.zeros(_rounds(trees, segments), np.int64)
    for parent, height, _ in trees:
        adds = np.zeros((len(parent), len(most)), np.int64)
        child = np.flatnonzero(parent >= 0)
        r = height[child][:, None] + np.arange(segments)[None, :]
        np.add.at(adds, (parent[child][:, None], r), 1)
        most = np.maximum(most, adds.max(axis=0, initial=0))
    return most


SPEC = AlgorithmSpec(
    name="nccl_tree", schedule=schedule, cost=cost, explanation=EXPLANATION,
    phases={"reduce": "reduce up the chains and the trees", "copy": "broadcast down them",
            "reduce inside": "reduce up the chains", "reduce across": "reduce up the trees",
            "copy across": "broadcast down the trees", "copy inside": "broadcast down the chains"},
    lane_name="tree", exact=True,
    summary="NCCL's tree: chains inside machines, a double binary tree across them, pipelined",
    options={"local_size": Option(None, "an integer >= 1 that divides the workers (GPUs per machine)", is_int(1)),
             "channels": Option(None, "an integer in 1..1024 (chains per machine; default one per GPU)", is_int(1)),
             "segments": Option(None, "an integer >= 1 (segments per lane)", is_int(1))},
    machine_option="local_size")
