"""What a GPU machine adds to the links: the rate a link delivers to NCCL's kernels, the
protocols (LL, LL128, Simple) that move data over it, and what each step costs.

Every constant comes from NCCL's own cost model (github.com/NVIDIA/nccl, ``src/graph/topo.h``
and ``src/graph/tuning.cc``, read at its master of 2026-06); docs/validation.md states them
again beside the measurements they are checked against.

- **Link kinds** (``LINK_KINDS``): a link's nominal rate per direction (what its datasheet
  says) times the share NCCL's kernels get of it. NVLink moves 128-byte payloads from the
  SMs, which NCCL counts as 20 GB/s of a 25 GB/s NVLink 2/3 link, 20.6 GB/s of NVLink 4's 25
  and 40.1 GB/s of NVLink 5's 50 (``SM70/80/90/100_NVLINK_BW``); PCIe as 12 GB/s of Gen3 x16's
  15.75 (``PCI_BW``, the same share at Gen4 and Gen5); a network port as 12 GB/s of 100
  Gbit/s (``NET_BW``).
- **Protocols** (``PROTOCOLS``): the bytes of payload per byte on the wire (Simple 1; LL128
  0.92, NCCL's factor for its 120 payload bytes in 128; LL 0.5, 4 bytes of flag per 4 of
  data), the latency of one collective (``baseLat``: kernel launch and set-up) and of one
  step across a link of each class (``hwLat``: the flags and the proxy of one step), Ring's
  rows of the tables. Tree's rows differ by at most 20% and are not used apart.
- **Sends are posted, not waited for**: NCCL's sender writes into the receiver's buffer slots
  (8 per connection) and moves on; a GPU topology's schedules are simulated so (a sender's
  round ends when its bytes have left, ``GpuModel.eager``), where a topology of hosts waits
  for the receiver as Gloo does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import ConfigError, TopologyError

NVLINK, PCIE, NET = "nvlink", "pcie", "net"
NVLS_LATENCY = 25e-6       # NCCL's hwLat for NVLS over NVLink (Simple): the multicast set-up, once per collective
PCIE_X16 = {3: 15.75e9, 4: 31.5e9, 5: 63.0e9}     # bytes/s per direction of an x16 slot (128b/130b coding)
CLASSES = (NVLINK, PCIE, NET)           # the latency classes of hwLat, least to most
US = 1e-6


@dataclass(frozen=True)
class LinkKind:
    """A kind of link: its latency class and the share of its nominal rate NCCL's kernels get."""

    cls: str
    efficiency: float
    source: str


LINK_KINDS = {
    "nvlink2": LinkKind(NVLINK, 20.0 / 25, "SM70_NVLINK_BW 20 GB/s of 25 (V100)"),
    "nvlink3": LinkKind(NVLINK, 20.0 / 25, "SM80_NVLINK_BW 20 GB/s of 25 (A100)"),
    "nvlink4": LinkKind(NVLINK, 20.6 / 25, "SM90_NVLINK_BW 20.6 GB/s of 25 (H100, H200)"),
    "nvlink5": LinkKind(NVLINK, 40.1 / 50, "SM100_NVLINK_BW 40.1 GB/s of 50 (B200, GB200)"),
    "pcie": LinkKind(PCIE, 12.0 / 15.75, "PCI_BW 12 GB/s of PCIe Gen3 x16's 15.75 (same share at Gen4, Gen5)"),
    "net": LinkKind(NET, 12.0 / 12.5, "NET_BW 12 GB/s of 100 Gbit/s (InfiniBand, RoCE)"),
    "ethernet": LinkKind(NET, 12.0 / 12.5, "NET_BW 12 GB/s of 100 Gbit/s (TCP sockets alike)"),
}


@dataclass(frozen=True)
class Protocol:
    """One of NCCL's protocols: payload bytes per wire byte, latency per collective and per step."""

    name: str
    efficiency: float
    base: float                          # seconds, once per collective
    step: dict                           # seconds per step, by latency class
    exposed_net: float = 0.0             # a network step with one GPU per machine (nothing hides it)

    def step_latency(self, cls: str, exposed: bool = False) -> float:
        return self.exposed_net if exposed and cls == NET else self.step[cls]


# NCCL's Ring rows of hwLat; with one GPU per machine NCCL charges a network step Tree's row
# ("With ppn=1 latencies are fully exposed, use the Tree network latency").
PROTOCOLS = {
    "ll": Protocol("ll", 0.5, 6.6 * US, {NVLINK: 0.6 * US, PCIE: 1.0 * US, NET: 2.7 * US}, 5.0 * US),
    "ll128": Protocol("ll128", 0.92, 14.0 * US, {NVLINK: 1.9 * US, PCIE: 2.5 * US, NET: 4.0 * US}, 8.5 * US),
    "simple": Protocol("simple", 1.0, 8.4 * US, {NVLINK: 3.4 * US, PCIE: 5.7 * US, NET: 14.0 * US}, 14.0 * US),
}
# NCCL's llMaxBws (GB/s): the most an LL all-reduce moves per GPU (its bus bandwidth), by GPU
# generation on one machine, by CPU across 2 or more machines (LL's flags go through the proxy).
LL_MAX_ONE_MACHINE = {70: 39.0, 80: 87.7, 90: 141.0, 100: 282.0}
LL_MAX_MACHINES = {"intel": (39.0, 20.4), "amd": (22.5, 19.0)}   # (2 machines, 3 or more)
SOCKET_LINKS = {      # NCCL's topo.h: what GPU traffic gets between two CPU sockets, bytes/s
    "broadwell": 6e9, "skylake": 10e9, "sapphire-rapids": 22e9, "emerald-rapids": 40e9, "amd": 16e9}


@dataclass(frozen=True)
class GpuModel:
    """A GPU machine's costs beyond its links: the protocols it offers (LL128 only where NCCL
    enables it: NVLink inside the machine) and the one used when none is asked for.

    >>> GpuModel().protocol(None).name, GpuModel(protocols=("ll", "simple")).names
    ('simple', ('ll', 'simple'))
    """

    protocols: tuple[str, ...] = ("ll", "ll128", "simple")
    default: str = "simple"
    eager: bool = True
    notes: tuple[str, ...] = field(default=())   # what the model says of this machine (e.g. no peer-to-peer)
    compcap: int = 90                            # the GPUs' compute capability x 10 (NCCL's tables differ by it)
    exposed_network: bool = False                # one GPU per machine: network steps at their exposed latency
    cpu: str = "intel"                           # the machines' CPUs (NCCL's LL limits across machines differ)

    def ll_limit(self, machines: int) -> float:
        """The most a GPU moves in and out together with LL, in wire bytes/s: NCCL's llMaxBw (a
        bus bandwidth: payload per direction) x 2 directions x 2 wire bytes per payload byte.

        >>> GpuModel().ll_limit(1) / 1e9, GpuModel().ll_limit(4) / 1e9
        (564.0, 81.6)
        """
        if machines <= 1:
            generation = max((g for g in LL_MAX_ONE_MACHINE if self.compcap >= g), default=70)
            per = LL_MAX_ONE_MACHINE[generation]
        else:
            per = LL_MAX_MACHINES["amd" if self.cpu == "amd" else "intel"][0 if machines == 2 else 1]
        return 4 * per * 1e9

    @property
    def names(self) -> tuple[str, ...]:
        return self.protocols

    def protocol(self, name: str | None) -> Protocol:
        """The protocol ``name`` (None: the default), refused if this machine does not offer it."""
        name = self.default if name is None else name
        if name not in self.protocols:
            raise ConfigError(f"protocol {name!r} is not offered here: expected one of {', '.join(self.protocols)}")
        return PROTOCOLS[name]


def link_efficiency(kind: str | None) -> float:
    """The share of a link's nominal rate NCCL's kernels get: ``link_efficiency("nvlink4")`` is 0.824."""
    if kind is None:
        return 1.0
    return LINK_KINDS[kind].efficiency


def link_class(kind: str | None) -> int:
    """The latency class of a link kind as an index into ``CLASSES`` (-1: no kind)."""
    return -1 if kind is None else CLASSES.index(LINK_KINDS[kind].cls)


def check_kind(kind) -> str | None:
    """``kind`` if it is None or a known link kind, else ConfigError naming the known ones."""
    if kind is not None and kind not in LINK_KINDS:
        raise ConfigError(f"link kind {kind!r}: expected one of {', '.join(LINK_KINDS)}")
    return kind


@dataclass(frozen=True)
class Gpu:
    """One GPU model's links, from its datasheet."""

    title: str
    nvlink: str | None          # link kind of its NVLinks
    links: int                  # NVLinks per GPU
    link_rate: float            # nominal bytes/s per NVLink and direction
    pcie: int                   # PCIe generation of its x16 host link
    nvls: float | None          # NVLink SHARP: NCCL's nvlsEfficiency for it (None: no NVLS)
    compcap: int                # compute capability x 10, for NCCL's own tables

    @property
    def nvlink_rate(self) -> float:
        return self.links * self.link_rate


GPUS = {
    "v100": Gpu("V100 SXM2", "nvlink2", 6, 25e9, 3, None, 70),      # datasheet: 300 GB/s in both directions
    "a100": Gpu("A100 SXM4", "nvlink3", 12, 25e9, 4, None, 80),     # 600 GB/s
    "a100-pcie": Gpu("A100 PCIe", "nvlink3", 12, 25e9, 4, None, 80),  # NVLink bridge: 600 GB/s over 3 bridges
    "h800": Gpu("H800 SXM5", "nvlink4", 8, 25e9, 5, 0.85, 90),      # 400 GB/s
    "h20": Gpu("H20", "nvlink4", 18, 25e9, 5, 0.85, 90),            # 900 GB/s
    "h100": Gpu("H100 SXM5", "nvlink4", 18, 25e9, 5, 0.85, 90),     # 900 GB/s
    "h200": Gpu("H200 SXM", "nvlink4", 18, 25e9, 5, 0.85, 90),      # 900 GB/s
    "b200": Gpu("B200", "nvlink5", 18, 50e9, 5, 0.74, 100),         # 1.8 TB/s
    "gb10": Gpu("GB10 (DGX Spark)", None, 0, 0.0, 5, None, 121),      # one GPU per machine, no NVLink to another
    "rtx4090": Gpu("GeForce RTX 4090", None, 0, 0.0, 4, None, 89),  # PCIe only, no peer-to-peer in the driver
    "rtx5090": Gpu("GeForce RTX 5090", None, 0, 0.0, 5, None, 120),
}


def gpu_spec(name: str) -> Gpu:
    """The GPU called ``name`` (``gpu_spec("h100").links`` is 18), or TopologyError naming the known ones."""
    if name not in GPUS:
        raise TopologyError(f"gpu: expected one of {', '.join(GPUS)}, got {name!r}")
    return GPUS[name]
