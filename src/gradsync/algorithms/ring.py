"""Ring all-reduce: reduce-scatter then all-gather around a ring.

The buffer is split into N chunks, one per position in the ring. In reduce-scatter round r
the worker at ring position p sends chunk (p - r) mod N to position p + 1, which adds it in;
after N - 1 rounds position p holds the full sum of chunk (p + 1) mod N. All-gather then
passes the finished chunks around the same way, N - 1 more rounds, overwriting.

Several rings (channels) may run at once over different links, as NCCL does on NVLink: the
buffer is first split between rings in proportion to ``weights`` (their bandwidths).

Cost, one ring: 2 (N - 1) (alpha + n/N beta) + (N - 1)/N (n / itemsize) gamma. With rings of
bandwidths B_k and weights proportional to B_k, beta becomes 1 / sum(B_k). For large N this
tends to 2 n beta, D2L's 2 x 160 MB / (3 x 18 GB/s) on a p3.16xlarge.
"""

# For learners (the live view's panel): what, why, cost, when it wins.
EXPLANATION = """\
The gradient is cut into N chunks. Chunk i starts at worker i and travels around the ring
for N - 1 steps, each worker adding its own part as it passes (reduce-scatter); then the
finished chunks travel N - 1 more steps, overwriting (all-gather). Every worker sends only
1/N of the buffer per step and all links are busy at once, so the time hardly grows with N.
Cost: 2 (N - 1) (alpha + n / (N B)): the bandwidth term 2 (N - 1)/N n / B is the least any
all-reduce can send. It wins for large messages on any topology with a ring of fast links;
its 2 (N - 1) latencies make it lose on small messages at large N."""


import numpy as np

from ..errors import ConfigError
from ..core.compact import CompactSchedule, program
from ..core.schedule import COPY, REDUCE, TRANSFER_DTYPE, Schedule, chunk_bounds, transfers
from ._common import Net, check_size
from .spec import AlgorithmSpec, Option, is_number


def _check_rings(workers, rings, weights):
    """The rings and their weights, checked: the options' own rules (``SPEC``, which
    ``algorithms.build`` applies too), then what needs the workers: every ring a permutation of
    them, one weight per ring.

    >>> _check_rings(3, None, None)
    ([[0, 1, 2]], [1.0])
    """
    SPEC.check_options({"rings": rings, "weights": weights})    # for callers of schedule() itself
    rings = [list(range(workers))] if rings is None else [list(map(int, r)) for r in rings]
    for k, order in enumerate(rings):
        if sorted(order) != list(range(workers)):
            raise ConfigError(f"rings[{k}] must be a permutation of the workers 0..{workers - 1}, "
                              f"got {order}")
    weights = [1.0] * len(rings) if weights is None else [float(w) for w in weights]
    if len(weights) != len(rings) or not rings:
        raise ConfigError(f"weights must be {len(rings)} positive numbers, one per ring, got {weights}")
    return rings, weights


def schedule(workers: int, elements: int, rings=None, weights=None) -> Schedule:
    """Build a ring all-reduce over one ring (0, 1, ..., N-1) or several given ``rings``.

    >>> s = schedule(3, 9, rings=[[0, 1, 2], [0, 2, 1]], weights=[2, 1])
    >>> s.rounds, len(s.transfers)
    (4, 24)
    """
    workers, elements = check_size(workers, elements)
    rings, weights = _check_rings(workers, rings, weights)
    ring_bounds = chunk_bounds(elements, len(rings), weights)
    pos = np.arange(workers)[None, :]
    step = np.arange(workers - 1)[:, None]
    table = np.empty((len(rings), 2, workers - 1, workers), TRANSFER_DTYPE)   # filled in place: 4096 workers
    for k, order in enumerate(map(np.array, rings)):                         # make a gigabyte of it
        bounds = ring_bounds[k] + chunk_bounds(ring_bounds[k + 1] - ring_bounds[k], workers)
        src, dst = order[pos], order[(pos + 1) % workers]
        sizes = np.diff(bounds)
        sent = (pos - step) % workers                     # reduce-scatter chunk
        transfers(step, src, dst, bounds[sent], sizes[sent], REDUCE, out=table[k, 0])
        sent = (pos + 1 - step) % workers                 # all-gather chunk
        transfers(workers - 1 + step, src, dst, bounds[sent], sizes[sent], COPY, out=table[k, 1])
    table = table.reshape(-1)
    if (table["count"] <= 0).any():
        table = table[table["count"] > 0]
    return Schedule("ring", workers, elements, table, options={"rings": rings, "weights": weights})


def compact(workers: int, elements: int, rings=None, weights=None) -> CompactSchedule | None:
    """The one ring (0, 1, ..., N - 1) as worker 0's program (chunk (0 - r) mod N to worker 1 in
    reduce-scatter round r, chunk (1 - r) mod N in all-gather) and the rotations of the
    workers; None where that rule does not give ``schedule``'s table (several rings, another
    order, fewer elements than workers).

    >>> c = compact(4, 10)
    >>> c.program["round"].tolist(), c.digits[:, 0].tolist()
    ([0, 1, 2, 3, 4, 5], [0, 3, 2, 1, 0, 3])
    """
    workers, elements = check_size(workers, elements)
    rings, weights = _check_rings(workers, rings, weights)
    if len(rings) != 1 or rings[0] != list(range(workers)) or not 2 <= workers <= elements:
        return None
    n, r = workers, np.arange(workers - 1)
    table, digits = program(np.concatenate([r, n - 1 + r]), 0, 1, np.repeat([REDUCE, COPY], n - 1),
                            np.concatenate([-r % n, (1 - r) % n])[:, None])
    return CompactSchedule("ring", n, elements, (n,), ((0, n),), table, digits,
                           options={"rings": rings, "weights": weights})


def cost(workers: int, nbytes: float, net: Net, itemsize: int = 4, rings=None, weights=None,
         **options) -> float:
    """Closed-form time: ``cost(8, 160e6, Net(0, 1 / 54e9))`` is 5.19 ms."""
    if workers == 1:
        return 0.0
    betas = net.ring_betas or (net.beta,)
    weights = [1.0] * len(betas) if weights is None else list(weights)
    share = np.asarray(weights) / sum(weights) * nbytes / workers   # bytes of one chunk, per ring
    steps = 2 * (workers - 1)
    return float(np.max(steps * (net.alpha + share * np.asarray(betas))
                        + (workers - 1) * share / itemsize * net.gamma))


# The rules of the two options, as far as they go without the workers (``_check_rings`` adds
# the rest: each ring a permutation of the workers, as many weights as rings).
def _is_rings(value) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(r, (list, tuple)) for r in value)


def _is_weights(value) -> bool:
    return isinstance(value, (list, tuple)) and all(map(is_number(0), value))


SPEC = AlgorithmSpec(
    name="ring", schedule=schedule, cost=cost, explanation=EXPLANATION,
    phases={"reduce": "reduce-scatter", "copy": "all-gather"}, exact=True,
    summary="reduce-scatter then all-gather around one ring, or several at once",
    options={"rings": Option(None, "a list of worker orders, e.g. [[0, 1, 2, 3]]", _is_rings),
             "weights": Option(None, "a list of positive numbers, one per ring", _is_weights)})
