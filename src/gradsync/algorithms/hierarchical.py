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
