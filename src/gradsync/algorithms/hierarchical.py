"""Hierarchical all-reduce: reduce within each machine, all-reduce across machines on rails,
gather within each machine.

Workers are grouped into M machines of L consecutive ranks (``local_size`` = L, as torchrun's
LOCAL_WORLD_SIZE). Three phases:

1. intra-machine reduce-scatter (a ring over the L local ranks): local rank j ends with its
   machine's sum of chunk (j + 1) mod L, 1/L of the buffer;
2. inter-machine all-reduce of that chunk among the M workers with local rank j (rail j), by
   ring or recursive halving-doubling (``inter``), all rails at once;
3. intra-machine all-gather (the same ring): everyone ends with the full sum.

Why: a flat ring crosses each machine boundary with 2 (N - 1)/N of the buffer per direction
on each crossing link; here a machine's rails together send 2 (M - 1)/M of it through the
machine's network link, and the L - 1 local steps run on the fast links inside it. On 2
machines x 2 workers, 1.5x less traffic across the slow link.

With ``inter="ring"`` this is also the 2D-torus all-reduce (Mikami et al., "Massively
Distributed SGD: ImageNet/ResNet-50 Training in a Flash", 2018): workers on an L x M grid,
reduce-scatter along the rows, all-reduce along the columns, all-gather along the rows; on a
torus the rows are the machines and the columns the rails, so no separate variant is needed.

Cost (rails sharing one network link per machine): 2 (L - 1) (alpha_l + n/L beta_l)
+ inter(M, n) on (alpha, beta) + (L - 1)/L (n/s) gamma.
"""

import numpy as np

from ..errors import ConfigError
from ..core.compact import CompactSchedule, program
from ..core.schedule import COPY, REDUCE, Schedule, chunk_bounds
from . import halving_doubling, ring
from ._common import Net, check_size
from .spec import AlgorithmSpec, Option, is_int, one_of

EXPLANATION = """\
Workers are grouped into machines of L workers. First each machine runs a reduce-scatter on its
fast internal links, so local worker j holds the machine's sum of one chunk (1/L of the
buffer). Then the workers with the same local index on every machine (a rail) all-reduce that
chunk across the slow network, all rails at once. Finally each machine gathers the finished
chunks internally. Only 2 (M - 1)/M of the buffer leaves each of the M machines, where a flat
ring pushes 2 (N - 1)/N of it over every link it crosses. Cost: 2 (L - 1) (alpha_local +
n / (L B_local)) + 2 (M - 1) alpha + 2 (M - 1)/M n / B_network. It wins across machines
whose network is much slower than their internal links."""

INTERS = {"ring": ring, "halving_doubling": halving_doubling}


def _local_size(workers: int, local_size) -> int:
    if local_size is None:
        return workers
    if isinstance(local_size, bool) or not isinstance(local_size, (int, np.integer)) or local_size < 1:
        raise ConfigError(f"local_size must be an integer >= 1, got {local_size!r}")
    if workers % local_size:
        raise ConfigError(f"local_size must divide the workers into equal machines: {workers} workers "
                          f"are not a multiple of local_size = {local_size}")
    return int(local_size)


def schedule(workers: int, elements: int, local_size: int | None = None, inter: str = "ring") -> Schedule:
    """Build the hierarchical all-reduce for machines of ``local_size`` consecutive workers
    (default: one machine, which is a ring), with ``inter`` ("ring" or "halving_doubling")
    across machines.

    >>> s = schedule(4, 8, local_size=2)
    >>> s.rounds, len(s.transfers)           # 1 local step, 2 ring steps across, 1 local step
    (4, 16)
    """
    workers, elements = check_size(workers, elements)
    local = _local_size(workers, local_size)
    if inter not in INTERS:
        raise ConfigError(f"inter must be one of {', '.join(INTERS)}, got {inter!r}")
    machines = workers // local
    intra = ring.schedule(local, elements).transfers
    first, last = intra[intra["op"] == REDUCE], intra[intra["op"] == COPY]
    base = np.arange(machines)[:, None] * local               # rank of each machine's local rank 0

    def per_machine(table, shift):
        out = np.repeat(table[None, :], machines, axis=0)
        out["src"] += base
        out["dst"] += base
        out["round"] += shift
        return out.ravel()

    tables = [per_machine(first, 0)]
    inter_rounds = 0
    if machines > 1:
        bounds = chunk_bounds(elements, local)
        for j in range(local):                               # rail j carries the chunk local rank j owns
            chunk = (j + 1) % local if local > 1 else 0
            rail = INTERS[inter].schedule(machines, int(bounds[chunk + 1] - bounds[chunk]))
            inter_rounds = max(inter_rounds, rail.rounds)
            across = rail.transfers.copy()
            across["src"] = across["src"] * local + j
            across["dst"] = across["dst"] * local + j
            across["offset"] += bounds[chunk]
            across["round"] += local - 1
            tables.append(across)
    tables.append(per_machine(last, inter_rounds))
    table = np.concatenate(tables)
    table = table[np.lexsort((table["dst"], table["src"], table["round"]))]
    return Schedule("hierarchical", workers, elements, table, options={"local_size": local, "inter": inter})


def compact(workers: int, elements: int, local_size: int | None = None, inter: str = "ring") -> CompactSchedule | None:
    """Worker 0's program and the rotations of machines and of local ranks: the local ring's
    chunks split the buffer L ways and rotate with the local rank; rail j carries local chunk
    (j + 1) mod L, split M ways for a ring of machines (shape (M, L)), or 2^k ways for
    halving-doubling over 2^k machines (shape (2, ..., 2, L): machines by XOR). None where that
    rule does not give ``schedule``'s table (halving-doubling over machines not a power of two,
    fewer elements than workers, one worker).

    >>> c = compact(8, 64, local_size=2)
    >>> c.shape, len(c.program), c.transfer_count == len(schedule(8, 64, local_size=2).transfers)
    ((4, 2), 8, True)
    >>> compact(16, 64, local_size=2, inter="halving_doubling").shape
    (2, 2, 2, 2)
    """
    workers, elements = check_size(workers, elements)
    local = _local_size(workers, local_size)
    if inter not in INTERS:
        raise ConfigError(f"inter must be one of {', '.join(INTERS)}, got {inter!r}")
    machines = workers // local
    rails = _rails(inter, machines, local)
    if rails is None or not 2 <= workers <= elements:
        return None
    shape, levels, flat, rail_rows = rails
    r, m = np.arange(local - 1), len(shape)
    whole = np.full((local - 1, m), -1)
    inter_rounds = max([int(x[0].max(initial=local - 2)) + 1 for x in rail_rows], default=local - 1) - (local - 1)
    rows = [(r, 1 % local, REDUCE, -r % local, whole)] + rail_rows + \
        [(local - 1 + inter_rounds + r, 1 % local, COPY, (1 - r) % local, whole)]
    count = [len(x[0]) for x in rows]
    table, digits = program(np.concatenate([x[0] for x in rows]),
                            0, np.concatenate([np.broadcast_to(x[1], n) for x, n in zip(rows, count)]),
                            np.concatenate([np.full(n, x[2]) for x, n in zip(rows, count)]),
                            np.concatenate([np.column_stack([np.broadcast_to(x[3], n), np.broadcast_to(x[4], (n, m))])
                                            for x, n in zip(rows, count)]))
    return CompactSchedule("hierarchical", workers, elements, shape + (local,), ((m, local),) + levels,
                           table, digits, options={"local_size": local, "inter": inter}, lexsorted=True,
                           flat=flat)


def _rails(inter, machines, local):
    """The machines' part of the group (shape, chunk levels, where a flat split starts) and the
    rail rows of worker 0's program: (rounds, destination, op, local chunk digit, machine chunk
    digits); None for halving-doubling over machines not a power of two."""
    rail_chunk, start = 1 % local, local - 1
    if inter == "ring":
        q = np.arange(machines - 1)[:, None]
        dst, chunk = local % (machines * local), np.full(machines - 1, rail_chunk)
        return (machines,), ((0, machines),), None, [
            (start + q[:, 0], dst, REDUCE, chunk, -q % machines),
            (start + machines - 1 + q[:, 0], dst, COPY, chunk, (1 - q) % machines)]
    k = machines.bit_length() - 1
    if machines != 1 << k:
        return None
    j, level = np.arange(k), np.arange(k)[None, :]
    dst, chunk = (machines >> (j + 1)) * local, np.full(k, rail_chunk)
    sent = np.where(level < j[:, None], 0, np.where(level == j[:, None], 1, -1))   # as halving_doubling.compact
    window = np.where(level <= j[:, None], 0, -1)
    return (2,) * k, tuple((i, 2) for i in range(k)), 1, [
        (start + j, dst, REDUCE, chunk, sent), (start + 2 * k - 1 - j, dst, COPY, chunk, window)]


def cost(workers: int, nbytes: float, net: Net, itemsize: int = 4, local_size: int | None = None,
         inter: str = "ring", **options) -> float:
    """Closed-form time: ``cost(4, 64e6, Net(0, 1 / 125e6, local_beta=1 / 10e9), local_size=2)``
    is 6.4 ms inside the machines plus 512 ms across."""
    local = _local_size(workers, local_size)
    machines = workers // local
    alpha_l = net.alpha if net.local_alpha is None else net.local_alpha
    beta_l = net.beta if net.local_beta is None else net.local_beta
    inside = 2 * (local - 1) * (alpha_l + nbytes / local * beta_l) + (local - 1) / local * nbytes / itemsize * net.gamma
    if machines == 1:
        return inside
    # the rails share each machine's network link: together they move what one all-reduce of n would
    across = INTERS[inter].cost(machines, nbytes, Net(net.alpha, net.beta), itemsize=itemsize)
    return inside + across + (machines - 1) / machines * nbytes / local / itemsize * net.gamma


SPEC = AlgorithmSpec(
    name="hierarchical", schedule=schedule, cost=cost, explanation=EXPLANATION,
    phases={"reduce": "reduce-scatter, then all-reduce across machines", "copy": "all-gather"}, exact=True,
    summary="reduce-scatter inside each machine, all-reduce across machines on rails, all-gather inside",
    options={"local_size": Option(None, "an integer >= 1 that divides the workers (workers per machine)",
                                  is_int(1)),
             "inter": Option("ring", f"one of {', '.join(INTERS)}", one_of(*INTERS))},
    machine_option="local_size")
