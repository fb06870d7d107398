"""Flow-level discrete-event network simulator for schedules on topologies.

Model:
- A transfer is a flow along its route. Flows crossing a directed channel share its
  bandwidth max-min fairly (progressive filling); a flow is delivered one route latency
  after its last byte leaves.
- A node's rounds are sequential: it starts round r when all of its transfers (in and out)
  of its previous round are delivered and its work for that round is done: each element it
  received to add in (REDUCE, or CODED: a packet is combined with one add) at the node's
  ``reduce_rate``, and the round's compute multiply-adds at its ``madd_rate`` (free where the
  topology sets none). A transfer starts when both ends have started its round (receives are
  posted). There is no global barrier.

The loop advances from one event time to the next, handling every event at that time at
once with numpy, so a ring of 1024 workers is a few thousand steps, not millions.

>>> from gradsync.algorithms import central
>>> from gradsync.topology import preset
>>> round(simulate(central.schedule(4, 40_000_000), preset("pcie-switch-4")).time, 4)
0.06
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import ConfigError
from .schedule import COPY, Schedule
from .topology import Topology

_TOL = 1e-12


@dataclass(frozen=True, eq=False)
class SimResult:
    """What a simulation measured. Times in seconds, sizes in bytes."""

    schedule: Schedule
    topology: Topology
    itemsize: int
    time: float                   # when the last node finished
    start: np.ndarray             # per transfer: when it started
    sent: np.ndarray              # per transfer: when its last byte left
    done: np.ndarray              # per transfer: when it was delivered
    node_done: np.ndarray         # per schedule node: when it finished
    channel_bytes: np.ndarray     # per directed channel
    channel_busy: np.ndarray      # per directed channel: time with at least one flow on it
    placement: np.ndarray         # schedule node -> topology node index

    @property
    def round_end(self) -> np.ndarray:
        """When the last transfer of each round was delivered."""
        out = np.zeros(self.schedule.rounds)
        np.maximum.at(out, self.schedule.transfers["round"], self.done)
        return out

    def busiest_channel(self) -> tuple[str, float]:
        """The busiest directed channel, as 'a->b', and the bytes it carried ('-' if none carried any)."""
        if not self.channel_bytes.any():
            return "-", 0.0
        c = int(np.argmax(self.channel_bytes))
        return self.channel_name(c), float(self.channel_bytes[c])

    def channel_name(self, c: int) -> str:
        link = self.topology.links[c // 2]
        return f"{link.a}->{link.b}" if c % 2 == 0 else f"{link.b}->{link.a}"

    def to_dict(self, timeline: bool = True) -> dict:
        """JSON-ready result; with ``timeline`` every transfer's start, send end and delivery."""
        s, names = self.schedule, [n.name for n in self.topology.nodes]
        nbytes = s.elements * self.itemsize
        out = {
            "algorithm": s.algorithm, "topology": self.topology.name, "workers": s.workers,
            "bytes": nbytes, "itemsize": self.itemsize, "time_s": self.time,
            "rounds": s.rounds, "round_end_s": self.round_end.tolist(),
            "placement": [names[i] for i in self.placement],
            "links": [{"channel": self.channel_name(c), "bytes": float(self.channel_bytes[c]),
                       "busy_s": float(self.channel_busy[c])}
                      for c in np.flatnonzero(self.channel_bytes)],
        }
        if timeline:
            t = s.transfers
            out["timeline"] = {"round": t["round"].tolist(), "src": t["src"].tolist(),
                               "dst": t["dst"].tolist(), "offset": t["offset"].tolist(),
                               "count": t["count"].tolist(), "op": t["op"].tolist(),
                               "start": self.start.tolist(), "sent": self.sent.tolist(),
                               "done": self.done.tolist()}
        return out


def _placement(schedule: Schedule, topology: Topology) -> np.ndarray:
    if schedule.workers > len(topology.workers):
        raise ConfigError(f"topology {topology.name!r} has {len(topology.workers)} worker devices; "
                          f"the schedule needs {schedule.workers}")
    names = list(topology.workers[:schedule.workers])
    for helper in schedule.helpers:
        if helper == "host":
            if topology.host is None:
                raise ConfigError(f"algorithm {schedule.algorithm!r} needs a host node; "
                                  f"topology {topology.name!r} has none")
            names.append(topology.host)
        else:
            raise ConfigError(f"no placement for helper node {helper!r}")
    return np.array([topology.index[n] for n in names], dtype=np.int64)


def _routes(schedule: Schedule, topology: Topology, placement: np.ndarray):
    """Padded channel paths (T, K) and latencies (T,) of every transfer; pad = dummy channel."""
    t = schedule.transfers
    n_channels = 2 * len(topology.links)
    pair = t["src"].astype(np.int64) * schedule.nodes + t["dst"]
    unique, inverse = np.unique(pair, return_inverse=True)
    names = [topology.nodes[i].name for i in placement]
    routes = [topology.route(names[p // schedule.nodes], names[p % schedule.nodes]) for p in unique.tolist()]
    hops = max([len(r[0]) for r in routes], default=1) or 1
    paths = np.full((len(unique), hops), n_channels, dtype=np.int64)
    for i, (channels, _) in enumerate(routes):
        paths[i, :len(channels)] = channels
    latency = np.array([r[1] for r in routes], dtype=float)
    return paths[inverse], latency[inverse]


def _max_min_rates(paths: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates of flows along ``paths`` (progressive filling), vectorized."""
    rate = np.zeros(len(paths))
    remaining = capacity.copy()
    live = np.ones(len(paths), dtype=bool)
    unbounded = (paths == len(capacity) - 1).all(axis=1)   # no channel at all (same device)
    rate[unbounded], live[unbounded] = np.inf, False
    while live.any():
        load = np.bincount(paths[live].ravel(), minlength=len(capacity))
        load[-1] = 0
        used = load > 0
        step = (remaining[used] / load[used]).min()
        rate[live] += step
        remaining[used] -= step * load[used]
        full = np.zeros(len(capacity), dtype=bool)
        full[used] = remaining[used] <= 1e-9 * capacity[used]
        live &= ~full[paths].any(axis=1)
    return rate


def simulate(schedule: Schedule, topology: Topology, itemsize: int = 4) -> SimResult:
    """Time ``schedule`` on ``topology`` with elements of ``itemsize`` bytes.

    Worker w runs on ``topology.workers[w]``; the helper 'host' on ``topology.host``. A
    schedule that moves nothing (one worker, or zero elements) takes no time:

    >>> from gradsync.algorithms import ring
    >>> from gradsync.topology import preset
    >>> simulate(ring.schedule(1, 100), preset("ethernet", 1)).time
    0.0
    """
    if isinstance(itemsize, bool) or not isinstance(itemsize, int) or itemsize < 1:
        raise ConfigError(f"itemsize must be a positive integer number of bytes, got {itemsize!r}")
    placement = _placement(schedule, topology)
    t = schedule.transfers
    n_tr, n_channels = len(t), 2 * len(topology.links)
    capacity = np.append(topology.channel_capacity, np.inf)
    paths, latency = _routes(schedule, topology, placement)
    nbytes = t["count"].astype(float) * itemsize

    # Steps: the (node, round) pairs where a node does anything, in order per node.
    rounds = max(schedule.rounds, 1)
    c = schedule.compute
    keys = np.concatenate([t["src"].astype(np.int64) * rounds + t["round"],
                           t["dst"].astype(np.int64) * rounds + t["round"],
                           c["node"].astype(np.int64) * rounds + c["round"]])
    steps, key_step = np.unique(keys, return_inverse=True)
    step_src, step_dst = key_step[:n_tr], key_step[n_tr:2 * n_tr]
    step_node = steps // rounds
    n_steps = len(steps)
    names = [topology.nodes[p].name for p in placement]
    add_rate = np.array([topology.reduce_rate(n) or np.inf for n in names])
    madd_rate = np.array([topology.madd_rate(n) or np.inf for n in names])
    adds = np.bincount(step_dst, weights=np.where(t["op"] != COPY, t["count"], 0), minlength=n_steps)
    madds = np.bincount(key_step[2 * n_tr:], weights=c["madds"], minlength=n_steps)
    work_time = adds / add_rate[step_node] + madds / madd_rate[step_node]
    left = np.bincount(np.concatenate([step_src, step_dst]), minlength=n_steps)
    is_last = np.append(step_node[1:] != step_node[:-1], True)
    by_step = np.argsort(np.concatenate([step_src, step_dst]), kind="stable") % max(n_tr, 1)
    by_step_start = np.searchsorted(np.sort(np.concatenate([step_src, step_dst])), np.arange(n_steps + 1))

    need = np.full(n_tr, 2)
    start, sent, done = (np.full(n_tr, np.nan) for _ in range(3))
    node_done = np.zeros(schedule.nodes)
    busy = np.zeros(n_channels + 1)
    first_steps = np.flatnonzero(np.diff(step_node, prepend=-1))   # empty for an empty schedule
    pending, pending_at = first_steps, np.zeros(len(first_steps))
    active, remaining = np.empty(0, np.int64), np.empty(0)
    flying, flying_at = np.empty(0, np.int64), np.empty(0)
    rate, now = np.empty(0), 0.0

    while len(active) or len(flying) or len(pending):
        # Next event: a flow's last byte leaves, a flow is delivered, or a step becomes ready.
        with np.errstate(divide="ignore"):
            drain = remaining / rate if len(active) else np.empty(0)
        drain_at = now + drain
        nxt = min([a.min() for a in (drain_at, flying_at, pending_at) if len(a)])
        if len(active):
            busy[np.unique(paths[active])] += nxt - now
            remaining = remaining - rate * (nxt - now)
        now = nxt
        busy[-1] = 0
        # 1. flows whose bytes have all left start their latency
        if len(active):
            out = (drain_at <= now * (1 + 1e-12)) | (remaining <= _TOL * nbytes[active])
            if out.any():
                ids = active[out]
                sent[ids] = now
                flying = np.concatenate([flying, ids])
                flying_at = np.concatenate([flying_at, now + latency[ids]])
                active, remaining = active[~out], remaining[~out]
        # 2. delivered flows complete their steps
        arrived = flying_at <= now * (1 + 1e-15) + 1e-18
        if arrived.any():
            ids = flying[arrived]
            flying, flying_at = flying[~arrived], flying_at[~arrived]
            done[ids] = now
            touched = np.concatenate([step_src[ids], step_dst[ids]])
            np.subtract.at(left, touched, 1)
            finished = np.unique(touched[left[touched] == 0])
            pending, pending_at = _advance(finished, now, work_time, is_last, step_node,
                                           node_done, pending, pending_at)
        # 3. ready steps post their transfers; transfers with both ends ready start
        ready = pending_at <= now * (1 + 1e-15) + 1e-18
        if ready.any():
            ids = pending[ready]
            pending, pending_at = pending[~ready], pending_at[~ready]
            idle = ids[left[ids] == 0]           # a step with compute only
            if len(idle):
                pending, pending_at = _advance(idle, now, work_time, is_last, step_node,
                                               node_done, pending, pending_at)
            spans = [by_step[by_step_start[s]:by_step_start[s + 1]] for s in ids.tolist()]
            posted = np.concatenate(spans) if spans else np.empty(0, np.int64)
            np.subtract.at(need, posted, 1)
            starting = np.unique(posted[need[posted] == 0])
            if len(starting):
                start[starting] = now
                active = np.concatenate([active, starting])
                remaining = np.concatenate([remaining, nbytes[starting]])
        rate = _max_min_rates(paths[active], capacity) if len(active) else np.empty(0)

    channel_bytes = np.bincount(paths.ravel(), weights=np.repeat(nbytes, paths.shape[1]),
                                minlength=n_channels + 1)[:n_channels] if n_tr else np.zeros(n_channels)
    return SimResult(schedule, topology, itemsize, float(node_done.max(initial=0.0)), start, sent, done,
                     node_done, channel_bytes, busy[:n_channels], placement)


def _advance(finished, now, work_time, is_last, step_node, node_done, pending, pending_at):
    """Steps done at ``now``: their node's next step becomes ready after the step's compute."""
    end = now + work_time[finished]
    last = is_last[finished]
    node_done[step_node[finished[last]]] = end[last]
    return (np.concatenate([pending, finished[~last] + 1]),
            np.concatenate([pending_at, end[~last]]))
