"""The symmetric shortcut: a schedule that rotating the workers maps onto itself, on a topology
the rotation maps onto itself too, is simulated on one worker's transfers (``_cyclic`` finds
the rotation, ``_quotient`` proves the topology keeps it and builds the smaller system).
"""

from __future__ import annotations

import numpy as np

from ...core.schedule import COPY, Schedule
from .engine import _System
from .flows import _NodeCosts, _steps
from .network import _pair_routes

_PAIR_LIMIT = 1 << 20     # routes computed to prove a schedule's symmetry on the topology


def _cyclic(schedule: Schedule):
    """Whether rotating the workers (w -> w + 1 mod N, helpers fixed) maps the schedule onto
    itself transfer for transfer: same round, count and op (offsets may differ: the simulator
    does not read them), and the same compute. If so, ``(rep, orbit)``: the representatives
    (the transfers worker 0 sends, or receives from a helper) and, per transfer, the index in
    ``rep`` of the representative it is a rotation of; else None. A sufficient test (blocks
    compared in a canonical order): a symmetric schedule it misses is simulated in full."""
    n, t, c = schedule.workers, schedule.transfers, schedule.compute
    if n < 3 or not len(t) or (schedule.lane is not None and (schedule.lane != schedule.lane[0]).any()):
        return None                          # several lanes: their tracks would have to rotate too
    src, dst = t["src"], t["dst"]
    shift = np.where(src < n, src, dst)
    if (shift >= n).any():                   # a transfer between helpers is its own orbit
        return None
    if not _compute_symmetric(c, n):
        return None
    columns = ([t["round"], t["count"], t["op"]], [src, dst])
    size = len(t) // n
    if len(t) % n == 0 and (shift.reshape(size, n) == np.arange(n)).all():
        # listed worker by worker within each row (a ring): no sort needed
        if not _rows_equal(n, *columns):
            return None
        return np.arange(size) * n, np.repeat(np.arange(size, dtype=np.int32 if size < 1 << 31 else np.int64), n)
    per_block = np.bincount(shift, minlength=n)
    if (per_block != size).any():
        return None
    order = np.argsort(shift.astype(np.uint16) if n <= 1 << 16 else shift, kind="stable")
    if not _blocks_equal(order, size, n, shift, *columns):
        order = _sorted_blocks(order, size, n, shift, t["round"], src, dst, schedule.nodes)
        if order is None or not _blocks_equal(order, size, n, shift, *columns):
            return None
    orbit = np.empty(len(t), np.int32 if size < 1 << 31 else np.int64)
    chunk = max(size, 1 << 22) // size * size
    for i in range(0, len(t), chunk):
        orbit[order[i:i + chunk]] = np.arange(i, min(i + chunk, len(t))) % size
    return order[:size], orbit


def _compute_symmetric(c, n) -> bool:
    """Whether the workers' compute is the same up to rotation (a helper's is fixed by it)."""
    worker_compute = c["node"] < n
    if not worker_compute.any():
        return True
    node = c["node"][worker_compute]
    counts = np.bincount(node, minlength=n)
    if (counts != counts[0]).any():
        return False
    order = np.argsort(node, kind="stable")
    return _blocks_equal(order, int(counts[0]), n, node, [c["round"][worker_compute], c["madds"][worker_compute]], [])


def _rows_equal(n, plain, nodes, chunk=1 << 22) -> bool:
    """For a table listed worker by worker (entry i shifted by i mod n): whether every entry
    equals the first of its row, the ``nodes`` columns rotated back by the shift."""
    rows = len(plain[0]) // n
    per = max(1, chunk // n)
    k = np.arange(n)
    for r0 in range(0, rows, per):
        part = slice(r0 * n, min(rows, r0 + per) * n)
        for col in plain + nodes:
            v = col[part].reshape(-1, n)
            if any(col is x for x in nodes):
                v = np.where(v < n, (v - k) % n, v)
            if (v != v[:, :1]).any():
                return False
    return True


def _sorted_blocks(order, size, n, shift, rnd, src, dst, nodes, chunk=1 << 22):
    """``order`` with each block sorted by (round, source, destination) rotated back, for
    schedules that list a worker's transfers in another order than its neighbour's (sharded);
    None where a block holds two transfers with the same key."""
    out = np.empty_like(order)
    per = max(1, chunk // max(size, 1))
    for k0 in range(0, n, per):
        idx = order[k0 * size:min(n, k0 + per) * size]
        k = shift[idx]
        key = (rnd[idx].astype(np.int64) * nodes + np.where(src[idx] < n, (src[idx] - k) % n, src[idx])) * nodes \
            + np.where(dst[idx] < n, (dst[idx] - k) % n, dst[idx])
        key, idx = key.reshape(-1, size), idx.reshape(-1, size)
        within = np.argsort(key, axis=1)
        key = np.take_along_axis(key, within, axis=1)
        if (key[:, 1:] == key[:, :-1]).any():
            return None
        out[k0 * size:min(n, k0 + per) * size] = np.take_along_axis(idx, within, axis=1).ravel()
    return out


def _blocks_equal(order, size, n, shift, plain, nodes, chunk=1 << 22) -> bool:
    """Whether every block of ``size`` entries of ``order`` equals block 0 column by column, the
    ``nodes`` columns rotated back by the block's shift (workers only; helpers are fixed).
    Compared a few million entries at a time, so the check costs no table-sized copies."""
    def normalized(idx):
        k = shift[idx]
        return [col[idx] for col in plain] + [np.where(v < n, (v - k) % n, v)
                                              for v in (col[idx].astype(np.int64) for col in nodes)]
    first = normalized(order[:size])
    per = max(1, chunk // max(size, 1))
    for k0 in range(0, n, per):
        for v, f in zip(normalized(order[k0 * size:min(n, k0 + per) * size]), first):
            if (v.reshape(-1, size) != f).any():
                return False
    return True


def _quotient(schedule, net, itemsize, rep, orbit) -> _System | None:
    """The transfers of block 0 of a rotation-symmetric schedule (``_cyclic``) as the flows,
    or None where the topology breaks the symmetry. Proven here: the rotation maps every
    route onto a route (a permutation of the channels that keeps capacities and incast
    factors, and the same latency), and every worker has the same rates and overheads. Then
    every transfer's rotated copies see the same state at every event: a channel orbit of
    size m carries N/m times block 0's crossings of it, which ``weight`` says, and a helper
    (fixed by the rotation) does the work of N times block 0's transfers into it."""
    n, t, c, nodes = schedule.workers, schedule.transfers, schedule.compute, schedule.nodes
    padding = net.padding
    if any((x[:n] != x[0]).any() for x in (net.add_rate, net.madd_rate, net.overhead, net.startup, net.per_round,
                                           net.machine, net.wire)):
        return None
    rep = t[rep]
    pairs = np.unique(rep["src"].astype(np.int64) * nodes + rep["dst"])
    if len(pairs) * n > _PAIR_LIMIT:
        return None
    routes = _channel_orbits(pairs, n, nodes, net)
    if routes is None:
        return None
    paths, latency, label, weight = routes

    def q(x):                                             # schedule node -> system node
        return np.where(x < n, 0, x - n + 1)

    def helpers_after_worker0(x):
        return np.append(x[0], x[n:])
    which = np.searchsorted(pairs, rep["src"].astype(np.int64) * nodes + rep["dst"])
    kept = (c["node"] == 0) | (c["node"] >= n)
    node_weight = np.array([1.0] + [float(n)] * len(schedule.helpers))
    costs = _NodeCosts(node_weight, *(helpers_after_worker0(x) for x in (net.add_rate, net.madd_rate, net.overhead,
                                                                          net.per_round, net.machine)),
                       net.cores, np.array([float(n)] + [1.0] * len(schedule.helpers)))
    steps = _steps((q(rep["src"]), q(rep["dst"]), rep["round"]),
                   (q(c["node"][kept]), c["round"][kept], c["madds"][kept]), np.where(rep["op"] != COPY, rep["count"], 0), max(schedule.rounds, 1), costs)
    return orbit_system(label, paths[which], padding, net, weight, latency[which], rep, itemsize, steps,
                        1 + len(schedule.helpers), helpers_after_worker0(net.startup), q(np.arange(nodes)), orbit)


def orbit_system(label, paths, padding, net, weight, latency, table, itemsize: int, steps, nodes: int, startup,
                 node_ids, orbit) -> _System:
    """The quotient system of ``table``'s transfers (their channel ``paths``, padded with
    ``padding``, and ``latency``): one channel per orbit of channels they cross (``label``
    names a channel's orbit; few), then the padding's. ``steps``: ``_steps``' five arrays for
    the system's ``nodes`` nodes; ``node_ids``: every node's system node."""
    crossed = np.unique(label[paths])
    crossed = crossed[:-1] if crossed[-1] == padding else crossed
    channel_of = np.full(padding + 1, len(crossed))
    inside = np.isin(label, crossed)
    channel_of[inside] = np.searchsorted(crossed, label[inside])
    return _System(channel_of[paths], np.append(net.capacity[crossed], np.inf),
                   np.append(net.fan_in[crossed], 0.0), channel_of[net.node_channel[table["dst"]]], latency,
                   net.wire_bytes(table["src"], table["dst"], table["count"], itemsize), np.append(weight[crossed], 1.0),
                   *steps[:4], nodes, startup, table["round"], node_ids, channel_of, orbit, net.eager, steps[4])


def _channel_orbits(pairs, n, nodes, net):
    """The routes of ``pairs`` (source * nodes + destination) as padded channel paths with their
    latencies, each channel's orbit under the rotation (its least channel) and the rotated
    copies of block 0 that one crossing of it stands for (N / the orbit's size); None unless
    the rotation maps every route onto a route with the same latency, by a permutation of the
    channels that keeps their capacities and incast factors."""
    padding = net.padding
    k = np.arange(n)[:, None]
    rotated = [np.where(x < n, (x + k) % n, x) for x in (pairs // nodes, pairs % nodes)]
    paths, latency = _pair_routes(rotated[0].ravel(), rotated[1].ravel(), net)
    paths, latency = paths.reshape(n, len(pairs), -1), latency.reshape(n, len(pairs))
    image = np.roll(paths, -1, axis=0)                     # route of each pair rotated once more
    if (latency != latency[0]).any() or ((paths == padding) != (image == padding)).any():
        return None
    pi = np.arange(padding + 1)
    pi[paths.ravel()] = image.ravel()
    used = np.unique(paths)
    if ((pi[paths] != image).any() or len(np.unique(pi[used])) != len(used)
            or (net.capacity[pi[used]] != net.capacity[used]).any() or (net.fan_in[pi[used]] != net.fan_in[used]).any()):
        return None
    label, jump = np.arange(padding + 1), pi
    for _ in range(n.bit_length()):                        # pointer jumping: each orbit's least channel
        label, jump = np.minimum(label, label[jump]), jump[jump]
    weight = (n // np.bincount(label, minlength=padding + 1)[label]).astype(float)
    return paths[0], latency[0], label, weight
