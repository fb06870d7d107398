"""NCCL's ring: several rings at once (channels), one per rail across machines.

NCCL runs a collective on several channels, each its own ring over its own share of the
buffer. Inside one machine the rings follow the NVLinks (on a mesh such as the DGX-1's the
topology gives them, ``rings``; on an NVSwitch any order is as good). Across machines NCCL
builds one ring per NIC, so that every NIC carries one ring: with M machines of L GPUs,
ring c (c = 0..C-1, C = L channels by default) visits in every machine the local ranks
c, c + 1, ..., c + L - 1 (mod L) and leaves from local rank c - 1 for local rank c of the next
machine. That hop changes rail: it crosses the spine, or with PXN (the cluster's ``pxn``
routing, NCCL's default) goes over NVLink to local rank c of the same machine and out on
its NIC, so that ring c uses rail c alone between machines.

Each ring is the ring all-reduce of ``ring.py`` on 1/C of the buffer (reduce-scatter, then
all-gather, 2 (N - 1) steps); every transfer's lane is its ring.

Cost: 2 (N - M) alpha_local + 2 (M - 1) alpha + 2 (N - 1)/N n max(beta / C, beta_local), beta
the network route between machines (one NIC: each ring has its own) and beta_local a GPU's
link inside the machine, which all C rings share; a chunk's path of 2 (N - 1) steps crosses
machines 2 (M - 1) times (as NCCL's own model counts them).

>>> s = schedule(8, 64, local_size=4)
>>> s.rounds, len(s.transfers), sorted(set(s.lane.tolist()))
(14, 448, [0, 1, 2, 3])
"""

EXPLANATION = """\
NCCL does not run one ring but several at once, its channels: each ring carries its own share
of the buffer. Across machines every GPU's NIC gets a ring of its own, so a machine sends on
all its NICs at once instead of one: ring c goes through the GPUs of each machine starting
at GPU c and leaves the machine from GPU c - 1 towards GPU c of the next, where (with PXN) it
hops over NVLink to GPU c and uses that GPU's NIC. Cost: 2 (N - 1) steps, each a latency plus
1/(C N) of the buffer; the rings share each GPU's NVLink and each use one NIC. It wins for
large messages on a few machines; at thousands of GPUs its 2 (N - 1) steps of latency lose to
the tree."""


import numpy as np

from ..core.compact import CompactSchedule, program
from ..core.schedule import COPY, REDUCE, TRANSFER_DTYPE, Schedule, chunk_bounds, transfers
from ..errors import ConfigError
from . import ring
from ._common import Net, check_size
from .spec import AlgorithmSpec, Option, is_int

MAX_CHANNELS = 1024       # one ring per GPU of a machine: an NVL72 rack's 72 NICs, and more


def _machines(workers, local_size, channels):
    """Machines, GPUs per machine and rings, checked: ``_machines(8, 4, None)`` is (2, 4, 4)."""
    local = workers if local_size is None else local_size
    if isinstance(local, bool) or not isinstance(local, (int, np.integer)) or local < 1 or workers % local:
        raise ConfigError(f"local_size must be an integer >= 1 that divides the {workers} workers, got {local_size!r}")
    machines = workers // int(local)
    default = int(local) if machines > 1 else 1
    rings = default if channels is None else channels
    if isinstance(rings, bool) or not isinstance(rings, (int, np.integer)) or not 1 <= rings <= MAX_CHANNELS:
        raise ConfigError(f"channels must be an integer in 1..{MAX_CHANNELS}, got {channels!r}")
    return machines, int(local), int(rings)


def rail_rings(workers: int, local_size: int | None = None, channels: int | None = None) -> list[list[int]]:
    """The ring orders: ring c visits local ranks c, c + 1, ... of every machine in turn.

    >>> rail_rings(4, 2)
    [[0, 1, 2, 3], [1, 0, 3, 2]]
    """
    machines, local, count = _machines(workers, local_size, channels)
    j = np.arange(local)
    return [(np.arange(machines)[:, None] * local + (c + j) % local).ravel().tolist() for c in range(count)]


def _table(workers, elements, rings, weights):
    """The rings' transfers (``ring.schedule``'s, ring by ring) and each one's lane."""
    ring_bounds = chunk_bounds(elements, len(rings), weights)
    pos, step = np.arange(workers)[None, :], np.arange(workers - 1)[:, None]
    table = np.empty((len(rings), 2, workers - 1, workers), TRANSFER_DTYPE)
    for k, order in enumerate(map(np.array, rings)):
        bounds = ring_bounds[k] + chunk_bounds(ring_bounds[k + 1] - ring_bounds[k], workers)
        src, dst, sizes = order[pos], order[(pos + 1) % workers], np.diff(bounds)
        sent = (pos - step) % workers
        transfers(step, src, dst, bounds[sent], sizes[sent], REDUCE, out=table[k, 0])
        sent = (pos + 1 - step) % workers
        transfers(workers - 1 + step, src, dst, bounds[sent], sizes[sent], COPY, out=table[k, 1])
    lane = np.broadcast_to(np.arange(len(rings), dtype=np.int16)[:, None, None, None], table.shape).ravel()
    table = table.reshape(-1)
    keep = table["count"] > 0
    return table[keep], lane[keep]


def schedule(workers: int, elements: int, local_size: int | None = None, channels: int | None = None,
             rings=None, weights=None) -> Schedule:
    """Build NCCL's multi-channel ring: the given ``rings`` (a mesh's), else one ring per GPU of
    a machine of ``local_size`` (``rail_rings``), ``channels`` of them.

    >>> schedule(4, 8, rings=[[0, 1, 2, 3], [3, 2, 1, 0]]).rounds
    6
    """
    workers, elements = check_size(workers, elements)
    if rings is None:
        orders, weights = rail_rings(workers, local_size, channels), None
    else:
        orders, weights = ring._check_rings(workers, rings, weights)
    table, lane = _table(workers, elements, orders, weights)
    options = {"local_size": local_size, "channels": len(orders), "rings": rings, "weights": weights}
    return Schedule("nccl_ring", workers, elements, table, options=options, lane=lane)


def compact(workers: int, elements: int, local_size: int | None = None, channels: int | None = None,
            rings=None, weights=None) -> CompactSchedule | None:
    """The rail rings (one per local rank) as worker 0's program under the rotations of machines
    and of local ranks, shape (M, L): rotating local ranks moves ring c to ring c + 1, rotating
    machines moves each ring's chunks by L (its chunk digit ``a``; the digit ``b``, which chunk of
    a machine's stretch, stays). None where the rule does not hold (given rings, C != L rings
    over several machines, fewer elements than workers).

    >>> c = compact(8, 64, local_size=4)
    >>> c.shape, c.transfer_count, sorted(c.expand().transfers.tolist()) == sorted(schedule(8, 64, local_size=4).transfers.tolist())
    ((2, 4), 448, True)
    """
    workers, elements = check_size(workers, elements)
    machines, local, count = _machines(workers, local_size, channels)
    if rings is not None or count != local or not 2 <= workers <= elements:
        return None
    n, rows = workers, []
    for c in range(local):
        p = (-c) % local                                     # worker 0's position in ring c
        nxt = p + 1
        dst = (nxt // local % machines) * local + (c + nxt % local) % local
        r = np.arange(n - 1)
        for rounds, chunk, op in ((r, (p - r) % n, REDUCE), (n - 1 + r, (p + 1 - r) % n, COPY)):
            rows.append((rounds, dst, op, np.column_stack([np.full(n - 1, c), chunk // local, chunk % local])))
    table, digits = program(np.concatenate([x[0] for x in rows]), 0,
                            np.concatenate([np.full(len(x[0]), x[1]) for x in rows]),
                            np.concatenate([np.full(len(x[0]), x[2]) for x in rows]),
                            np.concatenate([x[3] for x in rows]))
    out = CompactSchedule("nccl_ring", n, elements, (machines, local), ((1, local), (0, machines), (-1, local)),
                          table, digits, options={"local_size": local_size, "channels": count, "rings": None,
                                                  "weights": None}, flat=1, lane_level=0)
    return out if out.level_sizes()[-1][0] > 0 else None        # every chunk moves something


def cost(workers: int, nbytes: float, net: Net, itemsize: int = 4, local_size=None, channels=None, rings=None,
         weights=None, **options) -> float:
    """Closed-form time: ``cost(16, 1e9, Net(0, 1 / 50e9, local_beta=1 / 370e9), local_size=8)`` is
    5.07 ms (the 8 NICs together: 400 GB/s)."""
    if workers == 1:
        return 0.0
    if rings is not None:
        return ring.cost(workers, nbytes, net, itemsize, rings=rings, weights=weights)
    machines, local, count = _machines(workers, local_size, channels)
    beta_local = net.beta if net.local_beta is None else net.local_beta
    beta = max(net.beta / count, beta_local) if machines > 1 else beta_local
    alpha_local = net.alpha if net.local_alpha is None else net.local_alpha
    steps, across = 2 * (workers - 1), 2 * (machines - 1)     # a chunk's path crosses machines 2 (M - 1) times
    latency = (steps - across) * alpha_local + across * net.alpha if machines > 1 else steps * alpha_local
    return latency + steps / workers * nbytes * beta + (workers - 1) / workers * nbytes / itemsize * net.gamma


def _is_rings(value) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(r, (list, tuple)) for r in value)


SPEC = AlgorithmSpec(
    name="nccl_ring", schedule=schedule, cost=cost, explanation=EXPLANATION,
    phases={"reduce": "reduce-scatter on every ring", "copy": "all-gather on every ring"}, lane_name="ring", exact=True,
    summary="NCCL's ring: several rings at once, one per NIC (rail) across machines",
    options={"local_size": Option(None, "an integer >= 1 that divides the workers (GPUs per machine)", is_int(1)),
             "channels": Option(None, "an integer in 1..1024 (rings; default one per GPU of a machine)", is_int(1)),
             "rings": Option(None, "a list of worker orders, e.g. [[0, 1, 2, 3]]", _is_rings),
             "weights": Option(None, "a list of positive numbers, one per ring", ring._is_weights)},
    machine_option="local_size")
