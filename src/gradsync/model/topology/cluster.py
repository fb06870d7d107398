"""Clusters of GPU machines: NVSwitch inside each machine, one NIC per GPU across.

Two shapes, both with every machine alike (the symmetry the simulator's compact path uses):

- ``rail`` (rail-optimized): NIC g of every machine joins rail switch g; the rails meet at a
  spine, each rail's uplink carrying machines x NIC / ``oversubscription``. Traffic between
  GPUs of the same local rank stays on its rail; between different local ranks it crosses
  the spine.
- ``fat-tree``: the 8 NICs of a machine join its top-of-rack switch, whose uplink to a core
  carries 8 x NIC / ``oversubscription``; all traffic between machines crosses the core.

A rail or the core stands for its whole switching tier (pods are not drawn: a pod boundary
would make some machines differ from the others). Routes are fixed, as NCCL's are without
PXN: between GPUs of one machine through its NVSwitch, otherwise out of the sender's own NIC.
``ClusterRoutes`` computes them for many pairs at once.

>>> t = cluster(machines=2, gpus=4)
>>> len(t.workers), [t.nodes[i].name for i in t.route_nodes("m0g1", "m1g2")]
(8, ['m0g1', 'rail1', 'spine', 'rail2', 'm1g2'])
"""

from __future__ import annotations

import numpy as np

from ...errors import TopologyError
from ...units import parse_bandwidth, parse_time
from .model import Link, Node, Topology

SHAPES = ("rail", "fat-tree")
MAX_GPUS = 1 << 17


class ClusterRoutes:
    """The fixed routes of a ``cluster`` topology, vectorized over pairs of GPUs.

    Node layout: GPUs 0..N-1 (machine-major), then one NVSwitch per machine (when a machine
    has more than one GPU), then the rails (or top-of-rack switches), then the spine (core).
    Links in the same order: GPU-NVSwitch, GPU-NIC-switch, switch-spine; each link's ``a`` is
    the lower end, so channel 2i goes up and 2i + 1 down.
    """

    def __init__(self, machines, gpus, shape, latencies):
        self.machines, self.gpus, self.shape = machines, gpus, shape
        self.n = machines * gpus
        self.nv = 1 if gpus > 1 else 0
        self.switches = gpus if shape == "rail" else machines
        self.nv_lat, self.nic_lat, self.up_lat = latencies

    @property
    def machine_size(self) -> int:
        return self.gpus

    def route_table(self, a, b):
        """For topology node indices ``a[i] -> b[i]`` (GPUs), the channels along each route
        (rows padded with -1), their latencies and the nodes passed through (padded with -1);
        None when an end is not a GPU."""
        a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
        if len(a) and (max(a.max(), b.max()) >= self.n or min(a.min(), b.min()) < 0):
            return None
        n, g, nv = self.n, self.gpus, self.nv
        nic, up = nv * n, nv * n + n                          # first NIC link, first uplink
        sw_node = n + nv * self.machines                      # first rail / top-of-rack node
        spine = sw_node + self.switches
        sw_a, sw_b = (a % g, b % g) if self.shape == "rail" else (a // g, b // g)
        same_machine = (a // g == b // g) & (a != b)
        same_switch = (sw_a == sw_b) & ~same_machine & (a != b)
        far = ~same_machine & ~same_switch & (a != b)
        channels = np.full((len(a), 4), -1, np.int64)
        inner = np.full((len(a), 3), -1, np.int64)
        latency = np.zeros(len(a))
        channels[same_machine, 0], channels[same_machine, 1] = 2 * a[same_machine], 2 * b[same_machine] + 1
        inner[same_machine, 0] = n + a[same_machine] // g
        latency[same_machine] = self.nv_lat + self.nv_lat
        for mask, hops in ((same_switch, 2), (far, 4)):
            channels[mask, 0], channels[mask, hops - 1] = 2 * (nic + a[mask]), 2 * (nic + b[mask]) + 1
            inner[mask, 0] = sw_node + sw_a[mask]
        channels[far, 1], channels[far, 2] = 2 * (up + sw_a[far]), 2 * (up + sw_b[far]) + 1
        inner[far, 1], inner[far, 2] = spine, sw_node + sw_b[far]
        latency[same_switch] = self.nic_lat + self.nic_lat
        latency[far] = self.nic_lat + self.up_lat + self.up_lat + self.nic_lat
        width = 4 if far.any() else 2 if (same_switch | same_machine).any() else 0
        return channels[:, :width], latency, inner[:, :max(width - 1, 0)]


def _check(what, value, low, high, kind=int):
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) \
            or not low <= value <= high:
        raise TopologyError(f"{what}: expected {'a number' if kind is float else 'an integer'} in {low}..{high}, "
                            f"got {value!r}")
    return kind(value)


def cluster(workers: int | None = None, machines: int | None = None, gpus: int = 8, shape: str = "rail",
            oversubscription: float = 1.0, nic="400Gbit/s", nvlink="450GB/s", nvlink_latency="0.5us",
            nic_latency="1us", spine_latency="0.5us") -> Topology:
    """``machines`` machines of ``gpus`` GPUs (NVSwitch, ``nvlink`` per GPU and direction), one
    ``nic`` per GPU, joined as ``shape`` ("rail" or "fat-tree") with ``oversubscription`` at
    the tier above the NICs; ``workers`` alone sizes the machines (whole machines, the last
    ones' first GPUs used).

    >>> cluster(workers=12).workers[-1], cluster(machines=2, shape="fat-tree").name
    ('m1g3', 'cluster')
    """
    gpus = _check("gpus", gpus, 1, 64)
    if machines is None:
        machines = 2 if workers is None else max(1, -(-_check("workers", workers, 1, MAX_GPUS) // gpus))
    machines = _check("machines", machines, 1, MAX_GPUS // gpus)
    if shape not in SHAPES:
        raise TopologyError(f"shape: expected one of {', '.join(SHAPES)}, got {shape!r}")
    over = _check("oversubscription", oversubscription, 1, 1024, float)
    nic_bw, nv_bw = parse_bandwidth(nic), parse_bandwidth(nvlink)
    lat = tuple(parse_time(x) for x in (nvlink_latency, nic_latency, spine_latency))
    routes = ClusterRoutes(machines, gpus, shape, lat)
    n, switches = machines * gpus, routes.switches
    gpu_names = [f"m{m}g{g}" for m in range(machines) for g in range(gpus)]
    switch_names = [f"rail{s}" for s in range(switches)] if shape == "rail" else [f"tor{s}" for s in range(switches)]
    nodes = [Node(name, "gpu") for name in gpu_names]
    links = []
    if gpus > 1:
        nodes += [Node(f"m{m}nvs", "switch") for m in range(machines)]
        links += [Link(name, f"m{w // gpus}nvs", nv_bw, lat[0]) for w, name in enumerate(gpu_names)]
    nodes += [Node(name, "switch") for name in switch_names] + [Node("spine", "switch")]
    links += [Link(name, switch_names[w % gpus if shape == "rail" else w // gpus], nic_bw, lat[1])
              for w, name in enumerate(gpu_names)]
    per_switch = machines if shape == "rail" else gpus            # NICs under one rail / rack switch
    links += [Link(name, "spine", per_switch * nic_bw / over, lat[2]) for name in switch_names]
    topo = Topology("cluster", tuple(nodes), tuple(links), tuple(gpu_names), None,
                    description=f"{machines} machines x {gpus} GPUs ({nvlink} NVSwitch), one {nic} NIC per GPU, "
                                f"{shape}, oversubscription {over:g}:1", router=routes)
    return topo if workers is None or workers == n else topo.with_workers(workers)
