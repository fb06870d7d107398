"""Recursive halving-doubling all-reduce (Rabenseifner), for any number of workers.

With p the largest power of two <= N and e = N - p extra workers: first the even workers
2i < 2e send their whole gradient to worker 2i + 1 and drop out. The p remaining workers run
a reduce-scatter by recursive halving (log2 p rounds; in each, partners at distance p/2, p/4,
... swap halves of their current window, each keeping one half) and an all-gather by
recursive doubling (the same rounds in reverse, exchanging whole windows). Finally the
workers 2i + 1 send the result back to 2i.

Cost: 2 log2(p) alpha + 2 (p - 1)/p n beta + (p - 1)/p (n / itemsize) gamma, plus
2 alpha + 2 n beta + (n / itemsize) gamma when N is not a power of two.
"""

# For learners (the live view's panel): what, why, cost, when it wins.
EXPLANATION = """\
Recursive halving: in step k every worker swaps half of what it still owns with the worker
whose number differs in bit k, and adds; after log2 N steps each worker owns 1/N, fully
summed. Recursive doubling then swaps back, doubling what each owns. It sends the same bytes
as the ring, 2 (N - 1)/N n, but in only 2 log2 N rounds. Cost: 2 log2 N alpha +
2 (N - 1)/N n / B. It wins when latency matters and pairs of workers have full-bandwidth
paths (a switch); on a physical ring its long-distance partners share links."""


import numpy as np

from ..core.compact import CompactSchedule, program
from ..core.schedule import COPY, REDUCE, Schedule, chunk_bounds, transfers
from ._common import Net, check_size
from .spec import AlgorithmSpec


def schedule(workers: int, elements: int) -> Schedule:
    """Build the halving-doubling all-reduce.

    >>> schedule(8, 64).rounds, schedule(6, 64).rounds
    (6, 6)
    """
    workers, elements = check_size(workers, elements)
    p = 1 << (workers.bit_length() - 1)
    extra = workers - p
    folded = np.arange(extra) * 2                           # workers that drop out
    active = np.concatenate([folded + 1, np.arange(2 * extra, workers)])
    steps = p.bit_length() - 1
    first = 1 if extra else 0
    bounds = chunk_bounds(elements, p)
    rank = np.arange(p)
    lo, hi = np.zeros(p, np.int64), np.full(p, p, np.int64)  # window, in chunks
    windows = []
    tables = [transfers(0, folded, folded + 1, 0, elements, REDUCE)]
    for k in range(steps):                                  # reduce-scatter by halving
        mask = p >> (k + 1)
        mid = (lo + hi) // 2
        keep_low = (rank & mask) == 0
        send_lo, send_hi = np.where(keep_low, mid, lo), np.where(keep_low, hi, mid)
        tables.append(transfers(first + k, active, active[rank ^ mask], bounds[send_lo],
                                bounds[send_hi] - bounds[send_lo], REDUCE))
        windows.append((lo, hi))
        lo, hi = np.where(keep_low, lo, mid), np.where(keep_low, mid, hi)
    for k in reversed(range(steps)):                        # all-gather by doubling
        mask = p >> (k + 1)
        tables.append(transfers(first + 2 * steps - 1 - k, active, active[rank ^ mask],
                                bounds[lo], bounds[hi] - bounds[lo], COPY))
        lo, hi = windows[k]
    tables.append(transfers(first + 2 * steps, folded + 1, folded, 0, elements, COPY))
    return Schedule("halving_doubling", workers, elements, np.concatenate(tables))


def compact(workers: int, elements: int) -> CompactSchedule | None:
    """For a power of two p = 2^k workers, worker 0's program and the group of XORs (shape
    (2,) * k: a worker's digits are its bits, highest first; adding modulo 2 is XOR). In
    halving step j worker 0 sends its partner (bit j from the top set) the half of its window
    whose digit j is 1; in doubling step j its window, digits 0..j its own. The digits index
    one split into p chunks (``flat``, from level 0), as the builder's windows do. None for other worker
    counts (the extra workers' fold-in breaks the group) or fewer elements than workers.

    >>> c = compact(8, 64)
    >>> c.shape, c.digits.tolist()[:2]
    ((2, 2, 2), [[1, -1, -1], [0, 1, -1]])
    """
    workers, elements = check_size(workers, elements)
    k = workers.bit_length() - 1
    if workers != 1 << k or not 2 <= workers <= elements:
        return None
    j = np.arange(k)
    partner = workers >> (j + 1)
    level = np.arange(k)[None, :]
    sent = np.where(level < j[:, None], 0, np.where(level == j[:, None], 1, -1))     # prefix 0s, a 1, free
    window = np.where(level <= j[:, None], 0, -1)                                     # prefix 0s, free
    table, digits = program(np.concatenate([j, 2 * k - 1 - j]), 0, np.concatenate([partner, partner]),
                            np.repeat([REDUCE, COPY], k), np.concatenate([sent, window]))
    return CompactSchedule("halving_doubling", workers, elements, (2,) * k, tuple((i, 2) for i in range(k)),
                           table, digits, flat=0)


def cost(workers: int, nbytes: float, net: Net, itemsize: int = 4, **options) -> float:
    """Closed-form time: ``cost(8, 8e6, Net(1e-6, 1e-9))`` is 20 us + 14 ms."""
    p = 1 << (workers.bit_length() - 1)
    steps = p.bit_length() - 1
    share = (p - 1) / p * nbytes
    time = 2 * steps * net.alpha + 2 * share * net.beta + share / itemsize * net.gamma
    if workers > p:
        time += 2 * net.alpha + 2 * nbytes * net.beta + nbytes / itemsize * net.gamma
    return time


SPEC = AlgorithmSpec(
    name="halving_doubling", schedule=schedule, cost=cost, explanation=EXPLANATION,
    phases={"reduce": "recursive halving", "copy": "recursive doubling"}, exact=True,
    summary="recursive halving (reduce-scatter), then recursive doubling (all-gather)")
