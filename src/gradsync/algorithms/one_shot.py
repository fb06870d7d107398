"""One-shot all-reduce: every worker takes every other worker's whole buffer and adds it, in
one round. The fewest steps there are, at the price of (N - 1) whole buffers into each worker.

Over links that is a poor trade past the smallest messages; on one host, where every rank
can read every other rank's memory, it is the all-reduce for small messages: one barrier, one
vectorized sum of N slots, nothing else (NCCL's and DeepSpeed's one-shot all-reduce, vLLM's
custom all-reduce for small tensors). Its partner for large messages is ``sharded`` read the
same way (two-shot: reduce-scatter, then all-gather, by direct reads).

Cost: alpha + (N - 1) n beta + (N - 1)(n / itemsize) gamma, every worker receiving N - 1
whole buffers over its own link. pcie-switch-4, 160 MB at 16 GB/s: 30 ms.
"""

# For learners (the live view's panel): what, why, cost, when it wins.
EXPLANATION = """\
Every worker sends its whole gradient to every other worker at once, and each adds the N - 1
buffers it receives: one round, so one message latency, but each worker takes in N - 1 whole
buffers. On a network that is (N - 1) n / B per worker, far worse than a ring past small
messages. On one machine, where each process can read the others' memory directly, it is a
single barrier and one sum: the fastest all-reduce for small tensors."""

import numpy as np

from ..core.schedule import REDUCE, Schedule, transfers
from ._common import Net, check_size
from .spec import AlgorithmSpec


def schedule(workers: int, elements: int) -> Schedule:
    """Build the one-shot all-reduce: one round, every worker's whole buffer to every other.

    >>> s = schedule(4, 10)
    >>> s.rounds, len(s.transfers)
    (1, 12)
    """
    workers, elements = check_size(workers, elements)
    src, dst = np.meshgrid(np.arange(workers), np.arange(workers), indexing="ij")
    pairs = src != dst
    src, dst = src[pairs], dst[pairs]
    table = transfers(0, src, dst, np.zeros_like(src), np.full_like(src, elements), REDUCE)
    return Schedule("one_shot", workers, elements, table)


def cost(workers: int, nbytes: float, net: Net, itemsize: int = 4, **options) -> float:
    """Closed-form time: ``cost(4, 160e6, Net(0, 1 / 16e9))`` is 0.03 s."""
    if workers == 1:
        return 0.0
    share = (workers - 1) * nbytes
    return net.alpha + share * net.beta + share / itemsize * net.gamma


SPEC = AlgorithmSpec(
    name="one_shot", schedule=schedule, cost=cost, explanation=EXPLANATION,
    phases={"reduce": "one-shot exchange"}, exact=True, shared_buffers=True,
    summary="every worker adds every other worker's whole buffer, in one round (small messages on one host)")
