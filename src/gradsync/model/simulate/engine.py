"""The simulator's event loop: flows share channels max-min fairly, and each node runs its
(node, round) steps in order, a step ending when its flows are delivered and its work is done.

The loop advances from one event time to the next, handling every event at that time at
once with numpy, so a ring of 1024 workers is a few thousand steps, not millions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .network import _max_min_rates

_TOL = 1e-12
MANY_FLOWS = 1 << 23          # flows beyond which their routes are not gathered (the table's own cost)


@dataclass(frozen=True, eq=False)
class _System:
    """What the event loop simulates: flows, their steps, and how to read the results back
    onto the schedule (``node_of``: schedule node -> system node; ``channel_of``: topology
    channel -> the system channel standing for it, the last one (padding) for channels no
    flow crosses; ``orbit``: transfer -> flow, None when they are the same)."""

    paths: np.ndarray
    capacity: np.ndarray
    fan_in: np.ndarray
    inbound: np.ndarray           # per flow: the receiver's copy channel (or the padding)
    latency: np.ndarray
    nbytes: np.ndarray
    weight: np.ndarray
    step_src: np.ndarray
    step_dst: np.ndarray
    step_node: np.ndarray
    work_time: np.ndarray
    nodes: int
    start_at: np.ndarray          # per system node: when its first round can start
    flow_round: np.ndarray
    node_of: np.ndarray
    channel_of: np.ndarray
    orbit: np.ndarray | None
    eager: bool = False           # sends are posted (NCCL): a flow starts when its sender posts it, and the
                                  # sender's step counts it done when its last byte has left
    step_track: np.ndarray | None = None   # per step, its track (a node's lane): steps run in order per track
    deps: tuple | None = None     # (steps, flows): a step also waits for the delivery of a flow of another track
                                  # whose data it sends on (NCCL's tree: its root turns the reduce into the broadcast)

    @property
    def track(self) -> np.ndarray:
        """Per step, the sequence it runs in: its track, or its node where there are no lanes."""
        return self.step_node if self.step_track is None else self.step_track


def _run(system: _System, progress=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The event loop: per flow its start, send end and delivery (the rows of one array); per node when
    it finished; per channel the time it carried a flow. ``progress(fraction delivered)`` every 4096 events."""
    paths, latency, nbytes, capacity = system.paths, system.latency, system.nbytes, system.capacity
    weight, inbound, step_src, step_dst = system.weight, system.inbound, system.step_src, system.step_dst
    fan_in = system.fan_in if system.fan_in.any() else None
    index = _step_index(system)
    seen, need, times, node_done, busy = _buffers(system)
    start, sent, done = times
    steps = _Steps(system, index, seen, node_done, *_first_steps(system))
    routes = _Routes(system)
    active = flying = np.empty(0, np.int64)
    remaining = flying_at = rate = np.empty(0)
    now, changed, events = 0.0, False, 0
    while len(active) or len(flying) or len(steps.pending):
        if progress is not None and (events := events + 1) % 4096 == 0:
            progress(np.count_nonzero(done == done) / max(len(paths), 1))     # delivered: not NaN
        # Next event: a flow's last byte leaves, a flow is delivered, or a step becomes ready.
        with np.errstate(divide="ignore"):
            drain_at = now + (remaining / rate if len(active) else np.empty(0))
        nxt = min([a.min() for a in (drain_at, flying_at, steps.pending_at) if len(a)])
        if len(active):
            busy[paths[active]] += nxt - now          # once per channel, however many flows cross it
            remaining = remaining - rate * (nxt - now)
        now = nxt
        busy[-1] = 0
        # 1. flows whose bytes have all left start their latency (and, posted, end their sender's part)
        if len(active):
            out = (drain_at <= now * (1 + 1e-12)) | (remaining <= _TOL * nbytes[active])
            if out.any():
                ids = active[out]
                sent[ids] = now
                flying, flying_at = np.concatenate([flying, ids]), np.concatenate([flying_at, now + latency[ids]])
                active, remaining, changed = active[~out], remaining[~out], True
                if system.eager:
                    steps.complete(step_src[ids], now)
        # 2. delivered flows complete their steps
        arrived = flying_at <= now * (1 + 1e-15) + 1e-18
        if arrived.any():
            ids = flying[arrived]
            flying, flying_at = flying[~arrived], flying_at[~arrived]
            done[ids] = now
            steps.complete(step_dst[ids] if system.eager else np.concatenate([step_src[ids], step_dst[ids]]), now)
            steps.release(ids, now)
        # 3. ready steps post their transfers; transfers with both ends ready (posted: the sender) start
        starting = steps.post(now, need)
        if len(starting):
            start[starting], changed = now, True
            active, remaining = np.concatenate([active, starting]), np.concatenate([remaining, nbytes[starting]])
        if changed:             # the same flows keep the same rates: computed again only when the set changes
            rate, changed = routes.rates(active, capacity, weight, fan_in), False
    return times, node_done, busy


class _Routes:
    """The flows' distinct routes (channels and receiving copy channel): flows on one route get
    one rate, so the fair rates are filled per route, each standing for its flows in flight."""

    def __init__(self, system):
        self.paths, self.inbound = system.paths, system.inbound
        self.route = None
        if len(system.paths) <= MANY_FLOWS:
            keyed = np.concatenate([system.paths, system.inbound[:, None]], axis=1)
            rows, route = np.unique(keyed, axis=0, return_inverse=True)
            if len(rows) < len(keyed):
                self.route, self.route_paths, self.route_inbound = route.reshape(-1), rows[:, :-1], rows[:, -1]

    def rates(self, active, capacity, weight, fan_in) -> np.ndarray:
        if self.route is None:
            return _max_min_rates(self.paths[active], capacity, weight, self.inbound[active], fan_in)
        used, inverse, count = np.unique(self.route[active], return_inverse=True, return_counts=True)
        rate = _max_min_rates(self.route_paths[used], capacity, weight, self.route_inbound[used], fan_in,
                              count.astype(float))
        return rate[inverse.reshape(-1)]


class _Steps:
    """The (node, round) steps as the loop drives them: those pending (ready at a time), how many
    flows each still waits for, and (posted sends) whether it has been posted."""

    def __init__(self, system, index, seen, node_done, pending, pending_at):
        self.is_last, self.by_step, self.by_step_start, self.left, self.sending = index
        self.system, self.seen, self.node_done = system, seen, node_done
        self.pending, self.pending_at = pending, pending_at
        self.posted = np.zeros(len(system.step_node), bool) if system.eager else None
        self.held = None
        if system.deps is not None:               # steps waiting for another track's flows
            dep_step, dep_flow = system.deps
            self.dep_left = np.bincount(dep_step, minlength=len(system.step_node))
            order = np.argsort(dep_flow, kind="stable")
            self.dep_step, self.dep_flow = dep_step[order], dep_flow[order]
            self.held = np.full(len(system.step_node), np.nan)     # ready at this time, once released
            self.pending, self.pending_at = self._hold(self.pending, self.pending_at)

    def _hold(self, ids, at):
        """Of steps ready at ``at``, keep those still waiting for other tracks' flows aside."""
        if self.held is None:
            return ids, at
        waiting = self.dep_left[ids] > 0
        self.held[ids[waiting]] = at[waiting]
        return ids[~waiting], at[~waiting]

    def _advance(self, finished, now):
        before = len(self.pending)
        self.pending, self.pending_at = _advance(finished, now, self.system.work_time, self.is_last,
                                                 self.system.step_node, self.node_done, self.pending, self.pending_at)
        if self.held is not None and len(self.pending) > before:
            new, at = self._hold(self.pending[before:], self.pending_at[before:])
            self.pending = np.concatenate([self.pending[:before], new])
            self.pending_at = np.concatenate([self.pending_at[:before], at])

    def release(self, delivered, now) -> None:
        """Flows ``delivered`` at ``now``: the steps that waited for them (and for nothing more) are ready."""
        if self.held is None:
            return
        lo = np.searchsorted(self.dep_flow, delivered, "left")
        hi = np.searchsorted(self.dep_flow, delivered, "right")
        waiting = self.dep_step[_ranges(lo, hi)]
        if not len(waiting):
            return
        np.subtract.at(self.dep_left, waiting, 1)
        free = _distinct(waiting[(self.dep_left[waiting] == 0) & ~np.isnan(self.held[waiting])], self.seen)
        self.pending = np.concatenate([self.pending, free])
        self.pending_at = np.concatenate([self.pending_at, np.maximum(self.held[free], now)])
        self.held[free] = np.nan

    def complete(self, touched, now) -> None:
        """One flow fewer for each step in ``touched``; those left with none (and posted) are done."""
        np.subtract.at(self.left, touched, 1)
        finished = touched[self.left[touched] == 0]
        if self.posted is not None:
            finished = finished[self.posted[finished]]
        self._advance(_distinct(finished, self.seen), now)

    def post(self, now, need) -> np.ndarray:
        """Steps ready at ``now`` post their flows; the flows whose ends have all posted, to start."""
        ready = self.pending_at <= now * (1 + 1e-15) + 1e-18
        if not ready.any():
            return np.empty(0, np.int64)
        ids = self.pending[ready]
        self.pending, self.pending_at = self.pending[~ready], self.pending_at[~ready]
        if self.posted is not None:
            self.posted[ids] = True
        idle = ids[self.left[ids] == 0]           # a step with compute only (or, posted, all its flows in)
        if len(idle):
            self._advance(idle, now)
        entries = _ranges(self.by_step_start[ids], self.by_step_start[ids + 1])
        posted = self.by_step[entries]
        if self.posted is not None:               # a flow starts when its sender posts it
            posted = posted[self.sending[entries]]
        np.subtract.at(need, posted, 1)
        return _distinct(posted[need[posted] == 0], self.seen)


def _buffers(system: _System):
    """The loop's scratch of ``_distinct``; per flow, its ends yet to post it; the flows' times
    (unknown yet); per node its finish; per channel its busy time."""
    n_fl = len(system.paths)
    return (np.empty(max(len(system.step_node), n_fl), np.int64), np.full(n_fl, 1 if system.eager else 2),
            np.full((3, n_fl), np.nan),
            np.zeros(system.nodes), np.zeros(len(system.capacity)))


def _step_index(system: _System) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What the loop looks up per step: whether it is its node's last; its flows (sent and
    received), step k's being ``by_step[by_step_start[k]:by_step_start[k + 1]]``; how many of
    them are yet to be delivered (all, at the start: the loop counts them down); and which
    entries of ``by_step`` are the step sending the flow (a symmetric quotient's step can both
    send and receive one flow)."""
    n_fl, n_steps = len(system.paths), len(system.step_node)
    track = system.track
    is_last = np.append(track[1:] != track[:-1], True)
    ends = np.concatenate([system.step_src, system.step_dst])
    order = np.argsort(ends)
    by_step = order % max(n_fl, 1)                # a step's flows, in any order: nothing adds over them
    left = np.bincount(ends, minlength=n_steps)
    by_step_start = np.concatenate([[0], np.cumsum(left)])
    return is_last, by_step, by_step_start, left, order < n_fl     # the last: which entries are the flow's sender


def _first_steps(system: _System) -> tuple[np.ndarray, np.ndarray]:
    """Each node's first step, and when it is ready: at ``start_at`` of its node."""
    first = np.flatnonzero(np.diff(system.track, prepend=-1))   # empty for an empty schedule
    return first, system.start_at[system.step_node[first]].astype(float)


def _distinct(ids, scratch):
    """The distinct values of ``ids`` (any order), with ``scratch`` at least max(ids) + 1 long."""
    if len(ids) < 2:
        return ids
    where = np.arange(len(ids))
    scratch[ids] = where                       # the last occurrence of each value wins
    return ids[scratch[ids] == where]


def _ranges(lo, hi):
    """The concatenated ranges lo[i]..hi[i] - 1: ``_ranges([0, 5], [2, 7])`` is [0, 1, 5, 6]."""
    lengths = hi - lo
    total = int(lengths.sum())
    if not total:
        return np.empty(0, np.int64)
    offsets = np.repeat(lo - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return offsets + np.arange(total)


def _advance(finished, now, work_time, is_last, step_node, node_done, pending, pending_at):
    """Steps done at ``now``: their node's next step becomes ready after the step's compute."""
    end = now + work_time[finished]
    last = is_last[finished]
    np.maximum.at(node_done, step_node[finished[last]], end[last])      # a node is done when its last track is
    return (np.concatenate([pending, finished[~last] + 1]),
            np.concatenate([pending_at, end[~last]]))
