"""Topology: devices, host CPUs and switches joined by links, and routes between them.

A link joins two nodes with a bandwidth per direction (bytes/s) and a latency (seconds). A
full-duplex link is two independent directed channels; a half-duplex one is one shared
channel. A node may have costs of its own (all optional): a copy rate shared by every
transfer it sends or receives, a per-message overhead, and an incast penalty when many
peers send to it at once. Routes are fewest-time paths (latency plus 1 MB at the link's bandwidth), so NVLink
is preferred over PCIe where both exist.

A GPU machine (``gpu``, a ``gpu.GpuModel``) adds what NCCL's kernels pay: a link of a known
``kind`` (NVLink 4, PCIe, ...) carries its nominal bandwidth times the share those kernels get
of it (``gpu.LINK_KINDS``), and each transfer pays its protocol's per-step latency. Without
peer-to-peer (``p2p=False``) every transfer between two GPUs goes through the host's memory
(``host``): up one PCIe path and down another, as NCCL's shared-memory transport moves it. A
switch with ``switch_reduction`` can reduce what passes through it (NVLink SHARP on an
NVSwitch, SHARP on an InfiniBand switch); schedules place their helper "switch" on it.
"""

from __future__ import annotations

import itertools

from dataclasses import dataclass, field
from functools import cached_property

import networkx as nx
import numpy as np

from ...errors import TopologyError
from .gpu import GpuModel, check_kind, link_class, link_efficiency

NODE_KINDS = ("gpu", "cpu", "host", "switch", "nic")
_ROUTE_PROBE_BYTES = 1e6


@dataclass(frozen=True)
class Node:
    name: str
    kind: str
    reduce_rate: float | None = None   # elements added per second (streaming); None: free
    madd_rate: float | None = None     # multiply-adds per second in small matrix products; None: free
    # The node's own costs of moving data (all None: free, the wires alone limit):
    copy_rate: float | None = None     # bytes/s the node moves in and out, shared by every transfer it sends or receives
    message_overhead: float | None = None   # seconds of the node's time per message sent or received (LogGP's o)
    fan_in: float | None = None        # incast: each concurrent incoming transfer beyond the first costs this
                                       # fraction more of the copy rate (rate / (1 + fan_in (k - 1)))
    collective_overhead: float | None = None   # seconds of the node's time before each collective's first round
                                               # (gradsync's runtime: the ranks' agreement on the call)
    cores: float | None = None         # a switch standing for one machine: the adds and multiply-adds of the
                                       # nodes behind it share this many cores (each node at most one)
    round_overhead: float | None = None  # seconds of the node's time per round it takes part in, beyond its messages
    switch_reduction: float | None = None  # a switch that reduces in the network, at this share of its links' rate


@dataclass(frozen=True)
class Link:
    a: str
    b: str
    bandwidth: float                   # bytes per second, per direction
    latency: float = 0.0               # seconds
    duplex: str = "full"
    kind: str | None = None            # a gpu.LINK_KINDS name (nvlink4, pcie, net, ...): its efficiency, latency class

    def __post_init__(self):
        try:
            check_kind(self.kind)
        except Exception as exc:
            raise TopologyError(f"link {self.a}-{self.b}: {exc}") from None


@dataclass(frozen=True, eq=False)
class Topology:
    """Nodes and links, where the workers run, and where the host (helper) runs.

    ``workers`` names the devices workers 0..N-1 are placed on; ``host`` the node a host
    aggregation runs on; ``rings`` optional ring orders (worker indices) that use the links
    best, with ``ring_weights`` (their bandwidths) for splitting data between them.

    >>> from gradsync.model.topology import preset
    >>> t = preset("pcie-switch-4")
    >>> [t.nodes[i].name for i in t.route_nodes("gpu0", "gpu1")]
    ['gpu0', 'switch', 'gpu1']
    """

    name: str
    nodes: tuple[Node, ...]
    links: tuple[Link, ...]
    workers: tuple[str, ...]
    host: str | None = None
    rings: tuple[tuple[int, ...], ...] | None = None
    ring_weights: tuple[float, ...] | None = None
    description: str = ""
    router: object = field(default=None, repr=False)   # fixed routes of a generated cluster (cluster.ClusterRoutes)
    gpu: GpuModel | None = None        # a GPU machine's protocols and step costs (None: hosts, links alone)
    p2p: bool = True                   # False: transfers between GPUs go through ``host``'s memory
    reducers: tuple[str, ...] = ()     # per machine, its switch that reduces (NVLS), in machine order
    network_reducer: str | None = None   # a switch that reduces across machines (InfiniBand SHARP)
    _routes: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise TopologyError(f"nodes: name {dup!r} appears twice")
        known = set(names)
        for i, link in enumerate(self.links):
            for end in ("a", "b"):
                if getattr(link, end) not in known:
                    raise TopologyError(f"links.{i}.{end}: unknown node {getattr(link, end)!r}")
            if link.a == link.b:
                raise TopologyError(f"links.{i}: joins node {link.a!r} to itself")
        if not self.workers:
            raise TopologyError("workers: at least one worker device is needed")
        for i, w in enumerate(self.workers):
            if w not in known:
                raise TopologyError(f"workers.{i}: unknown node {w!r}")
        if self.host is not None and self.host not in known:
            raise TopologyError(f"host: unknown node {self.host!r}")
        if not self.p2p and self.host is None:
            raise TopologyError("p2p: a topology without peer-to-peer needs a host whose memory GPUs go through")
        for r in self.reducers + ((self.network_reducer,) if self.network_reducer else ()):
            if r not in known or not (self.nodes[names.index(r)].switch_reduction or 0) > 0:
                raise TopologyError(f"reducers: {r!r} is not a node with switch_reduction set")
        if self.router is None and not nx.is_connected(self.graph):   # a cluster's routes join it by construction
            parts = sorted(sorted(c) for c in nx.connected_components(self.graph))
            raise TopologyError(f"links: the nodes are not all connected: {parts[:2]} ...")

    @cached_property
    def index(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.nodes)}

    @cached_property
    def graph(self) -> nx.Graph:
        g = nx.Graph()
        g.add_nodes_from(n.name for n in self.nodes)
        for i, link in enumerate(self.links):
            cost = link.latency + _ROUTE_PROBE_BYTES / link.bandwidth
            if not g.has_edge(link.a, link.b) or cost < g.edges[link.a, link.b]["cost"]:
                g.add_edge(link.a, link.b, cost=cost, link=i)
        return g

    @cached_property
    def channel_capacity(self) -> np.ndarray:
        """Bandwidth of each directed channel: 2 per link (a->b, b->a; one shared if half duplex),
        what a link of a known kind delivers (its nominal rate times ``gpu.link_efficiency``)."""
        return np.repeat([l.bandwidth * link_efficiency(l.kind) for l in self.links], 2).astype(float)

    @cached_property
    def channel_class(self) -> np.ndarray:
        """Latency class of each directed channel (an index into ``gpu.CLASSES``; -1: no kind)."""
        return np.repeat([link_class(l.kind) for l in self.links], 2).astype(np.int64)

    @cached_property
    def _tree(self):
        """Parents and depths from the first node, when the graph is a tree (fast routing)."""
        if not nx.is_tree(self.graph):
            return None
        root = self.nodes[0].name
        parent = {root: None}
        parent.update(dict(nx.bfs_predecessors(self.graph, root)))
        depth = nx.single_source_shortest_path_length(self.graph, root)
        return parent, depth

    @property
    def is_tree(self) -> bool:
        """True when there is one route between any two nodes (switches, no meshes)."""
        return self._tree is not None

    def machine_size(self, workers: int | None = None) -> int:
        """How many consecutive workers share a machine: the groups left when the slowest tier
        of links (the network between machines) is removed, if they split the first
        ``workers`` workers into equal runs of consecutive ranks; else ``workers`` (one machine).

        >>> from gradsync.model.topology import preset
        >>> preset("lowbw-cluster").machine_size(), preset("p3.16xlarge").machine_size()
        (4, 8)
        """
        names = list(self.workers[:workers] if workers else self.workers)
        if self.router is not None:
            size = self.router.machine_size
            return size if len(names) > size and len(names) % size == 0 else len(names)
        slowest = min(l.bandwidth for l in self.links)
        fast = nx.Graph()
        fast.add_nodes_from(n.name for n in self.nodes)
        fast.add_edges_from((l.a, l.b) for l in self.links if l.bandwidth > slowest)
        part = {name: k for k, comp in enumerate(nx.connected_components(fast)) for name in comp}
        runs = [len(list(g)) for _, g in itertools.groupby(part[w] for w in names)]
        ids = [part[w] for w in names]
        if len(runs) > 1 and len(set(runs)) == 1 and runs[0] > 1 and len(set(ids)) == len(runs):
            return runs[0]
        return len(names)

    def _through_host(self, a: str, b: str) -> bool:
        """Whether the route a -> b goes through host memory: no peer-to-peer, two GPUs."""
        return not self.p2p and a != b and self.node(a).kind == "gpu" and self.node(b).kind == "gpu"

    def _memory_of(self, a: str) -> str:
        """The host memory a GPU writes to without peer-to-peer: its own socket's, the first CPU on
        its route to the host."""
        path = nx.shortest_path(self.graph, a, self.host, weight="cost")
        return next(n for n in path if self.node(n).kind == "cpu")

    def route_nodes(self, a: str, b: str) -> list[int]:
        """Node indices along the route from ``a`` to ``b``, both included."""
        key = (a, b)
        if key not in self._routes and self._through_host(a, b):
            memory = self._memory_of(a)
            self._routes[key] = self.route_nodes(a, memory) + self.route_nodes(memory, b)[1:]
        if key not in self._routes and self.router is not None:
            found = self.router.route_table([self.index[a]], [self.index[b]])
            if found is not None:
                inner = [int(x) for x in found[2][0] if x >= 0]
                self._routes[key] = [self.index[a]] + inner + ([self.index[b]] if a != b else [])
        if key not in self._routes:
            if self._tree is not None:
                parent, depth = self._tree
                up, down = [a], [b]
                while up[-1] != down[-1]:
                    if depth[up[-1]] >= depth[down[-1]]:
                        up.append(parent[up[-1]])
                    else:
                        down.append(parent[down[-1]])
                path = up + down[-2::-1]
            else:
                path = nx.shortest_path(self.graph, a, b, weight="cost")
            self._routes[key] = [self.index[n] for n in path]
        return self._routes[key]

    def route(self, a: str, b: str) -> tuple[list[int], float]:
        """Directed channel ids along the route from ``a`` to ``b``, and its total latency."""
        found = self.router.route_table([self.index[a]], [self.index[b]]) if self.router is not None else None
        if found is not None:
            return [int(c) for c in found[0][0] if c >= 0], float(found[1][0])
        path = self.route_nodes(a, b)
        channels, latency = [], 0.0
        for u, v in zip(path, path[1:]):
            i = self.graph.edges[self.nodes[u].name, self.nodes[v].name]["link"]
            link = self.links[i]
            forward = link.a == self.nodes[u].name or link.duplex == "half"
            channels.append(2 * i + (0 if forward else 1))
            latency += link.latency
        return channels, latency

    def route_table(self, a, b) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Routes of many pairs of node indices ``a[i] -> b[i]`` at once: directed channels per
        route (rows padded with -1), latencies, and the nodes each passes through (padded with
        -1). ``t.route_table([0], [1])[0]`` is the channels from node 0 to node 1."""
        a, b = np.asarray(a, np.int64).ravel(), np.asarray(b, np.int64).ravel()
        found = self.router.route_table(a, b) if self.router is not None else None
        if found is not None:
            return found
        pairs, inverse = np.unique(a * len(self.nodes) + b, return_inverse=True)
        names = [n.name for n in self.nodes]
        routes = [self.route(names[p // len(self.nodes)], names[p % len(self.nodes)]) for p in pairs.tolist()]
        inner = [self.route_nodes(names[p // len(self.nodes)], names[p % len(self.nodes)])[1:-1]
                 for p in pairs.tolist()]
        hops = max([len(r[0]) for r in routes], default=0)
        channels = np.full((len(pairs), hops), -1, np.int64)
        through = np.full((len(pairs), max(hops - 1, 0)), -1, np.int64)
        for i, ((chan, _), via) in enumerate(zip(routes, inner)):
            channels[i, :len(chan)] = chan
            through[i, :len(via)] = via
        latency = np.array([r[1] for r in routes], dtype=float)
        inverse = inverse.reshape(-1)
        return channels[inverse], latency[inverse], through[inverse]

    def path_alpha_beta(self, a: str, b: str) -> tuple[float, float]:
        """Latency and seconds per byte (1 / bottleneck bandwidth) of the route a -> b."""
        channels, latency = self.route(a, b)
        if not channels:
            return 0.0, 0.0
        return latency, float(1.0 / self.channel_capacity[channels].min())

    def reduce_rate(self, name: str) -> float | None:
        return self.nodes[self.index[name]].reduce_rate

    def madd_rate(self, name: str) -> float | None:
        return self.nodes[self.index[name]].madd_rate

    @cached_property
    def has_node_costs(self) -> bool:
        """Whether any node sets a copy rate, a per-message or per-collective overhead or an incast factor: terms
        only the simulator models (the closed forms do not)."""
        return any(n.copy_rate or n.message_overhead or n.fan_in or n.collective_overhead or n.cores
                   or n.round_overhead for n in self.nodes)

    def reducer_for(self, workers: int, helper: str = "switch", algorithm: str = "switch") -> str:
        """The node that helper ``helper`` runs on: "switch" is the switch that reduces for all
        ``workers`` (one machine's NVSwitch, else a network switch with SHARP), "switch<m>"
        machine m's; TopologyError where there is none.

        >>> from gradsync.model.topology import preset
        >>> preset("hgx-h100").reducer_for(8), preset("cluster", gpu="h100").reducer_for(16, "switch1")
        ('nvswitch', 'm1nvs')
        """
        what = f"algorithm {algorithm!r} needs a switch that reduces"
        if helper != "switch":
            m = helper.removeprefix("switch")
            if not m.isdigit() or int(m) >= len(self.reducers):
                raise TopologyError(f"{what} in machine {m}; topology {self.name!r} has {len(self.reducers)} "
                                    "such switches (NVLink SHARP)")
            return self.reducers[int(m)]
        machine = self.machine_size(workers) if len(self.reducers) > 1 else len(self.workers)
        if self.reducers and workers <= machine:
            return self.reducers[0]
        if self.network_reducer is not None:
            return self.network_reducer
        raise TopologyError(f"{what} for all {workers} workers; topology {self.name!r} has none"
                            + (" across its machines" if self.reducers else " (no NVLink SHARP, no SHARP switch)"))

    def node(self, name: str) -> Node:
        """The node called ``name``."""
        return self.nodes[self.index[name]]

    def with_workers(self, count: int) -> "Topology":
        """This topology using only its first ``count`` worker devices."""
        if not 1 <= count <= len(self.workers):
            raise TopologyError(f"workers: topology {self.name!r} has {len(self.workers)} worker "
                                f"devices, cannot place {count}")
        if count == len(self.workers):
            return self
        return Topology(self.name, self.nodes, self.links, self.workers[:count], self.host,
                        description=self.description, router=self.router, gpu=self.gpu, p2p=self.p2p,
                        reducers=self.reducers, network_reducer=self.network_reducer)

    def summary(self) -> dict:
        """A JSON-ready description (for the browser and ``--format json``)."""
        return {"name": self.name, "description": self.description,
                "nodes": [{"name": n.name, "kind": n.kind} for n in self.nodes],
                "links": [{"a": l.a, "b": l.b, "bandwidth": l.bandwidth, "latency": l.latency,
                           "duplex": l.duplex, **({"kind": l.kind} if l.kind else {})} for l in self.links],
                "workers": list(self.workers), "host": self.host,
                "rings": [list(r) for r in self.rings] if self.rings else None}
