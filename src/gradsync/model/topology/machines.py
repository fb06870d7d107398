"""Real GPU machines from their nominal specs: link counts and rates as the datasheets give
them, the link kinds that say what NCCL's kernels get of each (``gpu.LINK_KINDS``), NVLink
SHARP where the NVSwitch has it.

- ``hgx-a100``, ``hgx-h100``, ``hgx-h200``: 8 GPUs (``gpus`` takes fewer) on NVSwitch, each
  GPU's NVLinks bonded into one link to it; Hopper's NVSwitch reduces (NVLS).
- ``gb200-nvl72``: 72 Blackwell GPUs in one NVLink domain (NVSwitch trays, NVLS).
- ``nvswitch``: any NVLink GPU of ``gpu.GPUS`` (``gpu=h800``, ``gpu=b200``) on NVSwitch.
- ``dgx-1``: 8 V100s in the hybrid cube-mesh of NVLink 2 (a DGX-1 or p3.16xlarge), with
  rings over every NVLink in both directions.
- ``nvlink-pair``: two PCIe GPUs joined by an NVLink bridge (``links`` NVLinks).
- ``pcie-server``: GPUs on PCIe only, with or without peer-to-peer (``p2p``).

Clusters of these are ``cluster:gpu=h100,...`` (model/topology/cluster.py). Link latencies are
left at zero: the protocol's per-step latency (NCCL's ``hwLat``) is what a step costs.

>>> from gradsync.model.topology import preset
>>> t = preset("hgx-h100")
>>> len(t.workers), t.links[0].kind, t.reducers
(8, 'nvlink4', ('nvswitch',))
"""

from __future__ import annotations

from ...errors import TopologyError
from ...units import parse_bandwidth
from .gpu import GPUS, NVLS_LATENCY, PCIE_X16, SOCKET_LINKS, Gpu, GpuModel, gpu_spec
from .model import Link, Node, Topology



def _count(what, value, low, high) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise TopologyError(f"{what}: expected an integer in {low}..{high}, got {value!r}")
    return value


def _protocols(gpu: Gpu, nvlink: bool, notes=()) -> GpuModel:
    """NCCL enables LL128 where the GPUs talk over NVLink (and on Hopper and later)."""
    ll128 = nvlink or gpu.compcap >= 90
    return GpuModel(protocols=("ll", "ll128", "simple") if ll128 else ("ll", "simple"), notes=tuple(notes),
                    compcap=gpu.compcap)


def nvswitch_machine(gpu: str = "h100", gpus: int = 8, nvls: bool | None = None, name: str | None = None,
                     most: int = 8) -> Topology:
    """``gpus`` GPUs of model ``gpu`` on one NVSwitch fabric (each GPU's NVLinks as one link to it),
    PCIe to the host CPU; NVLS where the GPU has it (``nvls``: None keeps the default).

    >>> nvswitch_machine("a100").reducers, round(nvswitch_machine("a100").channel_capacity[0] / 1e9)
    ((), 240)
    """
    spec, gpus = gpu_spec(gpu), _count("gpus", gpus, 1, most)
    if not spec.nvlink:
        raise TopologyError(f"gpu: {spec.title} has no NVLink; use pcie-server")
    nvls = bool(spec.nvls) if nvls is None else bool(nvls)
    if nvls and not spec.nvls:
        raise TopologyError(f"nvls: {spec.title}'s NVSwitch generation does not reduce (NVLS needs Hopper or later)")
    switch = Node("nvswitch", "switch", switch_reduction=spec.nvls if nvls else None,
                  collective_overhead=NVLS_LATENCY if nvls else None)
    nodes = [Node(f"gpu{i}", "gpu") for i in range(gpus)] + [switch, Node("cpu", "cpu")]
    links = [Link(f"gpu{i}", "nvswitch", spec.nvlink_rate, 0.0, kind=spec.nvlink) for i in range(gpus)]
    links += [Link(f"gpu{i}", "cpu", PCIE_X16[spec.pcie], 0.0, kind="pcie") for i in range(gpus)]
    title = name or f"hgx-{gpu}"
    return Topology(title, tuple(nodes), tuple(links), tuple(f"gpu{i}" for i in range(gpus)), host="cpu",
                    description=f"{gpus} {spec.title} on NVSwitch, {spec.links} NVLinks of "
                                f"{spec.link_rate / 1e9:g} GB/s per GPU" + (", NVLink SHARP" if nvls else ""),
                    gpu=_protocols(spec, True), reducers=("nvswitch",) if nvls else ())


def nvswitch(gpu: str = "h100", gpus: int = 8, nvls: bool | None = None) -> Topology:
    """Any GPU of ``gpu.GPUS`` with NVLink, ``gpus`` of them on one NVSwitch fabric (an HGX H800, a
    DGX B200): ``nvswitch:gpu=h800``."""
    return nvswitch_machine(gpu, gpus, nvls, name=f"nvswitch-{gpu}", most=72)


def hgx_a100(gpus: int = 8) -> Topology:
    """HGX / DGX A100: 8 A100 SXM4 on NVSwitch, 12 NVLinks of 25 GB/s each per GPU (no NVLS)."""
    return nvswitch_machine("a100", gpus)


def hgx_h100(gpus: int = 8, nvls: bool = True) -> Topology:
    """HGX / DGX H100: 8 H100 SXM5 on NVSwitch, 18 NVLinks of 25 GB/s per GPU, NVLink SHARP."""
    return nvswitch_machine("h100", gpus, nvls)


def hgx_h200(gpus: int = 8, nvls: bool = True) -> Topology:
    """HGX H200: the H100's NVLink 4 fabric (18 links of 25 GB/s per GPU), NVLink SHARP."""
    return nvswitch_machine("h200", gpus, nvls)


def gb200_nvl72(gpus: int = 72, nvls: bool = True) -> Topology:
    """GB200 NVL72: 72 Blackwell GPUs in one NVLink 5 domain, 18 links of 50 GB/s per GPU, NVLS."""
    return nvswitch_machine("b200", gpus, nvls, name="gb200-nvl72", most=72)


# The V100 hybrid cube-mesh (DGX-1, p3.16xlarge): NVLinks per GPU pair, as nvidia-smi topo -m shows it.
CUBE_MESH = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2,
             (2, 3): 2, (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2,
             (5, 7): 1, (6, 7): 2}
DOUBLE_RING = (0, 3, 2, 1, 5, 6, 7, 4)      # every hop over a doubled link
SINGLE_RING = (0, 1, 3, 7, 5, 4, 6, 2)      # every hop over a single link


def dgx_1() -> Topology:
    """DGX-1 (V100): the cube-mesh of NVLink 2 (25 GB/s per link and direction), PCIe Gen3 to
    two CPUs. Its rings cover all six NVLinks of every GPU in both directions: the doubled-link
    cycle and the single-link cycle, each forwards and backwards (weights 2, 2, 1, 1)."""
    spec = GPUS["v100"]
    gpus = [Node(f"gpu{i}", "gpu") for i in range(8)]
    others = [Node("cpu0", "cpu"), Node("cpu1", "cpu")] + [Node(f"pcie{i}", "switch") for i in range(4)]
    links = [Link(f"gpu{a}", f"gpu{b}", n * spec.link_rate, 0.0, kind="nvlink2") for (a, b), n in CUBE_MESH.items()]
    links += [Link(f"gpu{i}", f"pcie{i // 2}", PCIE_X16[3], 0.0, kind="pcie") for i in range(8)]
    links += [Link(f"pcie{i}", f"cpu{i // 2}", PCIE_X16[3], 0.0, kind="pcie") for i in range(4)]
    links += [Link("cpu0", "cpu1", 20.8e9, 0.0, kind="pcie")]          # UPI: 2 x 10.4 GT/s
    rings = (DOUBLE_RING, DOUBLE_RING[::-1], SINGLE_RING, SINGLE_RING[::-1])
    return Topology("dgx-1", tuple(gpus + others), tuple(links), tuple(g.name for g in gpus), host="cpu0",
                    rings=rings, ring_weights=(2.0, 2.0, 1.0, 1.0),
                    description="DGX-1: 8 V100 in the NVLink 2 hybrid cube-mesh (6 links of 25 GB/s per GPU)",
                    gpu=_protocols(spec, True))


def nvlink_pair(gpu: str = "a100-pcie", links: int = 12) -> Topology:
    """Two PCIe GPUs joined by an NVLink bridge of ``links`` NVLinks (NV12 for A100 PCIe's three
    bridges), each on an x16 slot to the host CPU."""
    spec = gpu_spec(gpu)
    links = _count("links", links, 1, 18)
    if not spec.nvlink:
        raise TopologyError(f"gpu: {spec.title} has no NVLink")
    nodes = (Node("gpu0", "gpu"), Node("gpu1", "gpu"), Node("cpu", "cpu"))
    edges = (Link("gpu0", "gpu1", links * spec.link_rate, 0.0, kind=spec.nvlink),
             Link("gpu0", "cpu", PCIE_X16[spec.pcie], 0.0, kind="pcie"),
             Link("gpu1", "cpu", PCIE_X16[spec.pcie], 0.0, kind="pcie"))
    return Topology("nvlink-pair", nodes, edges, ("gpu0", "gpu1"), host="cpu",
                    description=f"2 {spec.title} on an NVLink bridge (NV{links}), PCIe Gen{spec.pcie} to the CPU",
                    gpu=_protocols(spec, True))


def pcie_server(gpus: int = 8, gpu: str = "rtx4090", gen: int | None = None, p2p: bool = False,
                per_switch: int = 1, memory=None, sockets: int = 1, cpu: str = "sapphire-rapids") -> Topology:
    """``gpus`` GPUs on PCIe only: ``per_switch`` of them behind each PCIe switch, whose x16
    uplink joins its CPU (1: every GPU on a root port of its own); ``sockets`` CPUs, the GPUs
    split evenly between them, joined at what NCCL counts for ``cpu``'s socket link
    (``gpu.SOCKET_LINKS``). Without peer-to-peer every transfer between GPUs is written to the
    sender's socket's memory and read from there; ``memory`` (e.g. "200GB/s") limits what each
    socket's memory moves, both ways together."""
    spec, gpus = gpu_spec(gpu), _count("gpus", gpus, 1, 64)
    gen = spec.pcie if gen is None else gen
    if gen not in PCIE_X16:
        raise TopologyError(f"gen: expected a PCIe generation in {', '.join(map(str, PCIE_X16))}, got {gen!r}")
    per_switch, sockets = _count("per_switch", per_switch, 1, gpus), _count("sockets", sockets, 1, 8)
    if cpu not in SOCKET_LINKS:
        raise TopologyError(f"cpu: expected one of {', '.join(SOCKET_LINKS)}, got {cpu!r}")
    mem = parse_bandwidth(memory) / 2 if memory is not None else None     # each byte is written, then read
    nodes = [Node(f"gpu{i}", "gpu") for i in range(gpus)] + [Node(f"cpu{k}", "cpu", copy_rate=mem)
                                                              for k in range(sockets)]
    links = [Link(f"cpu{k}", f"cpu{k + 1}", SOCKET_LINKS[cpu], 0.0) for k in range(sockets - 1)]
    nodes, links = _pcie_tree(nodes, links, gpus, per_switch, sockets, PCIE_X16[gen])
    notes = () if p2p else ("no peer-to-peer: every transfer between GPUs is written to host memory and read "
                            "back, crossing PCIe twice",)
    return Topology("pcie-server", tuple(nodes), tuple(links), tuple(f"gpu{i}" for i in range(gpus)), host="cpu0",
                    description=f"{gpus} {spec.title} on PCIe Gen{gen} x16"
                                + (f", {per_switch} per switch" if per_switch > 1 else "")
                                + (f", {sockets} sockets ({cpu})" if sockets > 1 else "")
                                + ("" if p2p else ", no peer-to-peer"),
                    gpu=_protocols(spec, False, notes), p2p=p2p)


def _pcie_tree(nodes, links, gpus, per_switch, sockets, rate):
    """GPUs on their sockets' PCIe: on root ports, or ``per_switch`` to a PCIe switch."""
    socket = [i * sockets // gpus for i in range(gpus)]
    if per_switch == 1:
        return nodes, links + [Link(f"gpu{i}", f"cpu{socket[i]}", rate, 0.0, kind="pcie") for i in range(gpus)]
    switches = -(-gpus // per_switch)
    nodes = nodes + [Node(f"plx{s}", "switch") for s in range(switches)]
    links = links + [Link(f"gpu{i}", f"plx{i // per_switch}", rate, 0.0, kind="pcie") for i in range(gpus)]
    links += [Link(f"plx{s}", f"cpu{socket[s * per_switch]}", rate, 0.0, kind="pcie") for s in range(switches)]
    return nodes, links
