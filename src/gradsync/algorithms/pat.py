"""PAT (NCCL's "Parallel Aggregated Trees") all-reduce: a reduce-scatter and an all-gather,
each in ceil(log2 N) steps.

NCCL runs PAT for reduce-scatter and all-gather with one GPU per machine
(``src/include/collectives.h``, ``PatRSAlgorithm``, ``PatAGAlgorithm``): every chunk is
reduced along its own binomial tree rooted at its owner, and the trees, rotations of each
other, are aggregated so that in each step every rank sends one message to one peer. As an
all-reduce, gradsync runs the two back to back:

- reduce-scatter, step d = 0, 1, ...: worker w holds, for every chunk o whose offset x = w - o
  (mod N) has its lowest set bit at 2^d, the partial sum of o's subtree, and sends it to
  w - 2^d, which adds it in; after ceil(log2 N) steps worker o holds chunk o summed.
- all-gather, the binomial broadcast reversed: in step d (from the largest down), every worker
  at an offset y from o that is a multiple of 2^(d + 1) sends chunk o to the offset y + 2^d.

Every step moves about half of what is left, in one message per worker: N/2, N/4, ... chunks.
NCCL bounds what it aggregates by its buffers (``stepDepth``); this schedule aggregates all.

Cost, on a switch: 2 ceil(log2 N) alpha + 2 (N - 1)/N n beta + (N - 1)/N (n / s) gamma:
the ring's bandwidth in log-many steps (as halving-doubling, for any N).

>>> s = schedule(6, 60)
>>> s.rounds, len(s.transfers) == 2 * 6 * 5
(6, True)
"""

EXPLANATION = """\
Every chunk of the gradient is summed along its own binomial tree, rooted at the worker that
will own it: in the first step the workers at odd distance hand their partial sums one step
back, then those at distance 2 mod 4 two steps back, and so on. All the chunks' trees are the
same tree rotated, so in each step every worker sends one message, to one peer, holding every
chunk that step moves. Then the sums travel back out the same trees. Cost: 2 log2 N latencies
and the ring's bytes; NCCL uses it for reduce-scatter and all-gather across many machines with
one GPU each, where the ring's N steps of latency would dominate."""


import numpy as np

from ..core.compact import CompactSchedule, program
from ..core.schedule import COPY, REDUCE, Schedule, chunk_bounds, transfers
from ._common import Net, check_size
from .spec import AlgorithmSpec


def _steps(workers: int) -> int:
    return (workers - 1).bit_length()


def _rows(workers: int):
    """Worker 0's transfers as (round, destination, op, chunk) columns.

    >>> [x.tolist() for x in _rows(4)]
    [[0, 1, 0, 2, 3, 3], [3, 2, 3, 2, 1, 1], [0, 0, 0, 1, 1, 1], [3, 2, 1, 0, 0, 2]]
    """
    n, steps = workers, _steps(workers)
    x = np.arange(1, n)
    low = np.log2(x & -x).astype(np.int64)               # the place of the lowest set bit
    rs_round, rs_dst, rs_chunk = low, (-(1 << low)) % n, (-x) % n
    out = [(rs_round, rs_dst, np.full(n - 1, REDUCE), rs_chunk)]
    for d in range(steps - 1, -1, -1):                     # all-gather: from the largest distance down
        y = np.arange(0, n, 2 << d)
        y = y[y + (1 << d) < n]
        out.append((np.full(len(y), steps + (steps - 1 - d)), np.full(len(y), (1 << d) % n), np.full(len(y), COPY),
                    (-y) % n))
    return [np.concatenate([o[i] for o in out]) for i in range(4)]


def schedule(workers: int, elements: int) -> Schedule:
    """Build PAT's reduce-scatter then all-gather (N chunks, one owned by each worker).

    >>> schedule(5, 10).rounds
    6
    """
    workers, elements = check_size(workers, elements)
    if workers == 1:
        return Schedule("pat", 1, elements, transfers(0, 0, 0, 0, 0, REDUCE))
    rnd, dst, op, chunk = _rows(workers)
    bounds, w = chunk_bounds(elements, workers), np.arange(workers)[:, None]
    moved = (chunk[None, :] + w) % workers                    # the rows rotated to worker w
    table = transfers(rnd[None, :], w, (dst[None, :] + w) % workers, bounds[moved], np.diff(bounds)[moved], op[None, :])
    return Schedule("pat", workers, elements, table)


def compact(workers: int, elements: int) -> CompactSchedule | None:
    """Worker 0's transfers and the rotations of the workers; None for fewer than 2 workers or
    fewer elements than workers.

    >>> c = compact(6, 60)
    >>> sorted(c.expand().transfers.tolist()) == sorted(schedule(6, 60).transfers.tolist())
    True
    """
    workers, elements = check_size(workers, elements)
    if not 2 <= workers <= elements:
        return None
    rnd, dst, op, chunk = _rows(workers)
    table, digits = program(rnd, 0, dst, op, chunk[:, None])
    return CompactSchedule("pat", workers, elements, (workers,), ((0, workers),), table, digits)


def cost(workers: int, nbytes: float, net: Net, itemsize: int = 4, **options) -> float:
    """Closed-form time: ``round(cost(8, 8e6, Net(1e-6, 1 / 10e9)) * 1e3, 4)`` is 1.406."""
    if workers == 1:
        return 0.0
    steps = _steps(workers)
    x = np.arange(1, workers)
    per_step = np.bincount(np.log2(x & -x).astype(np.int64), minlength=steps)   # chunks sent in each step
    chunk = nbytes / workers
    bandwidth = 2 * per_step.sum() * chunk * net.beta
    return float(2 * steps * net.alpha + bandwidth + per_step.sum() * chunk / itemsize * net.gamma)


SPEC = AlgorithmSpec(
    name="pat", schedule=schedule, cost=cost, explanation=EXPLANATION,
    phases={"reduce": "reduce-scatter along binomial trees", "copy": "all-gather along them"}, exact=True,
    summary="PAT: reduce-scatter and all-gather along aggregated binomial trees, log2 N steps each")
