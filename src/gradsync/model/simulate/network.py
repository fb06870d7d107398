"""The topology as the simulator reads it, as arrays: where the schedule's nodes run, the
channels (the links' directions, the nodes' copy channels) with their capacities, the routes
between nodes as padded channel paths, and the max-min fair rates of flows along them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError
from ...core.schedule import Schedule
from ..topology import Topology


def _placement(schedule: Schedule, topology: Topology) -> np.ndarray:
    """Per schedule node, the index of the topology node it runs on: worker w on
    ``topology.workers[w]``, the helper 'host' on ``topology.host``, 'switch' on the switch that
    reduces for all the workers (``reducer_for``), 'switch<m>' on machine m's."""
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
        elif helper.startswith("switch"):
            names.append(topology.reducer_for(schedule.workers, helper, schedule.algorithm))
        else:
            raise ConfigError(f"no placement for helper node {helper!r}")
    return np.array([topology.index[n] for n in names], dtype=np.int64)


@dataclass(frozen=True, eq=False)
class _Net:
    """The topology as the simulator reads it, for the schedule's nodes: channels (the links'
    directed channels, then one per node with a copy rate, then padding), their capacities
    and incast factors, and the nodes' rates and overheads."""

    topology: Topology
    names: list
    placement: np.ndarray         # per schedule node: its topology node
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
    wire: np.ndarray              # per schedule node: wire bytes per payload byte of its transfers (protocol, switch)
    step_latency: np.ndarray      # per latency class (gpu.CLASSES): the protocol's seconds per step; empty: none
    channel_class: np.ndarray     # per channel: its latency class, -1 for none (node channels, padding)
    eager: bool = False           # a sender's round ends when its bytes have left (NCCL), not when delivered
    protocol: object = None       # the gpu.Protocol charged, or None

    @property
    def padding(self) -> int:
        return len(self.capacity) - 1

    @classmethod
    def of(cls, topology: Topology, placement: np.ndarray, protocol=None) -> "_Net":
        """The topology for the nodes at ``placement``; ``protocol`` (a ``gpu.Protocol``, on a GPU
        topology) adds its wire bytes, its latency per step and per collective."""
        names = [topology.nodes[p].name for p in placement]
        nodes = [topology.nodes[p] for p in placement]
        rates = _copy_rates(topology, placement, protocol)
        copying = [p for p, rate in enumerate(rates) if rate]
        n_links = 2 * len(topology.links)
        padding = n_links + len(copying)
        copy_channel = np.full(len(topology.nodes), padding, dtype=np.int64)
        copy_channel[copying] = n_links + np.arange(len(copying))
        capacity = np.concatenate([topology.channel_capacity, [rates[p] for p in copying], [np.inf]])
        fan_in = np.concatenate([np.zeros(n_links), [topology.nodes[p].fan_in or 0.0 for p in copying], [0.0]])
        startup = np.array([n.collective_overhead or 0.0 for n in nodes])
        wire = np.array([1.0 / n.switch_reduction if n.switch_reduction else 1.0 for n in nodes])
        step, classes = np.empty(0), np.full(padding + 1, -1, np.int64)
        if protocol is not None:
            from ..topology.gpu import CLASSES
            startup, wire = startup + protocol.base, wire / protocol.efficiency
            step = np.array([protocol.step_latency(c, topology.gpu.exposed_network) for c in CLASSES])
            classes[:n_links] = topology.channel_class
        return cls(topology, names, np.asarray(placement, np.int64), capacity.astype(float), fan_in, copy_channel[placement], copy_channel,
                   np.array([n.reduce_rate or np.inf for n in nodes]), np.array([n.madd_rate or np.inf for n in nodes]),
                   np.array([n.message_overhead or 0.0 for n in nodes]), startup,
                   np.array([n.round_overhead or 0.0 for n in nodes]), *_machines(topology, names), wire, step, classes,
                   protocol is not None and topology.gpu is not None and topology.gpu.eager, protocol)

    def wire_bytes(self, src, dst, count, itemsize) -> np.ndarray:
        """Bytes on the wire of transfers of ``count`` elements between schedule nodes src -> dst:
        the payload over the protocol's efficiency, and over a reducing switch's at either end."""
        factor = np.maximum(self.wire[src], self.wire[dst])
        return np.asarray(count, dtype=float) * itemsize * factor


def _copy_rates(topology: Topology, placement, protocol) -> list:
    """Per topology node, the rate its copy channel moves (None: none): its own ``copy_rate``, and
    with LL on a GPU machine at most NCCL's LL limit for each GPU the schedule places."""
    rates = [n.copy_rate for n in topology.nodes]
    if protocol is None or protocol.name != "ll" or topology.gpu is None:
        return rates
    workers = [p for p in np.asarray(placement).tolist() if topology.nodes[p].kind == "gpu"]
    size = topology.machine_size(len(workers))
    limit = topology.gpu.ll_limit(len(workers) // size if len(workers) % size == 0 else 1)
    for p in workers:
        rates[p] = min(rates[p] or limit, limit)
    return rates


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


def _pair_routes(src, dst, net):
    """Padded channel paths (P, K) and latencies (P,) between schedule nodes src[i] -> dst[i]:
    the sender's copy channel, the route's channels, the receiver's copy channel, then the
    copy channels of the nodes the route passes through (a switch standing for a machine's
    memory, which every transfer between its processes crosses)."""
    padding = net.padding
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    channels, latency, inner = net.topology.route_table(net.placement[src], net.placement[dst])
    lengths = (channels >= 0).sum(axis=1)
    hops = int(lengths.max(initial=0)) or 1
    via = np.where(inner >= 0, net.copy_channel[np.maximum(inner, 0)], padding)
    if via.size and (via != padding).any():
        via = np.take_along_axis(via, np.argsort(via == padding, axis=1, kind="stable"), axis=1)
        via = via[:, :int((via != padding).sum(axis=1).max())]
    else:
        via = via[:, :0]
    paths = np.full((len(src), hops + 2 + via.shape[1]), padding, dtype=np.int64)
    route = channels[:, :hops]
    paths[:, 1:1 + route.shape[1]] = np.where(route >= 0, route, padding)
    paths[:, hops + 2:] = via
    paths[:, 0], paths[:, hops + 1] = net.node_channel[src], net.node_channel[dst]
    keep = (paths != padding).any(axis=0)
    keep[1:1 + hops] = True               # no node costs: the routes alone, as before they existed
    latency = np.asarray(latency, dtype=float).reshape(len(src))
    if len(net.step_latency):             # a protocol's step: by the slowest class of link on the route
        cls = net.channel_class[paths].max(axis=1, initial=-1)
        latency = latency + np.where(cls >= 0, net.step_latency[np.maximum(cls, 0)], 0.0)
    return paths[:, keep], latency


def _max_min_rates(paths: np.ndarray, capacity: np.ndarray, weight: np.ndarray, inbound=None,
                   fan_in=None, count=None) -> np.ndarray:
    """Max-min fair rates of flows along ``paths`` (progressive filling), vectorized. A flow
    stands for ``weight[c]`` flows on channel c (1 unless the system is a symmetric quotient).
    With ``fan_in``, a node's copy channel receiving k flows at once (``inbound``) has
    capacity / (1 + fan_in (k - 1)). With ``count``, each row stands for that many flows of the
    same route (the same rates, bit for bit, as the rows repeated: the loads are whole numbers)."""
    rate = np.zeros(len(paths))
    if fan_in is not None:
        k = np.bincount(inbound, weights=count, minlength=len(capacity)) * weight
        capacity = capacity / (1 + fan_in * np.maximum(k - 1, 0))
    remaining = capacity.copy()
    live = np.ones(len(paths), dtype=bool)
    unbounded = (paths == len(capacity) - 1).all(axis=1)   # no channel at all (same device)
    rate[unbounded], live[unbounded] = np.inf, False
    while live.any():
        crossing = None if count is None else np.repeat(count[live], paths.shape[1])
        load = np.bincount(paths[live].ravel(), weights=crossing, minlength=len(capacity)) * weight
        load[-1] = 0
        used = load > 0
        step = (remaining[used] / load[used]).min()
        rate[live] += step
        remaining[used] -= step * load[used]
        full = np.zeros(len(capacity), dtype=bool)
        full[used] = remaining[used] <= 1e-9 * capacity[used]
        live &= ~full[paths].any(axis=1)
    return rate
