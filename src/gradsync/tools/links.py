"""Slow links between local workers: Linux network namespaces, veth pairs and tc.

Each worker (or each machine of ``per_node`` workers, which then share its namespace and talk
to each other inside it, as processes on one host do) gets its own network namespace with one
interface (eth0), joined by a veth pair to a bridge in a switch namespace. Both ends of every pair are shaped with a token bucket
(tc tbf), so each link is full duplex at the given rate. Everything is created and removed
by gradsync (root needed); names carry the creating process's id, and namespaces left by a
process that no longer exists are removed at the next start. Only addresses inside these
namespaces are used (10.213.0.0/24).

Example (as root)::

    with SlowLinks(4, "100Mbit") as net:
        run(body, 4, network=net)
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..units import parse_bandwidth

SUBNET = "10.213.0"
CLONE_NEWNET = 0x40000000
PORT = 29500


def _ip(*args, ns: str | None = None, check=True):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    out = subprocess.run(cmd, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise ConfigError(f"slow-link setup failed: {' '.join(cmd)}: {out.stderr.strip()}")
    return out


def _stale_namespaces():
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for name in listed:
        if name.startswith("gs") and "-" in name:
            pid = name[2:].split("-")[0]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                yield name


def has_netem() -> bool:
    """Whether this kernel can delay packets (netem); it is absent on some."""
    probe = f"gsnetem{os.getpid()}"
    _ip("ip", "netns", "add", probe, check=False)
    try:
        out = _ip("tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms", ns=probe, check=False)
        return out.returncode == 0
    finally:
        _ip("ip", "netns", "del", probe, check=False)


@dataclass
class SlowLinks:
    """Context manager giving ``workers`` workers, ``per_node`` to a namespace (an emulated
    machine), on a shaped switch (see the module docstring)."""

    workers: int
    bandwidth: str
    latency: str | None = None
    namespaces: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    interface: str = "eth0"
    port: int = PORT
    queue_ms: int = 100           # tbf's queue, in time at the link's rate
    # Linux restarts TCP slow start on a connection idle for one RTO (the kernel default);
    # clusters tuned for collectives often turn that off, and algorithms with many short
    # rounds feel it most (docs/experiments.md)
    idle_slow_start: bool = True
    per_node: int = 1
    switch: str = ""              # the switch's namespace; its bridge answers at switch_address

    def __post_init__(self):
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or not 1 <= self.workers <= 250:
            raise ConfigError(f"workers must be in 1..250 for slow links, got {self.workers!r}")
        if isinstance(self.per_node, bool) or not isinstance(self.per_node, int) or self.per_node < 1 \
                or self.workers % self.per_node:
            raise ConfigError(f"per_node must be a positive divisor of workers = {self.workers}, got {self.per_node!r}")
        self.rate = parse_bandwidth(self.bandwidth)

    @property
    def machines(self) -> int:
        """How many emulated machines (namespaces) the workers are on."""
        return self.workers // self.per_node

    @property
    def switch_address(self) -> str:
        """An address on the switch itself, outside every machine: for a service that must
        outlive any of them (the elastic rendezvous store)."""
        return f"{SUBNET}.254"

    def namespace_of(self, rank: int) -> str:
        """The namespace worker ``rank`` runs in (consecutive ranks share a machine)."""
        return self.namespaces[rank // self.per_node]

    def __enter__(self) -> "SlowLinks":
        if os.geteuid() != 0:
            raise ConfigError("slow-link emulation needs root (it creates network namespaces and tc qdiscs)")
        if self.latency is not None and not has_netem():
            raise ConfigError(f"link latency {self.latency!r} needs tc netem, which this kernel does not have; "
                              "only bandwidth can be emulated here")
        for name in _stale_namespaces():
            _ip("ip", "netns", "del", name, check=False)
        self._previous = signal.signal(signal.SIGTERM, _raise_exit)
        try:
            self._create()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _create(self):
        tag = self._tag = f"gs{os.getpid()}"
        switch = self.switch = f"{tag}-sw"
        self.namespaces = [f"{tag}-w{i}" for i in range(self.machines)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(self.machines)]
        self._all = [switch] + self.namespaces
        _ip("ip", "netns", "add", switch)
        _ip("ip", "link", "add", "br0", "type", "bridge", ns=switch)
        _ip("ip", "link", "set", "br0", "up", ns=switch)
        _ip("ip", "addr", "add", f"{self.switch_address}/24", "dev", "br0", ns=switch)
        _ip("ip", "link", "set", "lo", "up", ns=switch)       # a process there reaches its own address
        for i, ns in enumerate(self.namespaces):
            a, b = f"{tag}v{i}a", f"{tag}v{i}b"
            _ip("ip", "netns", "add", ns)
            _ip("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            _ip("ip", "link", "set", a, "netns", ns)
            _ip("ip", "link", "set", b, "netns", switch)
            _ip("ip", "link", "set", a, "name", self.interface, ns=ns)
            _ip("ip", "addr", "add", f"{self.addresses[i]}/24", "dev", self.interface, ns=ns)
            _ip("ip", "link", "set", self.interface, "up", ns=ns)
            _ip("ip", "link", "set", "lo", "up", ns=ns)
            if not self.idle_slow_start:
                _ip("sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=0", ns=ns)
            _ip("ip", "link", "set", b, "master", "br0", ns=switch)
            _ip("ip", "link", "set", b, "up", ns=switch)
            self._shape(i, self.rate, "add")

    def _shape(self, machine: int, rate: float, verb: str):
        # 1 ms of tokens: 10 ms (as before) let a 64 KB message through a 100 Mbit/s link at
        # 72 MB/s and a 1 MB one through 1 Gbit/s at 131 MB/s, faster than the link; the
        # kernel's high-resolution timers keep the rate with the smaller bucket (measured
        # 11.9 and 118 MB/s for 16 MB, as before)
        burst = max(32 * 1024, int(rate / 1000))
        for dev, where in ((self.interface, self.namespaces[machine]),
                           (f"{self._tag}v{machine}b", self.switch)):    # both directions
            _ip("tc", "qdisc", verb, "dev", dev, "root", "tbf", "rate", f"{int(rate * 8)}bit",
                "burst", str(burst), "latency", f"{self.queue_ms}ms", ns=where)

    def set_rate(self, machine: int, bandwidth: str) -> None:
        """Shape emulated machine ``machine``'s link (both directions) to ``bandwidth`` instead
        of the network's rate: a straggler's slow link. ``net.set_rate(3, "25Mbit")``."""
        if not self.namespaces:
            raise ConfigError("set_rate needs the network created (inside its with block)")
        if isinstance(machine, bool) or not isinstance(machine, int) or not 0 <= machine < self.machines:
            raise ConfigError(f"machine must be an integer in 0..{self.machines - 1}, got {machine!r}")
        self._shape(machine, parse_bandwidth(bandwidth), "change")

    def cut(self, machine: int) -> None:
        """Take emulated machine ``machine``'s link down at the switch: its processes live on,
        but nothing reaches them or leaves them (a failed cable or NIC). ``net.cut(1)``."""
        if not self.namespaces:
            raise ConfigError("cut needs the network created (inside its with block)")
        if isinstance(machine, bool) or not isinstance(machine, int) or not 0 <= machine < self.machines:
            raise ConfigError(f"machine must be an integer in 0..{self.machines - 1}, got {machine!r}")
        _ip("ip", "link", "set", f"{self._tag}v{machine}b", "down", ns=self.switch)

    def __exit__(self, *exc):
        for ns in getattr(self, "_all", []):
            _ip("ip", "netns", "del", ns, check=False)
        if hasattr(self, "_previous"):
            signal.signal(signal.SIGTERM, self._previous)
        return False


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


def enter(namespace: str) -> None:
    """Move the calling process (before it starts threads that use the network) into ``namespace``."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    with open(f"/var/run/netns/{namespace}") as fh:
        if libc.setns(fh.fileno(), CLONE_NEWNET) != 0:
            raise ConfigError(f"cannot enter network namespace {namespace}: errno {ctypes.get_errno()}")
