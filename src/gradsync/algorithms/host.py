"""Host aggregation: every worker sends its gradient to the host CPU, which sums and sends
the sum back (D2L's CPU aggregation). The host is a helper node, not a worker.

Cost: 2 alpha_h + 2 N n beta_h + N (n / itemsize) gamma_h, where _h are the worker <-> host
route's parameters; the host's link carries all N gradients in and N sums out.
pcie-switch-4, 160 MB at 16 GB/s: 80 ms.
"""

# For learners (the live view's panel): what, why, cost, when it wins.
EXPLANATION = """\
Every worker sends its whole gradient to the host CPU, which sums and sends the sum back.
On a PCIe server the CPU sits behind the switch, so every byte crosses the CPU's one link
twice: on D2L's 4-GPU example 80 ms against 60 ms on one GPU. Cost: about 2 N n / B on the
host's link, plus the CPU's additions. It rarely wins; it is here because it is the path many
first implementations take, and the view shows why it is slow."""


import numpy as np

from ..core.compact import CompactSchedule, program
from ..core.schedule import COPY, REDUCE, Schedule, transfers
from ._common import Net, check_size
from .spec import AlgorithmSpec

HOST = "host"


def schedule(workers: int, elements: int) -> Schedule:
    """Build the host all-reduce; node ``workers`` is the host.

    >>> schedule(4, 10).helpers
    ('host',)
    """
    workers, elements = check_size(workers, elements)
    everyone, host = np.arange(workers), workers
    table = np.concatenate([transfers(0, everyone, host, 0, elements, REDUCE),
                            transfers(1, host, everyone, 0, elements, COPY)])
    return Schedule("host", workers, elements, table, helpers=(HOST,))


def compact(workers: int, elements: int) -> CompactSchedule | None:
    """Worker 0's program (its gradient to the host, the sum back) and the rotations of the
    workers, the host fixed; None when there is nothing to move.

    >>> compact(4, 10).transfer_count
    8
    """
    workers, elements = check_size(workers, elements)
    if elements < 1:
        return None
    table, digits = program([0, 1], [0, workers], [workers, 0], [REDUCE, COPY], np.zeros((2, 0), np.int64))
    return CompactSchedule("host", workers, elements, (workers,), (), table, digits, helpers=(HOST,))


def cost(workers: int, nbytes: float, net: Net, itemsize: int = 4, **options) -> float:
    """Closed-form time: ``cost(4, 160e6, Net(0, 1 / 16e9))`` is 0.08 s."""
    alpha = net.alpha if net.host_alpha is None else net.host_alpha
    beta = net.beta if net.host_beta is None else net.host_beta
    gamma = net.gamma if net.host_gamma is None else net.host_gamma
    return 2 * alpha + 2 * workers * nbytes * beta + workers * nbytes / itemsize * gamma


SPEC = AlgorithmSpec(
    name="host", schedule=schedule, cost=cost, explanation=EXPLANATION,
    phases={"reduce": "reduce on the host", "copy": "broadcast from the host"}, exact=True,
    summary="every worker sends to the host CPU, which sums and sends the sum back",
    needs=("host",))
