"""The event loop for small systems, in plain Python floats: one compact block has a few nodes
and a handful of flows in flight, where numpy's cost per call dominates the numpy loop.

The arithmetic is ``engine._run``'s, operation for operation (IEEE doubles either way): the
same event times, the same progressive filling, the same tolerances, so the two loops give
the same times bit for bit (tests/test_compact.py runs both on every preset and algorithm).
Only the order in which flows are kept differs, which no sum depends on.
"""

from __future__ import annotations

import math

import numpy as np

from .engine import _TOL, _first_steps, _step_index

SMALL_NODES, SMALL_STEPS, SMALL_ROUNDS = 32, 64, 256   # at most: nodes, flows per step, flows per round
CACHED_RATES = 1 << 16                # sets of routes in flight whose fair rates are kept


def small(system) -> bool:
    """Whether ``system`` is small enough for this loop: few nodes, few flows per step and per
    round (flows in flight at once: the Python max-min filling is per flow)."""
    ends = np.bincount(np.concatenate([system.step_src, system.step_dst]), minlength=1)
    per_round = np.bincount(system.flow_round, minlength=1)
    return system.nodes <= SMALL_NODES and int(ends.max()) <= SMALL_STEPS and int(per_round.max()) <= SMALL_ROUNDS


class _Flows:
    """The system as Python lists: each flow's channels (padding dropped, repeats kept), its
    bytes, latency and receiving copy channel; the channels' capacities, weights, incast. Flows
    with the same route (channels and receiving channel) get the same fair rate, so the rates
    of a set of routes in flight are computed once and kept (a ring's block repeats a few)."""

    def __init__(self, system):
        padding = len(system.capacity) - 1
        keyed = np.concatenate([system.paths, system.inbound[:, None]], axis=1)
        rows, route = np.unique(keyed, axis=0, return_inverse=True) if len(keyed) else (keyed, np.empty(0, int))
        by_route = [[c for c in row[:-1] if c != padding] for row in rows.tolist()]
        self.route = route.reshape(-1).tolist()
        self.channels = [by_route[r] for r in self.route]      # shared lists: a block has few routes
        self.nbytes, self.latency = system.nbytes.tolist(), system.latency.tolist()
        self.inbound = system.inbound.tolist()
        self.capacity, self.weight = system.capacity.tolist(), system.weight.tolist()
        self.fan_in = system.fan_in.tolist() if system.fan_in.any() else None
        self.cache = {}

    def rates(self, active) -> dict:
        """Max-min fair rates of the ``active`` flows (by their set of routes, computed once)."""
        key = tuple(sorted(self.route[f] for f in active))
        by_route = self.cache.get(key)
        if by_route is None:
            if len(self.cache) >= CACHED_RATES:
                self.cache.clear()
            rate = self._fill(active)
            by_route = self.cache[key] = {self.route[f]: r for f, r in rate.items()}
        return {f: by_route[self.route[f]] for f in active}

    def _fill(self, active) -> dict:
        """Max-min fair rates of the ``active`` flows, as ``network._max_min_rates`` fills them."""
        capacity = self.capacity
        if self.fan_in is not None:
            k = {}
            for f in active:
                k[self.inbound[f]] = k.get(self.inbound[f], 0) + 1
            capacity = list(capacity)
            for c, count in k.items():
                capacity[c] = capacity[c] / (1 + self.fan_in[c] * max(count * self.weight[c] - 1, 0))
        rate = {f: (0.0 if self.channels[f] else math.inf) for f in active}
        live = [f for f in active if self.channels[f]]
        remaining = {c: capacity[c] for f in live for c in self.channels[f]}
        while live:
            count = {}
            for f in live:
                for c in self.channels[f]:
                    count[c] = count.get(c, 0) + 1
            load = {c: k * self.weight[c] for c, k in count.items()}
            step = min(remaining[c] / load[c] for c in load)
            for f in live:
                rate[f] += step
            full = set()
            for c, x in load.items():
                remaining[c] -= step * x
                if remaining[c] <= 1e-9 * capacity[c]:
                    full.add(c)
            live = [f for f in live if not any(c in full for c in self.channels[f])]
        return rate


def _run_scalar(system, progress=None):
    """``engine._run`` for a small system: the same results, from Python floats."""
    flows = _Flows(system)
    is_last, by_step, by_step_start, left, sending = (x.tolist() for x in _step_index(system))
    step_src, step_dst = system.step_src.tolist(), system.step_dst.tolist()
    step_node, work_time = system.step_node.tolist(), system.work_time.tolist()
    n_fl = len(flows.nbytes)
    need, times = [1 if system.eager else 2] * n_fl, np.full((3, n_fl), np.nan)
    start, sent, done = ([math.nan] * n_fl for _ in range(3))
    node_done, busy = [0.0] * system.nodes, [0.0] * len(flows.capacity)
    first, first_at = _first_steps(system)
    pending = _Pending(system) if system.deps is not None else {}
    for s, at in zip(first.tolist(), first_at.tolist()):
        pending[s] = at
    state = {"now": 0.0, "remaining": {}, "rate": {}, "flying": {}, "delivered": 0, "events": 0,
             "posted": [False] * len(step_node) if system.eager else None}
    loop = (flows, need, start, sent, done, busy, pending, state)
    steps = (is_last, by_step, by_step_start, left, step_src, step_dst, step_node, work_time, node_done, sending)
    while state["remaining"] or state["flying"] or pending:
        _event(loop, steps)
        state["events"] += 1
        if progress is not None and state["events"] % 4096 == 0:
            progress(state["delivered"] / max(n_fl, 1))
    times[0], times[1], times[2] = start, sent, done
    busy[-1] = 0.0
    return times, np.array(node_done), np.array(busy)


def _event(loop, steps):
    """One pass of the loop: advance to the next event, then the same three stages as ``_run``."""
    flows, need, start, sent, done, busy, pending, state = loop
    is_last, by_step, by_step_start, left, step_src, step_dst, step_node, work_time, node_done, sending = steps
    now, remaining, rate, flying = state["now"], state["remaining"], state["rate"], state["flying"]
    drain_at = {f: now + (r / rate[f] if rate[f] else math.inf) for f, r in remaining.items()}
    nxt = min(min(d.values()) for d in (drain_at, flying, pending) if d)
    if remaining:
        dt = nxt - now
        for c in {c for f in remaining for c in flows.channels[f]}:
            busy[c] += dt
        for f, r in remaining.items():
            remaining[f] = r - rate[f] * dt
    now = state["now"] = nxt
    soon, nbytes, changed = now * (1 + 1e-12), flows.nbytes, False
    posted, waits = state["posted"], isinstance(pending, _Pending)

    def complete(s):                                # one flow fewer for step s; done when none is left
        left[s] -= 1
        if left[s] == 0 and (posted is None or posted[s]):
            _advance(s, now, pending, is_last, step_node, work_time, node_done)
    for f in [f for f, d in drain_at.items() if d <= soon or remaining[f] <= _TOL * nbytes[f]]:
        sent[f] = now                               # 1. the last byte left: the latency starts
        flying[f] = now + flows.latency[f]
        del remaining[f]
        changed = True
        if posted is not None:                      # posted sends: the sender's part is done
            complete(step_src[f])
    soon = now * (1 + 1e-15) + 1e-18
    arrived = [f for f, at in flying.items() if at <= soon]
    for f in arrived:                               # 2. delivered flows complete their steps
        del flying[f]
        done[f] = now
        for s in ((step_dst[f],) if posted is not None else (step_src[f], step_dst[f])):
            complete(s)
        if waits:
            pending.release(f, now)
    state["delivered"] += len(arrived)
    ready = [s for s, at in pending.items() if at <= soon]
    for s in ready:
        del pending[s]
        if posted is not None:
            posted[s] = True
    for s in ready:
        if left[s] == 0:                            # compute-only steps
            _advance(s, now, pending, is_last, step_node, work_time, node_done)
    for s in ready:                                 # 3. ready steps post; flows with both ends start
        for e in range(by_step_start[s], by_step_start[s + 1]):
            f = by_step[e]
            if posted is not None and not sending[e]:
                continue                            # posted sends: the sender alone starts a flow
            need[f] -= 1
            if need[f] == 0:
                start[f] = now
                remaining[f] = nbytes[f]
                changed = True
    if changed:
        state["rate"] = flows.rates(list(remaining))


class _Pending(dict):
    """Steps ready to post, by step: when each is ready. A step that also waits for flows of
    other tracks (``_System.deps``) is held until the last of them is delivered."""

    def __init__(self, system):
        super().__init__()
        self.dep_left, self.held, self.waiters = None, {}, {}
        if system.deps is not None:
            dep_step, dep_flow = system.deps
            self.dep_left = np.bincount(dep_step, minlength=len(system.step_node)).tolist()
            for step, flow in zip(dep_step.tolist(), dep_flow.tolist()):
                self.waiters.setdefault(flow, []).append(step)

    def __setitem__(self, step, at):
        if self.dep_left is not None and self.dep_left[step] > 0:
            self.held[step] = at
        else:
            super().__setitem__(step, at)

    def release(self, flow, now) -> None:
        """Flow ``flow`` delivered at ``now``: the steps that waited for it alone become ready."""
        for step in self.waiters.get(flow, ()):
            self.dep_left[step] -= 1
            if self.dep_left[step] == 0 and step in self.held:
                super().__setitem__(step, max(self.held.pop(step), now))


def _advance(s, now, pending, is_last, step_node, work_time, node_done):
    """Step ``s`` done at ``now``: the node's next step is ready after this one's work."""
    end = now + work_time[s]
    if is_last[s]:
        node_done[step_node[s]] = max(node_done[step_node[s]], end)
    else:
        pending[s + 1] = end
