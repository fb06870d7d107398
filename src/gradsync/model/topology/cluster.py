"""Clusters of GPU machines: NVSwitch inside each machine, one NIC per GPU across.

Two shapes, both with every machine alike (the symmetry the simulator's compact path uses):

- ``rail`` (rail-optimized): NIC g of every machine joins rail switch g; the rails meet at a
  spine, each rail's uplink carrying machines x NIC / ``oversubscription``. Traffic between
  GPUs of the same local rank stays on its rail; between different local ranks it crosses
  the spine.
- ``fat-tree``: the 8 NICs of a machine join its top-of-rack switch, whose uplink to a core
  carries 8 x NIC / ``oversubscription``; all traffic between machines crosses the core.

A rail or the core stands for its whole switching tier (pods are not drawn: a pod boundary
would make some machines differ from the others). Routes are fixed: between GPUs of one
machine through its NVSwitch, otherwise out of the sender's own NIC; with ``pxn`` (NCCL's PXN,
rail clusters), a transfer to another machine's GPU of another local rank first crosses the
NVSwitch to the sender machine's GPU of the receiver's local rank and leaves by that GPU's NIC,
so that it stays on one rail. ``ClusterRoutes`` computes them for many pairs at once.

``gpu`` (a ``machines.GPUS`` name: a100, h100, b200, ...) builds the machines from that GPU's
nominal NVLinks (kinds, so NCCL's link efficiencies and protocols apply) and, where it has
NVLink SHARP, an NVSwitch that reduces (``nvls``); ``sharp`` makes the spine (the core) an
InfiniBand switch that reduces. ``gpus`` is any GPU count per NVLink domain (72 for an NVL72
rack).

>>> t = cluster(machines=2, gpus=4)
>>> len(t.workers), [t.nodes[i].name for i in t.route_nodes("m0g1", "m1g2")]
(8, ['m0g1', 'rail1', 'spine', 'rail2', 'm1g2'])
"""

from __future__ import annotations

import numpy as np

from ...errors import TopologyError
from ...units import parse_bandwidth, parse_time
from .gpu import NVLS_LATENCY, GpuModel, gpu_spec
from .model import Link, Node, Topology

SHAPES = ("rail", "fat-tree")
MAX_GPUS = 1 << 17
MAX_PER_MACHINE = 1024          # GPUs in one NVLink domain


class ClusterRoutes:
    """The fixed routes of a ``cluster`` topology, vectorized over pairs of GPUs.

    Node layout: GPUs 0..N-1 (machine-major), then one NVSwitch per machine (when a machine
    has more than one GPU), then the rails (or top-of-rack switches), then the spine (core).
    Links in the same order: GPU-NVSwitch, GPU-NIC-switch, switch-spine; each link's ``a`` is
    the lower end, so channel 2i goes up and 2i + 1 down.
    """

    def __init__(self, machines, gpus, shape, latencies, pxn=False):
        self.machines, self.gpus, self.shape, self.pxn = machines, gpus, shape, pxn and shape == "rail"
        self.n = machines * gpus
        self.nv = 1 if gpus > 1 else 0
        self.switches = gpus if shape == "rail" else machines
        self.nv_lat, self.nic_lat, self.up_lat = latencies

    @property
    def machine_size(self) -> int:
        return self.gpus

    def route_table(self, a, b):
        """For topology node indices ``a[i] -> b[i]`` (GPUs, or a GPU and its own NVSwitch or the
        spine), the channels along each route (rows padded with -1), their latencies and the nodes
        passed through (padded with -1); None for other ends."""
        a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
        if len(a) and (max(a.max(), b.max()) >= self.n or min(a.min(), b.min()) < 0):
            return self._switch_routes(a, b)
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
        if self.pxn and far.any():           # over NVLink to the local rank of the receiver, then its rail
            via = a[far] // g * g + b[far] % g
            channels[far] = np.column_stack([2 * a[far], 2 * via + 1, 2 * (nic + via), 2 * (nic + b[far]) + 1])
            inner[far] = np.column_stack([n + a[far] // g, via, sw_node + sw_b[far]])
            latency[far] = 2 * self.nv_lat + 2 * self.nic_lat
        width = 4 if far.any() else 2 if (same_switch | same_machine).any() else 0
        return channels[:, :width], latency, inner[:, :max(width - 1, 0)]

    def _switch_routes(self, a, b):
        """Routes between GPUs and the switches that reduce: a GPU's own NVSwitch (one NVLink hop)
        and the spine (up its NIC and its rail or rack's uplink); None for any other pair."""
        n, g, nv = self.n, self.gpus, self.nv
        nic, up = nv * n, nv * n + n
        sw_node = n + nv * self.machines
        spine = sw_node + self.switches
        gpu_a, gpu_b = (a >= 0) & (a < n), (b >= 0) & (b < n)
        to_nvs = gpu_a & (nv == 1) & (b == n + a // g)
        from_nvs = gpu_b & (nv == 1) & (a == n + b // g)
        to_spine, from_spine = gpu_a & (b == spine), gpu_b & (a == spine)
        if not (to_nvs | from_nvs | to_spine | from_spine).all():
            return None
        channels, latency = np.full((len(a), 2), -1, np.int64), np.zeros(len(a))
        inner = np.full((len(a), 1), -1, np.int64)
        channels[to_nvs, 0], channels[from_nvs, 0] = 2 * a[to_nvs], 2 * b[from_nvs] + 1
        latency[to_nvs | from_nvs] = self.nv_lat
        for mask, gpu, upward in ((to_spine, a, True), (from_spine, b, False)):
            sw = gpu[mask] % g if self.shape == "rail" else gpu[mask] // g
            first, second = 2 * (nic + gpu[mask]), 2 * (up + sw)
            channels[mask] = np.column_stack([first, second]) if upward else np.column_stack([second + 1, first + 1])
            inner[mask, 0] = sw_node + sw
            latency[mask] = self.nic_lat + self.up_lat
        width = 2 if (to_spine | from_spine).any() else 1 if len(a) else 0
        return channels[:, :width], latency, inner[:, :max(width - 1, 0)]


def _check(what, value, low, high, kind=int):
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) \
            or not low <= value <= high:
        raise TopologyError(f"{what}: expected {'a number' if kind is float else 'an integer'} in {low}..{high}, "
                            f"got {value!r}")
    return kind(value)


def cluster(workers: int | None = None, machines: int | None = None, gpus: int = 8, shape: str = "rail",
            oversubscription: float = 1.0, nic="400Gbit/s", nvlink=None, nvlink_latency=None,
            nic_latency=None, spine_latency=None, gpu: str | None = None, nvls: bool | None = None,
            sharp: bool = False, pxn: bool | None = None, net: str = "ib") -> Topology:
    """``machines`` machines of ``gpus`` GPUs (NVSwitch, ``nvlink`` per GPU and direction), one
    ``nic`` per GPU, joined as ``shape`` ("rail" or "fat-tree") with ``oversubscription`` at
    the tier above the NICs; ``workers`` alone sizes the machines (whole machines, the last
    ones' first GPUs used). ``gpu`` makes them real machines (module docstring); ``net`` is
    "ib" (InfiniBand or RoCE, RDMA) or "ethernet" (TCP sockets).

    >>> cluster(workers=12).workers[-1], cluster(machines=2, shape="fat-tree").name
    ('m1g3', 'cluster')
    >>> t = cluster(machines=2, gpu="h100")
    >>> t.reducers, t.gpu is not None, [t.nodes[i].name for i in t.route_nodes("m0g1", "m1g2")]
    (('m0nvs', 'm1nvs'), True, ['m0g1', 'm0nvs', 'm0g2', 'rail2', 'm1g2'])
    """
    gpus = _check("gpus", gpus, 1, MAX_PER_MACHINE)
    if machines is None:
        machines = 2 if workers is None else max(1, -(-_check("workers", workers, 1, MAX_GPUS) // gpus))
    machines = _check("machines", machines, 1, MAX_GPUS // gpus)
    if shape not in SHAPES:
        raise TopologyError(f"shape: expected one of {', '.join(SHAPES)}, got {shape!r}")
    if net not in ("ib", "ethernet"):
        raise TopologyError(f"net: expected ib or ethernet, got {net!r}")
    over = _check("oversubscription", oversubscription, 1, 1024, float)
    spec = None if gpu is None else _gpu(gpu, nvls, gpus)
    nvls = bool(spec and spec.nvls) if nvls is None else bool(nvls)
    kinds = (spec.nvlink, "net" if net == "ib" else "ethernet") if spec else (None, None)
    nv_bw = parse_bandwidth(nvlink) if nvlink is not None else (spec.nvlink_rate or 450e9) if spec else 450e9
    nic_bw = parse_bandwidth(nic)
    defaults = ("0us", "0us", "0us") if spec else ("0.5us", "1us", "0.5us")
    lat = tuple(parse_time(x if x is not None else d)
                for x, d in zip((nvlink_latency, nic_latency, spine_latency), defaults))
    routes = ClusterRoutes(machines, gpus, shape, lat, pxn=bool(spec) if pxn is None else pxn)
    nodes, links = _cluster_parts(machines, gpus, shape, over, (nv_bw, nic_bw), lat, kinds,
                                  (spec.nvls if nvls and spec else None, sharp), routes.switches)
    nvswitches = tuple(f"m{m}nvs" for m in range(machines)) if nvls and gpus > 1 else ()
    what = f"{spec.title}, {spec.links} NVLinks" if spec else f"{format_rate(nv_bw)} NVSwitch"
    topo = Topology("cluster", tuple(nodes), tuple(links), tuple(f"m{m}g{g}" for m in range(machines)
                                                                 for g in range(gpus)), None,
                    description=f"{machines} machines x {gpus} GPUs ({what}), one {nic} NIC per GPU, "
                                f"{shape}, oversubscription {over:g}:1" + (", NVLS" if nvswitches else "")
                                + (", SHARP" if sharp else "") + (", PXN" if routes.pxn else ""),
                    router=routes, gpu=GpuModel(compcap=spec.compcap, exposed_network=gpus == 1) if spec else None,
                    reducers=nvswitches,
                    network_reducer="spine" if sharp else None)
    n = machines * gpus
    return topo if workers is None or workers == n else topo.with_workers(workers)


def _gpu(name, nvls, gpus):
    spec = gpu_spec(name)
    if not spec.nvlink and gpus > 1:
        raise TopologyError(f"gpu: {spec.title} has no NVLink; a cluster's machines of several GPUs are NVLink "
                            "domains (gpus=1 for one GPU per machine)")
    if nvls and not spec.nvls:
        raise TopologyError(f"nvls: {spec.title}'s NVSwitch does not reduce (NVLS needs Hopper or later)")
    return spec


def _cluster_parts(machines, gpus, shape, over, rates, lat, kinds, reduce, switches):
    """The cluster's nodes and links, in ``ClusterRoutes``' order: GPUs, NVSwitches, rails (or
    racks), the spine; GPU-NVSwitch links, GPU-NIC links, uplinks."""
    (nv_bw, nic_bw), (nv_kind, net_kind), (nvls, sharp) = rates, kinds, reduce
    gpu_names = [f"m{m}g{g}" for m in range(machines) for g in range(gpus)]
    switch_names = [f"rail{s}" for s in range(switches)] if shape == "rail" else [f"tor{s}" for s in range(switches)]
    nodes = [Node(name, "gpu") for name in gpu_names]
    links = []
    if gpus > 1:
        nodes += [Node(f"m{m}nvs", "switch", switch_reduction=nvls,
                       collective_overhead=NVLS_LATENCY if nvls else None) for m in range(machines)]
        links += [Link(name, f"m{w // gpus}nvs", nv_bw, lat[0], kind=nv_kind) for w, name in enumerate(gpu_names)]
    nodes += [Node(name, "switch") for name in switch_names]
    nodes += [Node("spine", "switch", switch_reduction=1.0 if sharp else None)]
    links += [Link(name, switch_names[w % gpus if shape == "rail" else w // gpus], nic_bw, lat[1], kind=net_kind)
              for w, name in enumerate(gpu_names)]
    per_switch = machines if shape == "rail" else gpus            # NICs under one rail / rack switch
    links += [Link(name, "spine", per_switch * nic_bw / over, lat[2], kind=net_kind) for name in switch_names]
    return nodes, links


def format_rate(bandwidth: float) -> str:
    """``format_rate(450e9)`` is '450GB/s'."""
    return f"{bandwidth / 1e9:g}GB/s"
