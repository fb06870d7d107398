"""Built-in topologies. Bandwidths per direction, decimal units (1 GB/s = 10**9 bytes/s).

GPU presets leave reduction compute free (D2L's arithmetic counts links only); the
Ethernet presets give hosts a reduce rate so that encode/decode work shows in CERAR's cost.
"""

from __future__ import annotations

import inspect

from ...errors import TopologyError
from ...units import parse_bandwidth, parse_time
from .cluster import cluster
from .machines import dgx_1, gb200_nvl72, hgx_a100, hgx_h100, hgx_h200, nvlink_pair, nvswitch, pcie_server
from .model import Link, Node, Topology

PCIE = 16e9            # D2L's PCIe 3.0 x16 figure
NVLINK = 18e9          # D2L's V100 NVLink figure, per link and direction
CPU_REDUCE_RATE = 2e9  # elements/s a host core sums (memory bound, float32)
CPU_MADD_RATE = 2.5e10 # multiply-adds/s in CERAR's skinny products (measured: 2 cores, float32)


def _count(what: str, value, most: int) -> int:
    """``value`` if it is an integer in 1..``most``, else TopologyError naming it: ``_count("gpus", 4, 64)``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise TopologyError(f"{what}: expected an integer in 1..{most}, got {value!r}")
    return value


def pcie_switch(gpus: int = 4) -> Topology:
    """D2L's 4-GPU server: GPUs and the CPU each on a 16 GB/s link to one PCIe switch."""
    gpus = _count("gpus", gpus, 64)
    nodes = [Node(f"gpu{i}", "gpu") for i in range(gpus)] + [Node("cpu", "cpu"), Node("switch", "switch")]
    links = [Link(n.name, "switch", PCIE, 1e-6) for n in nodes[:-1]]
    return Topology(f"pcie-switch-{gpus}", tuple(nodes), tuple(links),
                    tuple(f"gpu{i}" for i in range(gpus)), host="cpu",
                    description=f"{gpus} GPUs and the host CPU, each on a 16 GB/s link to one PCIe switch")


# The V100 hybrid cube-mesh of a p3.16xlarge / DGX-1: NVLinks per GPU pair (nvidia-smi topo -m).
_CUBE_MESH = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2,
              (2, 3): 2, (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2,
              (5, 7): 1, (6, 7): 2}
_DOUBLE_RING = (0, 3, 2, 1, 5, 6, 7, 4)   # over the doubled links: 36 GB/s a hop
_SINGLE_RING = (0, 1, 3, 7, 5, 4, 6, 2)   # over the single links: 18 GB/s a hop


def p3_16xlarge() -> Topology:
    """8 V100s in the hybrid cube-mesh: 6 NVLinks of 18 GB/s per GPU; PCIe to two CPUs.

    Two rings cover all NVLinks: one over the doubled links and one over the single links,
    3 x 18 GB/s out of every GPU, D2L's figure.
    """
    gpus = [Node(f"gpu{i}", "gpu") for i in range(8)]
    others = [Node("cpu0", "cpu"), Node("cpu1", "cpu")] + [Node(f"pcie{i}", "switch") for i in range(4)]
    links = [Link(f"gpu{a}", f"gpu{b}", n * NVLINK, 2e-6) for (a, b), n in _CUBE_MESH.items()]
    links += [Link(f"gpu{i}", f"pcie{i // 2}", PCIE, 1e-6) for i in range(8)]
    links += [Link(f"pcie{i}", f"cpu{i // 2}", PCIE, 1e-6) for i in range(4)]
    links += [Link("cpu0", "cpu1", 20e9, 1e-6)]
    return Topology("p3.16xlarge", tuple(gpus + others), tuple(links),
                    tuple(g.name for g in gpus), host="cpu0",
                    rings=(_DOUBLE_RING, _SINGLE_RING), ring_weights=(2.0, 1.0),
                    description="8 V100 GPUs, NVLink hybrid cube-mesh (18 GB/s per link), PCIe to 2 CPUs")


def dgx_2() -> Topology:
    """16 V100s on NVSwitch: 6 NVLinks of 25 GB/s each (150 GB/s) per GPU into the fabric."""
    gpus = [Node(f"gpu{i}", "gpu") for i in range(16)]
    others = [Node("nvswitch", "switch"), Node("cpu", "cpu"), Node("pcie", "switch")]
    links = [Link(g.name, "nvswitch", 150e9, 1e-6) for g in gpus]
    links += [Link(g.name, "pcie", PCIE, 1e-6) for g in gpus] + [Link("pcie", "cpu", 2 * PCIE, 1e-6)]
    return Topology("dgx-2", tuple(gpus + others), tuple(links), tuple(g.name for g in gpus),
                    host="cpu", description="16 V100 GPUs on NVSwitch, 150 GB/s per GPU")


def ethernet(workers: int = 8, nic="10Gbit/s", latency="10us") -> Topology:
    """``workers`` hosts and one parameter-server host on one Ethernet switch."""
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 65536:
        raise TopologyError(f"workers: expected an integer in 1..65536, got {workers!r}")
    bw, lat = parse_bandwidth(nic), parse_time(latency)
    hosts = [Node(f"host{i}", "host", CPU_REDUCE_RATE, CPU_MADD_RATE) for i in range(workers)]
    nodes = hosts + [Node("ps", "cpu", CPU_REDUCE_RATE, CPU_MADD_RATE), Node("switch", "switch")]
    links = [Link(n.name, "switch", bw, lat) for n in nodes[:-1]]
    return Topology("ethernet", tuple(nodes), tuple(links), tuple(h.name for h in hosts), host="ps",
                    description=f"{workers} hosts on one switch, {nic} NICs, {latency} per hop")


def lowbw_cluster(servers: int = 2, gpus: int = 4, nic="1Gbit/s") -> Topology:
    """``servers`` PCIe servers of ``gpus`` GPUs each, joined by slow Ethernet (default 1 Gbit/s)."""
    servers, gpus = _count("servers", servers, 1024), _count("gpus", gpus, 64)
    bw = parse_bandwidth(nic)
    nodes, links, workers = [Node("switch", "switch"), Node("ps", "cpu", CPU_REDUCE_RATE, CPU_MADD_RATE)], [], []
    links.append(Link("ps", "switch", bw, 25e-6))
    for s in range(servers):
        nodes += [Node(f"s{s}-pcie", "switch"), Node(f"s{s}-nic", "nic")]
        links += [Link(f"s{s}-nic", "switch", bw, 25e-6), Link(f"s{s}-nic", f"s{s}-pcie", PCIE, 1e-6)]
        for g in range(gpus):
            nodes.append(Node(f"s{s}-gpu{g}", "gpu"))
            links.append(Link(f"s{s}-gpu{g}", f"s{s}-pcie", PCIE, 1e-6))
            workers.append(f"s{s}-gpu{g}")
    return Topology("lowbw-cluster", tuple(nodes), tuple(links), tuple(workers), host="ps",
                    description=f"{servers} servers x {gpus} GPUs on PCIe, {nic} Ethernet between")


def ring(workers: int = 8, link="18GB/s", latency="2us") -> Topology:
    """``workers`` GPUs in a physical ring (NVLink-like links), and a host CPU on PCIe to each."""
    if isinstance(workers, bool) or not isinstance(workers, int) or not 2 <= workers <= 4096:
        raise TopologyError(f"workers: expected an integer in 2..4096, got {workers!r}")
    bw, lat = parse_bandwidth(link), parse_time(latency)
    gpus = [Node(f"gpu{i}", "gpu") for i in range(workers)]
    links = [Link(f"gpu{i}", f"gpu{(i + 1) % workers}", bw, lat) for i in range(workers if workers > 2 else 1)]
    links += [Link(g.name, "cpu", PCIE, 1e-6) for g in gpus]
    return Topology("ring", tuple(gpus + [Node("cpu", "cpu")]), tuple(links), tuple(g.name for g in gpus),
                    host="cpu", description=f"{workers} GPUs in a ring ({link} links), host CPU on PCIe")


PRESETS = {
    "ring": ring,
    "pcie-switch-4": pcie_switch,
    "p3.16xlarge": p3_16xlarge,
    "dgx-2": dgx_2,
    "ethernet": ethernet,
    "lowbw-cluster": lowbw_cluster,
    "cluster": cluster,
    # real machines from their nominal specs (machines.py): NCCL's link efficiencies and protocols
    "dgx-1": dgx_1,
    "hgx-a100": hgx_a100,
    "hgx-h100": hgx_h100,
    "hgx-h200": hgx_h200,
    "gb200-nvl72": gb200_nvl72,
    "nvswitch": nvswitch,
    "nvlink-pair": nvlink_pair,
    "pcie-server": pcie_server,
}
PARAMETRIC = {"ethernet": 8, "ring": 8, "cluster": None}   # presets whose worker count is a parameter (default)
GPU_COUNT = ("hgx-a100", "hgx-h100", "hgx-h200", "gb200-nvl72", "nvswitch", "pcie-server")   # workers: the machine's GPUs


def preset(name: str, workers: int | None = None, **params) -> Topology:
    """Build preset ``name``; ``workers`` sizes a parametric preset or takes the first devices.

    >>> preset("ethernet", workers=16).workers[-1]
    'host15'
    """
    if not isinstance(name, str) or name not in PRESETS:
        raise TopologyError(f"unknown topology preset {name!r}: expected one of {', '.join(PRESETS)} "
                            "or a .toml/.json/.yaml file")
    known = [p for p in inspect.signature(PRESETS[name]).parameters if p != "workers"]
    for key in params:
        if key not in known:
            raise TopologyError(f"unknown parameter {key!r} for preset {name!r}: expected "
                                + (", ".join(known) if known else "none"))
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)):
        raise TopologyError(f"workers: expected an integer, got {workers!r}")
    if name in PARAMETRIC:
        return PRESETS[name](workers=PARAMETRIC[name] if workers is None else workers, **params)
    if name in GPU_COUNT and workers is not None and "gpus" not in params:
        return PRESETS[name](gpus=workers, **params)
    topo = PRESETS[name](**params)
    return topo if workers is None else topo.with_workers(workers)
