"""Simulating a compact schedule without its table: the flows of one block of workers, where
a subgroup of the schedule's rotations maps the topology onto itself too.

The subgroup is the multiples of ``strides`` (digit i moved by multiples of strides[i]): all
rotations (strides all 1: one worker's transfers), or the rotations of machines only (the
local digit fixed: one machine's transfers, for a flat ring on a cluster whose local ranks
differ). The proof is the one of the rotation shortcut, per generator of the subgroup: the
routes of every rotated copy of the block's pairs, a channel permutation per generator that
maps each route onto its image and keeps capacities and incast factors, equal latencies, and
equal node terms along every orbit of workers. Then every copy of a block transfer sees the
same numbers at every event, and the times are the full simulation's, bit for bit.
"""

from __future__ import annotations

import numpy as np

from ...core.compact import CompactSchedule
from ...core.schedule import COPY
from .engine import _System
from .flows import _NodeCosts, _steps
from .network import _pair_routes
from .symmetry import orbit_system

ROUTE_LIMIT = 1 << 22        # routes computed to prove a subgroup's symmetry on the topology


def candidate_strides(c: CompactSchedule, machine: int) -> list[tuple[int, ...]]:
    """The subgroups to try, largest first: every rotation; then, for a flat schedule (one
    dimension), the rotations by whole machines of ``machine`` workers; for a grid, the
    rotations of its first dimension (machines) alone.

    >>> from gradsync.algorithms import ring
    >>> candidate_strides(ring.compact(16, 16), 8)
    [(1,), (8,)]
    """
    out = [(1,) * len(c.shape)]
    if len(c.shape) == 1 and 1 < machine < c.workers and c.workers % machine == 0:
        out.append((machine,))
    elif len(c.shape) > 1 and any(d > 1 for d in c.shape[1:]):
        out.append((1,) + tuple(c.shape[1:]))
    return out


def _worker_orbit(c: CompactSchedule, strides) -> np.ndarray:
    """Per worker, the index of its orbit's representative among the block's workers."""
    w = np.arange(c.workers)
    index = np.zeros(c.workers, np.int64)
    place = 1
    for i in reversed(range(len(c.shape))):
        digit = w // place % c.shape[i]
        place *= c.shape[i]
        index += digit % strides[i] * int(np.prod(strides[i + 1:]))
    return index


def compact_system(c: CompactSchedule, net, itemsize: int, strides) -> _System | None:
    """The block of ``strides`` as the event loop's flows, or None where the topology (or a
    node term) breaks the subgroup's symmetry."""
    n, nodes, padding = c.workers, c.nodes, net.padding
    reps = int(np.prod(strides))
    order = n // reps                                        # elements of the subgroup
    orbit_of = _worker_orbit(c, strides)
    rep_worker = np.unique(orbit_of, return_index=True)[1]
    for x in (net.add_rate, net.madd_rate, net.overhead, net.startup, net.per_round, net.wire):
        if (x[:n] != x[rep_worker][orbit_of]).any():
            return None
    if (net.machine >= 0).any() and ((net.machine[:n] != net.machine[0]).any() or reps > 1):
        return None
    block, lane = c.block(strides, lanes=True)
    pairs = np.unique(block["src"].astype(np.int64) * nodes + block["dst"])
    if len(pairs) * order > ROUTE_LIMIT:
        return None
    found = _channel_orbits(c, pairs, strides, net)
    if found is None:
        return None
    paths, latency, label, weight = found

    def q(x):                                                # schedule node -> system node
        return np.where(x < n, orbit_of[np.minimum(x, n - 1)], x - n + reps)

    def per_system_node(x):
        return np.concatenate([x[rep_worker], x[n:]])
    which = np.searchsorted(pairs, block["src"].astype(np.int64) * nodes + block["dst"])
    helpers = len(c.helpers)
    costs = _NodeCosts(np.array([1.0] * reps + [float(order)] * helpers),
                       *(per_system_node(x) for x in (net.add_rate, net.madd_rate, net.overhead, net.per_round,
                                                       net.machine)),
                       net.cores, np.array([float(order)] * reps + [1.0] * helpers))
    empty = np.empty(0, np.int64)
    steps = _steps((q(block["src"]), q(block["dst"]), block["round"]), (empty, empty, empty),
                   np.where(block["op"] != COPY, block["count"], 0), max(c.rounds, 1), costs,
                   _block_lanes(c, block, lane, strides))
    return orbit_system(label, paths[which], padding, net, weight, latency[which], block, itemsize, steps,
                        reps + helpers, per_system_node(net.startup), q(np.arange(nodes)), None)


def _block_lanes(c: CompactSchedule, block, lane, strides):
    """The lanes of the block's transfers at their two ends, as ``flows._steps`` takes them (None
    without lanes). A block transfer's anchor (its worker end that the program rotated, a
    representative) keeps its lane; at its other worker end the lane is seen from that worker's
    representative: rotated by the group element h taking the worker there (h's digit of the
    lane's dimension: minus the multiple of the stride in the worker's digit)."""
    if lane is None:
        return None
    dim, parts = c.levels[c.lane_level]
    n, lane = c.workers, lane.astype(np.int64)
    place = int(np.prod(c.shape[dim + 1:]))
    anchor_is_src = block["src"] < n

    def seen_from_rep(x):
        digit = x // place % c.shape[dim]
        return (lane - (digit - digit % strides[dim])) % parts
    src_lane = np.where(anchor_is_src | (block["src"] >= n), lane, seen_from_rep(block["src"]))
    dst_lane = np.where(anchor_is_src & (block["dst"] < n), seen_from_rep(block["dst"]), lane)
    return src_lane, dst_lane, parts


def _channel_orbits(c: CompactSchedule, pairs, strides, net):
    """Routes of ``pairs`` (source * nodes + destination) as padded channel paths with their
    latencies, each channel's orbit under the subgroup (its least channel) and how many
    copies of the block one crossing of it stands for; None unless every generator of the
    subgroup maps every route onto a route with the same latency, by one permutation of the
    channels that keeps their capacities and incast factors."""
    nodes, padding = c.nodes, net.padding
    steps = tuple(d // s for d, s in zip(c.shape, strides))          # the subgroup's shape
    grid = np.stack([g.ravel() for g in np.meshgrid(*(np.arange(k) for k in steps), indexing="ij")], axis=-1)
    g = (grid * np.array(strides))[:, None, :]
    src, dst = (c.rotate(x[None, :], g) for x in (pairs // nodes, pairs % nodes))
    paths, latency = _pair_routes(src.ravel(), dst.ravel(), net)
    order = len(grid)
    paths, latency = paths.reshape(steps + (len(pairs), -1)), latency.reshape(order, len(pairs))
    if (latency != latency[0]).any():
        return None
    label, used = np.arange(padding + 1), np.unique(paths)
    for axis, k in enumerate(steps):
        if k == 1:
            continue
        image = np.roll(paths, -1, axis=axis)                  # each route rotated once more
        if ((paths == padding) != (image == padding)).any():
            return None
        pi = np.arange(padding + 1)
        pi[paths.ravel()] = image.ravel()
        if ((pi[paths] != image).any() or np.bincount(pi[used], minlength=padding + 1).max() > 1   # injective
                or (net.capacity[pi[used]] != net.capacity[used]).any()
                or (net.fan_in[pi[used]] != net.fan_in[used]).any()):
            return None
        jump = pi
        for _ in range(k.bit_length()):                    # pointer jumping: the least channel of each cycle
            label, jump = np.minimum(label, label[jump]), jump[jump]
    label = label[label]
    weight = (order // np.bincount(label, minlength=padding + 1)[label]).astype(float)
    first = paths.reshape(order, len(pairs), -1)[0]
    return first, latency[0], label, weight
