"""NCCL's own cost model (``src/graph/tuning.cc``, master of 2026-06), for comparison and to
say what NCCL's tuner would choose.

NCCL gives every (algorithm, protocol) a time ``latency + bytes / (1000 bandwidth)`` in
microseconds and GB/s, from small tables (``baseLat``, ``hwLat``, ``llMaxBws``, per-channel
caps) and three numbers its topology search finds: the channels and the bandwidth per channel
inside a machine (``bwIntra``) and across machines (``bwInter``). The search itself is not
reproduced: ``System.of`` derives them from a topology the way the search ends on the machines
it was written for (every NVLink and every NIC used), which docs/validation.md states. Only
all-reduce is modelled.

>>> s = System(nodes=128, ranks=1024, compcap=90, channels=16, bw_intra=23.2, bw_inter=25.0)
>>> round(time("ring", "simple", 1e9, s) * 1e3, 1), round(time("tree", "simple", 1e9, s) * 1e3, 2)
(18.5, 5.7)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALGORITHMS = ("tree", "ring", "nvls", "nvls_tree", "collnet_direct", "collnet_chain", "pat")
PROTOCOLS = ("ll", "ll128", "simple")
BASE_LAT = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0),
            "collnet_direct": (0, 0, 0), "collnet_chain": (0, 0, 0), "pat": (8.0, 8.0, 8.0)}
HW_LAT = {   # hwLatencies[NVLINK, PCI, NET][algorithm] = (LL, LL128, Simple), microseconds
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "collnet_direct": (0, 0, 3.7),
               "collnet_chain": (0, 0, 2.8), "nvls": (0, 0, 25), "nvls_tree": (0, 0, 25), "pat": (0, 0, 4.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "collnet_direct": (0, 0, 3.7),
            "collnet_chain": (0, 0, 2.8), "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0), "pat": (0, 0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14), "ring": (2.7, 4.0, 14.0), "collnet_direct": (0, 0, 31),
            "collnet_chain": (0, 0, 30), "nvls": (0, 0, 18), "nvls_tree": (0, 0, 20.9), "pat": (0, 0, 14)},
}
ARCH = {70: 0, 80: 1, 90: 2, 100: 3}     # Volta, Ampere, Hopper, Blackwell
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
PER_CH_RING_LL128 = ((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, (40.0,) * 3)
PER_CH_TREE_LL128 = ((20.0,) * 3, (20.0,) * 3, (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
PER_CH_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
PER_CH_NVLS_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 80.0))
NVLS_EFFICIENCY = (0.0, 0.0, 0.85, 0.74)
TREE_CORRECTION = (  # treeCorrectionFactor[protocol][log2(bytes / 64)]
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9))


@dataclass(frozen=True)
class System:
    """What NCCL's tuner reads: machines, GPUs, the GPUs' generation, the search's channels and
    bandwidths per channel (GB/s), whether the GPUs talk over NVLink, NVLS, and the network
    post overhead (1 us on Intel CPUs, 2 on AMD: ``getNetOverhead``)."""

    nodes: int
    ranks: int
    compcap: int = 90
    channels: int = 16
    bw_intra: float = 20.0
    bw_inter: float = 12.0
    nvlink: bool = True
    nvls: bool = False
    nvls_channels: int = 16
    net_overhead: float = 1.0
    amd: bool = False
    latency_inter: float = 0.0

    @classmethod
    def of(cls, topology, workers: int | None = None) -> "System":
        """What NCCL's search would find on ``topology`` (a GPU topology): every NVLink of a GPU
        inside a machine (its link's rate as NCCL counts it, ``gpu.LINK_KINDS``), every NIC
        across machines, 16 channels (NCCL's rings on NVSwitch and across machines: 2 per NIC
        of 8), NVLS where the machines' NVSwitch reduces.

        >>> from gradsync.model.topology import preset
        >>> s = System.of(preset("cluster", machines=128, gpu="h100"))
        >>> s.nodes, s.ranks, round(s.bw_intra, 1), round(s.bw_inter, 1), s.nvls
        (128, 1024, 23.2, 24.0, True)
        """
        import numpy as np
        workers = len(topology.workers) if workers is None else workers
        names = topology.workers[:workers]
        local = topology.machine_size(workers)
        nodes = workers // local if workers % local == 0 else 1
        channels = 16
        gpu = topology.gpu
        if local > 1:
            route, _ = topology.route(names[0], names[1])
            rings = len(topology.rings) if topology.rings and workers == len(topology.workers) else 1
            intra = float(topology.channel_capacity[route].min()) * (sum(topology.ring_weights) if rings > 1 else 1)
            nvlink = bool((topology.channel_class[route] == 0).all())
        else:
            intra, nvlink = 0.0, True
        inter = 0.0
        if nodes > 1:
            route, _ = topology.route(names[0], names[local])
            inter = float(topology.channel_capacity[route].min()) * local     # one NIC per GPU
        return cls(nodes=nodes, ranks=workers, compcap=gpu.compcap if gpu else 90, channels=channels,
                   bw_intra=(intra or inter) / channels / 1e9, bw_inter=(inter or intra) / channels / 1e9,
                   nvlink=nvlink, nvls=bool(topology.reducers), nvls_channels=channels)

    @property
    def arch(self) -> int:
        return ARCH[max(k for k in ARCH if self.compcap >= k)] if self.compcap >= 70 else 0


def bandwidth(algorithm: str, protocol: str, s: System) -> float:
    """NCCL's all-reduce algorithm bandwidth in GB/s (``ncclTopoTuneModel``); 0: not offered."""
    p, arch = PROTOCOLS.index(protocol), s.arch
    if algorithm in ("nvls", "nvls_tree") and (p != 2 or not s.nvls or (algorithm == "nvls_tree" and s.nodes == 1)
                                               or (algorithm == "nvls" and s.nodes > 1)):
        return 0.0
    if algorithm in ("collnet_direct", "collnet_chain", "pat"):
        return 0.0                                   # CollNet needs the SHARP plugin; PAT is not for all-reduce
    if p == 1 and not s.nvlink:
        return 0.0                                   # LL128 only where GPUs talk over NVLink
    index2 = min(s.nodes, 3) - 1
    bw = s.bw_intra if s.nodes <= 2 else s.bw_inter
    channels = s.channels
    if algorithm in ("nvls", "nvls_tree"):
        channels = s.nvls_channels
        intra = s.bw_intra * NVLS_EFFICIENCY[arch] * (channels - 1) / channels * 2.0
        inter = s.bw_inter * (2 if s.nodes <= 2 and algorithm == "nvls_tree" else 1)
        bw = min(intra, inter, PER_CH_NVLS_TREE[arch][index2] if algorithm == "nvls_tree" else math.inf)
    bus = channels * bw
    ll_max = LL_MAX_BW[arch if s.nodes == 1 else (1 if s.amd else 0)][index2]
    if algorithm == "ring" and p == 0:
        bus = min(ll_max, bus * 0.5)
    if algorithm == "ring" and p == 1:
        bus = min(bus * 0.92, channels * PER_CH_RING_LL128[arch][index2])
    if algorithm == "tree":
        bus = min(bus * 0.92, channels * PER_CH_TREE[arch][index2])
        if p == 0:
            bus = min(bus / 3.8, ll_max)
        if p == 1:
            bus = min(bus * (7.0 / 9.0 if s.nodes == 1 else 120.0 / 128.0), channels * PER_CH_TREE_LL128[arch][index2])
    steps = 2 * (s.ranks - 1)
    return bus * (s.ranks / steps if algorithm in ("ring", "nvls", "nvls_tree") else 0.5)


def latency(algorithm: str, protocol: str, s: System) -> float:
    """NCCL's all-reduce latency in microseconds (``ncclTopoTuneModel``)."""
    p = PROTOCOLS.index(protocol)
    intra_hw = "nvlink" if s.nvlink else "pci"
    intra = HW_LAT[intra_hw][algorithm][p]
    ppn = s.ranks / s.nodes
    inter = (HW_LAT["net"]["tree"][p] if ppn == 1 else HW_LAT["net"][algorithm][p]) + s.latency_inter
    if p == 2:
        inter += s.latency_inter
    lat = BASE_LAT[algorithm][p]
    if algorithm == "ring":
        net = s.net_overhead * (3 if p == 2 else 1) if s.nodes > 1 else 0.0
        steps, inter_steps = 2 * (s.ranks - 1), (0 if s.nodes == 1 else 2 * (s.nodes - 1))
        return lat + (steps - inter_steps) * max(intra, net) + inter_steps * inter
    if algorithm == "tree":
        return lat + 2 * ((s.ranks // s.nodes - 1) * intra + int(math.log2(s.nodes)) * inter)
    if algorithm == "nvls":
        return intra + (inter if s.nodes > 1 else 0.0)
    if algorithm == "nvls_tree":
        return lat + intra + 2 * int(math.log2(s.nodes)) * inter
    return lat


def time(algorithm: str, protocol: str, nbytes: float, s: System) -> float:
    """NCCL's predicted seconds for one all-reduce (``ncclTopoGetAlgoTime``); inf: not offered."""
    bw = bandwidth(algorithm, protocol, s)
    if bw <= 0:
        return math.inf
    lat = latency(algorithm, protocol, s)
    log_size = int(math.log2(max(int(nbytes) >> 6, 1))) if int(nbytes) >> 6 else -1
    if algorithm == "tree" and 0 <= log_size < 23:
        bw *= TREE_CORRECTION[PROTOCOLS.index(protocol)][log_size]
    if algorithm == "ring" and protocol == "simple" and s.nodes > 1 and nbytes / (s.channels * s.ranks) >= 64:
        lat *= 1.9 if s.compcap < 80 else 1.4            # the ring's "plateau"
    return (lat + nbytes / (1000 * bw)) * 1e-6


def choose(nbytes: float, s: System) -> tuple[str, str, float]:
    """NCCL's choice for an all-reduce of ``nbytes``: (algorithm, protocol, seconds).

    >>> choose(8192, System(nodes=1, ranks=8, compcap=90, nvls=True))[:2]
    ('ring', 'll')
    """
    best = min(((time(a, p, nbytes, s), a, p) for a in ALGORITHMS for p in PROTOCOLS), key=lambda x: x[0])
    return best[1], best[2], best[0]
