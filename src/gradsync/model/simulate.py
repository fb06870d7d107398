"""Flow-level discrete-event network simulator for schedules on topologies.

Model:
- A transfer is a flow along its route. Flows crossing a directed channel share its
  bandwidth max-min fairly (progressive filling); a flow is delivered one route latency
  after its last byte leaves.
- A node's rounds are sequential: it starts round r when all of its transfers (in and out)
  of its previous round are delivered and its work for that round is done: each element it
  received to add in (REDUCE, or CODED: a packet is combined with one add) at the node's
  ``reduce_rate``, and the round's compute multiply-adds at its ``madd_rate`` (free where the
  topology sets none), plus its ``message_overhead`` per message and its ``round_overhead``.
  Its first round starts after its ``collective_overhead``. Nodes behind one machine (a node
  with ``cores``) computing in the same round share its cores. A transfer starts when both
  ends have started its round (receives are posted). There is no global barrier.

The loop advances from one event time to the next, handling every event at that time at
once with numpy, so a ring of 1024 workers is a few thousand steps, not millions.

>>> from gradsync.algorithms import central
>>> from gradsync.model.topology import preset
>>> round(simulate(central.schedule(4, 40_000_000), preset("pcie-switch-4")).time, 4)
0.06
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import ConfigError
from ..core.schedule import COPY, Schedule
from .topology import Topology

_TOL = 1e-12
TIMELINE_FORMAT = "gradsync.timeline/1"
TIME_COLUMNS = ("start", "sent", "done")


@dataclass(frozen=True, eq=False)
class SimResult:
    """What a simulation measured. Times in seconds, sizes in bytes."""

    schedule: Schedule
    topology: Topology
    itemsize: int
    time: float                   # when the last node finished
    node_done: np.ndarray         # per schedule node: when it finished
    channel_bytes: np.ndarray     # per directed channel
    channel_busy: np.ndarray      # per directed channel: time with at least one flow on it
    placement: np.ndarray         # schedule node -> topology node index
    flow_times: np.ndarray        # (3, flows): start, send end and delivery of each simulated flow
    flow_round: np.ndarray        # per flow: its round
    orbit: np.ndarray | None = None   # per transfer: the flow timed for it (None: transfer i is flow i)

    @cached_property
    def start(self) -> np.ndarray:
        """Per transfer: when it started."""
        return self._per_transfer(0)

    @cached_property
    def sent(self) -> np.ndarray:
        """Per transfer: when its last byte left."""
        return self._per_transfer(1)

    @cached_property
    def done(self) -> np.ndarray:
        """Per transfer: when it was delivered."""
        return self._per_transfer(2)

    def _per_transfer(self, row: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
        times = self.flow_times[row]
        return times[lo:hi].copy() if self.orbit is None else times[self.orbit[lo:hi]]

    @property
    def round_end(self) -> np.ndarray:
        """When the last transfer of each round was delivered."""
        out = np.zeros(self.schedule.rounds)
        np.maximum.at(out, self.flow_round, self.flow_times[2])
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


    def save(self, path) -> None:
        """Write the result with its timeline to ``path``: ``.npz`` for numpy's columnar format
        (a column per transfer field and per time, written one column at a time: compact and
        fast for millions of transfers; a symmetric run stores each distinct timing once and
        per transfer the index of its timing; read it with ``load_timeline``), ``.json`` for
        ``to_dict()`` (small runs). Example: ``simulate(s, topo).save("ring.npz")``."""
        path = str(path)
        if path.endswith(".json"):
            with open(path, "w") as fh:
                json.dump(self.to_dict(timeline=True), fh)
            return
        if not path.endswith(".npz"):
            raise ConfigError(f"a timeline is written as .npz or .json, got {path!r}")
        t = self.schedule.transfers
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            def put(name, array):
                with zf.open(name + ".npy", "w", force_zip64=True) as fh:
                    np.lib.format.write_array(fh, np.asarray(array), allow_pickle=False)
            put("summary", np.array(json.dumps({"format": TIMELINE_FORMAT, **self.to_dict(timeline=False)})))
            for name in t.dtype.names:
                put(name, t[name])
            if self.orbit is None:
                for row, name in enumerate(TIME_COLUMNS):
                    put(name, self.flow_times[row])
            else:                  # a symmetric run: each distinct timing once, and which one each transfer has
                put("orbit", self.orbit)
                for row, name in enumerate(TIME_COLUMNS):
                    put("flow_" + name, self.flow_times[row])


def load_timeline(path) -> dict:
    """Read a timeline written by ``SimResult.save``: the summary (``to_dict(timeline=False)``)
    with a ``timeline`` of numpy columns (round, src, dst, offset, count, op, start, sent,
    done), from ``.npz`` or ``.json``. ``load_timeline("ring.npz")["timeline"]["done"].max()``
    is the simulated time."""
    path = str(path)
    try:
        if path.endswith(".json"):
            with open(path) as fh:
                data = json.load(fh)
            data["timeline"] = {k: np.asarray(v) for k, v in data["timeline"].items()}
            return data
        with np.load(path, allow_pickle=False) as z:
            data = json.loads(str(z["summary"]))
            if data.pop("format", None) != TIMELINE_FORMAT:
                raise ConfigError(f"{path}: not a gradsync timeline")
            columns = {k: z[k] for k in z.files if k != "summary"}
            if "orbit" in columns:
                orbit = columns.pop("orbit")
                columns.update({name: columns.pop("flow_" + name)[orbit] for name in TIME_COLUMNS})
            data["timeline"] = columns
            return data
    except ConfigError:
        raise
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"cannot read timeline {path!r}: {exc}") from None


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


_PAIR_LIMIT = 1 << 20     # routes computed to prove a schedule's symmetry on the topology


def simulate(schedule: Schedule, topology: Topology, itemsize: int = 4, symmetry: bool = True) -> SimResult:
    """Time ``schedule`` on ``topology`` with elements of ``itemsize`` bytes.

    Worker w runs on ``topology.workers[w]``; the helper 'host' on ``topology.host``. With
    ``symmetry``, a schedule that rotating the workers maps onto itself (a ring with equal
    chunks, sharded, host) on a topology that the rotation maps onto itself too (every worker
    on the same kind of link to one switch) is simulated on one worker's transfers: every
    rotated copy of a transfer would take the same arithmetic on the same numbers, so the
    times are identical to the full simulation's, bit for bit, at 1/N of the work. A schedule
    that moves nothing (one worker, or zero elements) takes no time:

    >>> from gradsync.algorithms import ring
    >>> from gradsync.model.topology import preset
    >>> simulate(ring.schedule(1, 100), preset("ethernet", 1)).time
    0.0
    """
    if isinstance(itemsize, bool) or not isinstance(itemsize, int) or itemsize < 1:
        raise ConfigError(f"itemsize must be a positive integer number of bytes, got {itemsize!r}")
    placement = _placement(schedule, topology)
    net = _Net.of(topology, placement)
    n_channels = 2 * len(topology.links)
    found = _cyclic(schedule) if symmetry else None
    system = _quotient(schedule, net, itemsize, *found) if found else None
    if system is None:
        system = _full(schedule, net, itemsize)
    start, sent, done, node_done, busy = _run(system.paths, system.latency, system.nbytes, system.capacity,
                                              system.weight, system.step_src, system.step_dst,
                                              system.step_node, system.work_time, system.nodes,
                                              system.start_at, system.inbound, system.fan_in)
    carried = np.bincount(system.paths.ravel(), weights=np.repeat(system.nbytes, system.paths.shape[1]),
                          minlength=len(system.capacity)) * system.weight
    carried[-1] = busy[-1] = 0.0                          # the padding channel
    node_done = node_done[system.node_of]
    return SimResult(schedule, topology, itemsize, float(node_done.max(initial=0.0)), node_done,
                     carried[system.channel_of][:n_channels], busy[system.channel_of][:n_channels], placement,
                     np.stack([start, sent, done]), system.flow_round, system.orbit)


@dataclass(frozen=True, eq=False)
class _Net:
    """The topology as the simulator reads it, for the schedule's nodes: channels (the links'
    directed channels, then one per node with a copy rate, then padding), their capacities
    and incast factors, and the nodes' rates and overheads."""

    topology: Topology
    names: list
    capacity: np.ndarray          # per channel, padding last (infinite)
    fan_in: np.ndarray            # per channel (0: none)
    node_channel: np.ndarray      # per schedule node: its copy channel, or the padding
    copy_channel: np.ndarray      # per topology node: the same (a switch with a copy rate: forwarding costs it)
    add_rate: np.ndarray          # per schedule node
    madd_rate: np.ndarray
    overhead: np.ndarray          # seconds per message
    startup: np.ndarray           # seconds before the first round
    per_round: np.ndarray         # seconds per round
    machine: np.ndarray           # per schedule node: the machine (a node with cores) its compute shares, or -1
    cores: np.ndarray             # per machine

    @property
    def padding(self) -> int:
        return len(self.capacity) - 1

    @classmethod
    def of(cls, topology: Topology, placement: np.ndarray) -> "_Net":
        names = [topology.nodes[p].name for p in placement]
        nodes = [topology.nodes[p] for p in placement]
        copying = [p for p, n in enumerate(topology.nodes) if n.copy_rate]
        n_links = 2 * len(topology.links)
        padding = n_links + len(copying)
        copy_channel = np.full(len(topology.nodes), padding, dtype=np.int64)
        copy_channel[copying] = n_links + np.arange(len(copying))
        capacity = np.concatenate([topology.channel_capacity, [topology.nodes[p].copy_rate for p in copying], [np.inf]])
        fan_in = np.concatenate([np.zeros(n_links), [topology.nodes[p].fan_in or 0.0 for p in copying], [0.0]])
        return cls(topology, names, capacity.astype(float), fan_in, copy_channel[placement], copy_channel,
                   np.array([n.reduce_rate or np.inf for n in nodes]), np.array([n.madd_rate or np.inf for n in nodes]),
                   np.array([n.message_overhead or 0.0 for n in nodes]),
                   np.array([n.collective_overhead or 0.0 for n in nodes]),
                   np.array([n.round_overhead or 0.0 for n in nodes]), *_machines(topology, names))


def _machines(topology: Topology, names: list) -> tuple[np.ndarray, np.ndarray]:
    """Per schedule node, the first node with ``cores`` on its route to another worker (the
    machine whose cores its compute shares; -1 for none), and each machine's cores."""
    with_cores = [i for i, n in enumerate(topology.nodes) if n.cores]
    machine = np.full(len(names), -1, dtype=np.int64)
    if with_cores and len(topology.workers) > 1:
        for k, name in enumerate(names):
            other = topology.workers[1] if name == topology.workers[0] else topology.workers[0]
            on_route = [i for i in topology.route_nodes(name, other) if i in with_cores]
            if on_route:
                machine[k] = with_cores.index(on_route[0])
    return machine, np.array([topology.nodes[i].cores for i in with_cores], dtype=float)


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


def _full(schedule, net, itemsize) -> _System:
    """Every transfer a flow."""
    t, c, nodes = schedule.transfers, schedule.compute, schedule.nodes
    pair = t["src"].astype(np.int64) * nodes + t["dst"]
    unique, inverse = _dense_unique(pair, nodes * nodes)
    paths, latency = _pair_routes(unique // nodes, unique % nodes, net)
    adds = np.where(t["op"] != COPY, t["count"], 0)
    steps = _steps(t["src"], t["dst"], t["round"], max(schedule.rounds, 1), c["node"], c["round"], c["madds"],
                   adds, np.ones(nodes), net.add_rate, net.madd_rate, net.overhead, net.per_round, net.machine,
                   net.cores, np.ones(nodes))
    inverse = inverse.reshape(-1)
    return _System(paths[inverse], net.capacity, net.fan_in, net.node_channel[t["dst"]], latency[inverse],
                   t["count"].astype(float) * itemsize, np.ones(len(net.capacity)), *steps, nodes, net.startup,
                   t["round"], np.arange(nodes), np.arange(len(net.capacity)), None)


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
                                           net.machine)):
        return None
    rep = t[rep]
    pairs = np.unique(rep["src"].astype(np.int64) * nodes + rep["dst"])
    if len(pairs) * n > _PAIR_LIMIT:
        return None
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

    def q(x):                                             # schedule node -> system node
        return np.where(x < n, 0, x - n + 1)

    def helpers_after_worker0(x):
        return np.append(x[0], x[n:])
    which = np.searchsorted(pairs, rep["src"].astype(np.int64) * nodes + rep["dst"])
    kept = (c["node"] == 0) | (c["node"] >= n)
    node_weight = np.array([1.0] + [float(n)] * len(schedule.helpers))
    steps = _steps(q(rep["src"]), q(rep["dst"]), rep["round"], max(schedule.rounds, 1), q(c["node"][kept]),
                   c["round"][kept], c["madds"][kept], np.where(rep["op"] != COPY, rep["count"], 0), node_weight,
                   *(helpers_after_worker0(x) for x in (net.add_rate, net.madd_rate, net.overhead, net.per_round)),
                   helpers_after_worker0(net.machine), net.cores, np.array([float(n)] + [1.0] * len(schedule.helpers)))
    # the system's channels: one per orbit crossed (few), then the padding
    crossed = np.unique(label[paths[0][which]])
    crossed = crossed[:-1] if crossed[-1] == padding else crossed
    channel_of = np.full(padding + 1, len(crossed))
    inside = np.isin(label, crossed)
    channel_of[inside] = np.searchsorted(crossed, label[inside])
    return _System(channel_of[paths[0][which]], np.append(net.capacity[crossed], np.inf),
                   np.append(net.fan_in[crossed], 0.0), channel_of[net.node_channel[rep["dst"]]], latency[0][which],
                   rep["count"].astype(float) * itemsize, np.append(weight[crossed], 1.0),
                   *steps, 1 + len(schedule.helpers), helpers_after_worker0(net.startup), rep["round"],
                   q(np.arange(nodes)), channel_of, orbit)


def _steps(src, dst, rnd, rounds, comp_node, comp_round, comp_madds, adds, node_weight,
           add_rate, madd_rate, overhead, per_round, machine, cores, stands_for):
    """The (node, round) steps of a system of flows: each flow's sending and receiving step,
    the steps in order per node, and each step's work (its adds and messages, scaled by
    ``node_weight``, and its multiply-adds). Where nodes share a machine's ``cores``, a
    step's compute takes max(1, c / cores) times as long, c the number of nodes computing in
    that round on that machine (a system node ``stands_for`` that many) -- the round as a proxy
    for "at the same time"."""
    n_fl = len(src)
    keys = np.concatenate([src.astype(np.int64) * rounds + rnd, dst.astype(np.int64) * rounds + rnd,
                           comp_node.astype(np.int64) * rounds + comp_round])
    steps, key_step = _dense_unique(keys, len(node_weight) * rounds)
    step_src, step_dst = key_step[:n_fl], key_step[n_fl:2 * n_fl]
    step_node = steps // rounds
    n_steps = len(steps)
    added = np.bincount(step_dst, weights=adds, minlength=n_steps) * node_weight[step_node]
    madds = np.bincount(key_step[2 * n_fl:], weights=comp_madds, minlength=n_steps)
    work_time = added / add_rate[step_node] + madds / madd_rate[step_node]
    on = (machine[step_node] >= 0) & (work_time > 0)
    if on.any():
        where = machine[step_node[on]] * rounds + steps[on] % rounds
        computing = np.bincount(where, weights=stands_for[step_node[on]], minlength=len(cores) * rounds)
        work_time[on] *= np.maximum(1.0, computing[where] / cores[machine[step_node[on]]])
    work_time = work_time + per_round[step_node]
    if overhead.any():                     # per message sent or received, one after another
        messages = np.bincount(np.concatenate([step_src, step_dst]), minlength=n_steps) * node_weight[step_node]
        work_time = work_time + messages * overhead[step_node]
    return step_src, step_dst, step_node, work_time


def _max_min_rates(paths: np.ndarray, capacity: np.ndarray, weight: np.ndarray, inbound=None,
                   fan_in=None) -> np.ndarray:
    """Max-min fair rates of flows along ``paths`` (progressive filling), vectorized. A flow
    stands for ``weight[c]`` flows on channel c (1 unless the system is a symmetric quotient).
    With ``fan_in``, a node's copy channel receiving k flows at once (``inbound``) has
    capacity / (1 + fan_in (k - 1))."""
    rate = np.zeros(len(paths))
    if fan_in is not None:
        k = np.bincount(inbound, minlength=len(capacity)) * weight
        capacity = capacity / (1 + fan_in * np.maximum(k - 1, 0))
    remaining = capacity.copy()
    live = np.ones(len(paths), dtype=bool)
    unbounded = (paths == len(capacity) - 1).all(axis=1)   # no channel at all (same device)
    rate[unbounded], live[unbounded] = np.inf, False
    while live.any():
        load = np.bincount(paths[live].ravel(), minlength=len(capacity)) * weight
        load[-1] = 0
        used = load > 0
        step = (remaining[used] / load[used]).min()
        rate[live] += step
        remaining[used] -= step * load[used]
        full = np.zeros(len(capacity), dtype=bool)
        full[used] = remaining[used] <= 1e-9 * capacity[used]
        live &= ~full[paths].any(axis=1)
    return rate


def _run(paths, latency, nbytes, capacity, weight, step_src, step_dst, step_node, work_time, nodes,
         start_at, inbound, fan_in):
    """The event loop: per flow its start, send end and delivery; per node when it finished;
    per channel the time it carried a flow. Flows crossing a channel share it max-min fairly.
    A node's first step is ready at ``start_at`` of the node."""
    n_fl, n_steps = len(paths), len(step_node)
    is_last = np.append(step_node[1:] != step_node[:-1], True)
    ends = np.concatenate([step_src, step_dst])
    by_step = np.argsort(ends) % max(n_fl, 1)     # a step's flows, in any order: nothing adds over them
    left = np.bincount(ends, minlength=n_steps)
    by_step_start = np.concatenate([[0], np.cumsum(left)])
    seen = np.empty(max(n_steps, n_fl), np.int64)  # scratch of _distinct
    need = np.full(n_fl, 2)
    start, sent, done = (np.full(n_fl, np.nan) for _ in range(3))
    node_done = np.zeros(nodes)
    busy = np.zeros(len(capacity))
    first_steps = np.flatnonzero(np.diff(step_node, prepend=-1))   # empty for an empty schedule
    pending, pending_at = first_steps, start_at[step_node[first_steps]].astype(float)
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
            busy[paths[active]] += nxt - now          # once per channel, however many flows cross it
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
            finished = _distinct(touched[left[touched] == 0], seen)
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
            posted = by_step[_ranges(by_step_start[ids], by_step_start[ids + 1])]
            np.subtract.at(need, posted, 1)
            starting = _distinct(posted[need[posted] == 0], seen)
            if len(starting):
                start[starting] = now
                active = np.concatenate([active, starting])
                remaining = np.concatenate([remaining, nbytes[starting]])
        rate = (_max_min_rates(paths[active], capacity, weight, inbound[active], fan_in if fan_in.any() else None)
                if len(active) else np.empty(0))
    return start, sent, done, node_done, busy


def _dense_unique(keys, space):
    """``np.unique(keys, return_inverse=True)`` for keys in ``range(space)``: by marking, not
    sorting, when the space is not much larger than the keys."""
    if space > 4 * len(keys) + (1 << 20):
        return np.unique(keys, return_inverse=True)
    present = np.zeros(space, bool)
    present[keys] = True
    rank = np.cumsum(present) - 1
    return np.flatnonzero(present), rank[keys]


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
    node_done[step_node[finished[last]]] = end[last]
    return (np.concatenate([pending, finished[~last] + 1]),
            np.concatenate([pending_at, end[~last]]))


def _pair_routes(src, dst, net):
    """Padded channel paths (P, K) and latencies (P,) between schedule nodes src[i] -> dst[i]:
    the sender's copy channel, the route's channels, the receiver's copy channel, then the
    copy channels of the nodes the route passes through (a switch standing for a machine's
    memory, which every transfer between its processes crosses)."""
    names, topology, padding = net.names, net.topology, net.padding
    routes, through = [], []
    for a, b in zip(src.tolist(), dst.tolist()):
        routes.append(topology.route(names[a], names[b]))
        through.append([c for c in net.copy_channel[topology.route_nodes(names[a], names[b])[1:-1]] if c != padding])
    hops = max([len(r[0]) for r in routes], default=1) or 1
    extra = max([len(t) for t in through], default=0)
    paths = np.full((len(routes), hops + 2 + extra), padding, dtype=np.int64)
    for i, ((channels, _), via) in enumerate(zip(routes, through)):
        paths[i, 1:1 + len(channels)] = channels
        paths[i, hops + 2:hops + 2 + len(via)] = via
    paths[:, 0], paths[:, hops + 1] = net.node_channel[src], net.node_channel[dst]
    keep = (paths != padding).any(axis=0)
    keep[1:1 + hops] = True               # no node costs: the routes alone, as before they existed
    return paths[:, keep], np.array([r[1] for r in routes], dtype=float).reshape(len(routes))


def _cyclic(schedule: Schedule):
    """Whether rotating the workers (w -> w + 1 mod N, helpers fixed) maps the schedule onto
    itself transfer for transfer: same round, count and op (offsets may differ: the simulator
    does not read them), and the same compute. If so, ``(rep, orbit)``: the representatives
    (the transfers worker 0 sends, or receives from a helper) and, per transfer, the index in
    ``rep`` of the representative it is a rotation of; else None. A sufficient test (blocks
    compared in a canonical order): a symmetric schedule it misses is simulated in full."""
    n, t, c = schedule.workers, schedule.transfers, schedule.compute
    if n < 3 or not len(t):
        return None
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
