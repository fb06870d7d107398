"""Which ranks of a group share a host, learned through the group itself.

Each rank describes its host by an identity: the host name, the kernel's boot id (two machines
cloned with one name differ there) and the device and inode of /dev/shm (two containers of one
machine with private /dev/shm mounts differ there, and cannot share segments). The ranks
exchange a digest of it, fixed-size bytes through the group's rendezvous store (never pickled
objects), once per group. ``GRADSYNC_HOST`` overrides the identity: ranks that set the same
value count as one host and ranks with different values as different hosts, whatever the
machine (how tests and benchmarks emulate several machines on one).

What reads it: the transport ``"auto"`` (shared memory when all ranks share one host, shared
memory inside each host and the engine across when the group spans hosts) and the hierarchical
all-reduce's ``local_size`` when no launcher says how many ranks share a machine.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import socket
import struct
from dataclasses import dataclass

from ...errors import PeerError
from ..state import group_state
from .shm.segment import start_time
from .base import group_key, group_name, store_prefix

OVERRIDE = "GRADSYNC_HOST"
IDENTITY_BYTES = 96             # 32 hex digits of digest, a space, the host name (cut, padded)
RECORD_BYTES = IDENTITY_BYTES + 16      # and the process: pid, start time
log = logging.getLogger("gradsync")


def identity() -> bytes:
    """This process's host identity, IDENTITY_BYTES long: a digest of host name, boot id and
    /dev/shm's device, then the host name for messages (``GRADSYNC_HOST`` replaces both).

    >>> len(identity()) == IDENTITY_BYTES
    True
    """
    override = os.environ.get(OVERRIDE, "")
    name = override or socket.gethostname()
    if override:
        key = "override\0" + override
    else:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                boot = f.read().strip()
        except OSError:
            boot = ""
        try:
            st = os.stat("/dev/shm")
            shm = f"{st.st_dev}:{st.st_ino}"
        except OSError:
            shm = ""
        key = "\0".join((name, boot, shm))
    text = hashlib.sha256(key.encode()).hexdigest()[:32] + " " + name
    return text.encode()[:IDENTITY_BYTES].ljust(IDENTITY_BYTES, b"\0")


@dataclass(frozen=True)
class HostMap:
    """Where a group's ranks run: ``host[r]`` is rank r's host index (hosts numbered in the
    order of their first rank), ``names[h]`` host h's name.

    >>> m = HostMap((0, 0, 1, 1), ("a", "b"))
    >>> m.hosts, m.ranks_on(1), m.local_size()
    (2, [2, 3], 2)
    """

    host: tuple[int, ...]
    names: tuple[str, ...]
    processes: tuple = ()      # (pid, start time) of each rank's process, where the ranks said

    @property
    def hosts(self) -> int:
        return len(self.names)

    def dead(self, r: int, here: int) -> bool:
        """Whether rank ``r``'s process is known to be gone, as seen from a rank on host
        ``here``: only a process of the same host can be looked at (its pid and start time).

        >>> import os
        >>> me = (os.getpid(), start_time(os.getpid()))
        >>> HostMap((0, 0), ("a",), (me, (2 ** 22 + 7, 1))).dead(1, 0), HostMap((0, 0), ("a",), (me, me)).dead(1, 0)
        (True, False)
        """
        if not self.processes or self.host[r] != here:
            return False
        pid, start = self.processes[r]
        return start_time(pid) != start

    def ranks_on(self, h: int) -> list[int]:
        """The ranks on host ``h``, in order."""
        return [r for r, x in enumerate(self.host) if x == h]

    def shared(self) -> bool:
        """Whether some host holds two ranks or more (something to share memory between)."""
        return len(self.host) > self.hosts

    def local_size(self) -> int | None:
        """Ranks per host when every host holds the same number of consecutive ranks (the
        hierarchical all-reduce's grouping), else None (``why_not`` says why)."""
        return None if self.why_not() else len(self.host) // self.hosts

    def why_not(self) -> str:
        """Why the ranks are not grouped as consecutive equal blocks per host ("" if they are)."""
        sizes = [len(self.ranks_on(h)) for h in range(self.hosts)]
        if len(set(sizes)) > 1:
            return "hosts hold different numbers of ranks (" + ", ".join(
                f"{self.names[h]}: {n}" for h, n in enumerate(sizes)) + ")"
        size = sizes[0]
        for r, h in enumerate(self.host):
            if h != r // size:
                return (f"rank {r} runs on {self.names[h]} but the ranks of one host are not consecutive "
                        f"(host of each rank: {list(self.host)})")
        return ""


def record() -> bytes:
    """What a rank tells the others about itself: its host's ``identity()``, then its process's
    pid and start time (8 bytes each), RECORD_BYTES long.

    >>> len(record()) == RECORD_BYTES
    True
    """
    pid = os.getpid()
    return identity() + struct.pack("<qq", pid, start_time(pid) or 0)


def from_identities(identities: list[bytes]) -> HostMap:
    """The ``HostMap`` of the ranks' identities (or full ``record``s), by rank.

    >>> from_identities([b"x1 a", b"y2 b", b"x1 a"]).host
    (0, 1, 0)
    """
    index: dict[str, int] = {}
    names: list[str] = []
    host, processes = [], []
    for raw in identities:
        raw = bytes(raw)
        if len(raw) == RECORD_BYTES:
            processes.append(struct.unpack("<qq", raw[IDENTITY_BYTES:]))
            raw = raw[:IDENTITY_BYTES]
        digest, _, name = raw.rstrip(b"\0").decode(errors="replace").partition(" ")
        if digest not in index:
            index[digest] = len(names)
            names.append(name or digest)
        host.append(index[digest])
    return HostMap(tuple(host), tuple(names), tuple(processes) if len(processes) == len(host) else ())


def host_map(group=None, timeout: float = 60.0) -> HostMap:
    """Where the ranks of a torch.distributed ``group`` run, exchanged once per group through
    its rendezvous store (every rank calls it: the first call of each waits for all), and kept
    in the group's state for that process group object. A rank that never comes is a
    ``PeerError`` naming it after ``timeout`` seconds.

    Example, in each rank after ``dist.init_process_group``: ``host_map().hosts`` is 1 when all
    ranks run on this machine.
    """
    import torch.distributed as dist

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    state = group_state(group_key(group))
    kept = state.kept("host map", pg)
    if kept is not None:
        return kept
    rank, size, name = dist.get_rank(group), dist.get_world_size(group), group_name(group)
    store = dist.distributed_c10d._get_default_store()
    n = state.advance("host exchanges")         # every rank exchanges alike: the same keys
    keys = [f"{store_prefix()}/hosts/{name}/{n}/{r}" for r in range(size)]
    try:
        store.set(keys[rank], record())
        store.wait(keys, datetime.timedelta(seconds=timeout))
        found = from_identities([store.get(k) for k in keys])
    except Exception:           # a rank never came, or rank 0 (the store's host) is gone
        try:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
        except Exception:
            raise PeerError(f"rank {rank}: rank 0 is unreachable (it hosts the rendezvous store) while the ranks "
                            f"compared hosts", peer=0, op="setup") from None
        raise PeerError(f"rank {rank}: rank(s) {missing} did not say which host they run on before the timeout",
                        peer=missing[0] if missing else None, op="setup") from None
    state.keep("host map", pg, found)
    return found


def host_map_kept(group=None) -> HostMap | None:
    """The group's host map if its ranks have exchanged it already, else None (no exchange).

    Example, in a rank of a group that has run a collective: ``host_map_kept().hosts``.
    """
    import torch.distributed as dist

    try:
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        return group_state(group_key(group)).kept("host map", pg)
    except (RuntimeError, ValueError):         # no default group, or one torch no longer knows
        return None


def launcher_local_size(workers: int) -> int | None:
    """Workers per machine as the launch says it: GRADSYNC_LOCAL_SIZE, else the launcher's
    variable (torchrun's and gradsync's own LOCAL_WORLD_SIZE, Open MPI's, Slurm's), if it
    divides ``workers``; None when none does (``local_size`` then asks the group).
    Example: with ``LOCAL_WORLD_SIZE=2`` in the environment, ``launcher_local_size(8)`` is 2."""
    for key in ("GRADSYNC_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(key, "").split("(")[0]              # srun writes e.g. 2(x3)
        if value.isdigit() and int(value) >= 1 and workers % int(value) == 0:
            return int(value)
    return None


_warned: set = set()          # reasons already logged (this module's; at most _WARNED_LIMIT kept)
_WARNED_LIMIT = 64


def local_size(workers: int, group=None, timeout: float = 60.0) -> int:
    """Ranks per machine for algorithms that group by machine: what the launcher says
    (``launcher_local_size``), else learned from the group (``host_map``). Ranks not
    placed in consecutive equal blocks per host count as one machine each (a warning says
    why). ``group=False``: no group to ask (MPI, threads): one machine.

    Example, in each rank of a 4-rank group on 2 hosts started without a launcher:
    ``local_size(4)`` is 2.
    """
    said = launcher_local_size(workers)
    if said is not None:
        return said
    if group is False:
        return workers
    import torch.distributed as dist

    if not dist.is_initialized():
        return workers
    found = host_map(group, timeout)
    size = found.local_size()
    if size is None:
        why = found.why_not()
        if why not in _warned:
            if len(_warned) < _WARNED_LIMIT:
                _warned.add(why)
            log.warning("gradsync: grouping by machine as one machine per rank: %s", why)
        return 1
    return size
