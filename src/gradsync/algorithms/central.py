"""Central aggregation: every worker sends its gradient to one primary worker, which sums
and sends the sum back (D2L's single-GPU aggregation).

Cost, n bytes, N workers: 2 alpha + 2 (N - 1) n beta + (N - 1) (n / itemsize) gamma; the
primary's link carries everything, in then out. pcie-switch-4, 160 MB at 16 GB/s: 60 ms.
"""

# For learners (the live view's panel): what, why, cost, when it wins.
EXPLANATION = """\
Every worker sends its whole gradient to one root worker, which adds them up and sends the
sum back to everyone. It is the simplest scheme and the one D2L's "Parameter Servers" chapter
starts from: aggregate on one primary GPU, then broadcast. Cost: the root receives (N - 1)
full buffers and sends (N - 1) back, so about 2 (N - 1) n / B on its one link: it grows with
N. It wins only for tiny messages or two workers, where a single round trip beats the
several rounds of the ring."""


import numpy as np

from ..core.schedule import COPY, REDUCE, Schedule, transfers
from ._common import Net, check_size, check_worker
from .spec import AlgorithmSpec, Option, is_int


def schedule(workers: int, elements: int, root: int = 0) -> Schedule:
    """Build the central all-reduce: reduce into ``root``, then send the sum back.

    >>> schedule(4, 10).rounds
    2
    """
    workers, elements = check_size(workers, elements)
    root = check_worker("root", root, workers)
    others = np.delete(np.arange(workers), root)
    table = np.concatenate([transfers(0, others, root, 0, elements, REDUCE),
                            transfers(1, root, others, 0, elements, COPY)])
    return Schedule("central", workers, elements, table, options={"root": root})


def cost(workers: int, nbytes: float, net: Net, itemsize: int = 4, **options) -> float:
    """Closed-form time: ``cost(4, 160e6, Net(0, 1 / 16e9))`` is 0.06 s."""
    if workers == 1:
        return 0.0
    return 2 * net.alpha + 2 * (workers - 1) * nbytes * net.beta + (workers - 1) * nbytes / itemsize * net.gamma


SPEC = AlgorithmSpec(
    name="central", schedule=schedule, cost=cost, explanation=EXPLANATION,
    phases={"reduce": "reduce to the root", "copy": "broadcast from the root"}, exact=True,
    summary="every worker sends to one root worker, which sums and sends the sum back",
    options={"root": Option(0, "a worker index (an integer >= 0)", is_int(0))})
