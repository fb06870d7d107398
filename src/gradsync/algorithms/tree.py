"""Pipelined binary-tree all-reduce: reduce up a binary tree, then broadcast down it.

Workers form a heap-ordered binary tree (parent of i is (i - 1) // 2). The buffer is cut into
S segments that flow through the tree one behind the other: a worker of height h (distance to
its deepest leaf) sends segment k to its parent in round k + h, once both children's copies
of k have arrived. The root starts broadcasting segment k in round k + H (H: tree height) and
a worker at depth d forwards it in round k + H + d, so reduce and broadcast overlap.

Cost: S + 2H - 1 rounds. In the steady state a worker's link carries 3 segments each way per
round (2 from children + 1 from the parent in, 1 to the parent + 2 to children out):
about (S + 2H - 1) (alpha + 3 (n / S) beta) on a switch, less at the pipeline's ends. It wins
over ring for small messages: log2(N) latency steps instead of N.
"""

# For learners (the live view's panel): what, why, cost, when it wins.
EXPLANATION = """\
The gradient is cut into segments that flow up a binary tree, each parent adding its
children's, then back down as a broadcast, pipelined so that many segments are in flight.
Only log2 N levels separate the leaves from the root, so latency grows like log N instead of
N. Cost: about 2 (log2 N + S - 1) (alpha + n / (S B)) for S segments. It wins for small and
medium messages at large N, where the ring's 2 (N - 1) latencies dominate."""


import numpy as np

from ..errors import ConfigError
from ..core.schedule import COPY, REDUCE, Schedule, chunk_bounds, transfers
from ._common import Net, check_size
from .spec import AlgorithmSpec, Option, is_int

SEGMENT_ELEMENTS = 1 << 18   # 1 MiB of float32: enough to pipeline, few enough rounds


def _segments(elements, segments):
    if segments is None:
        return max(1, -(-elements // SEGMENT_ELEMENTS))
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise ConfigError(f"segments must be an integer >= 1, got {segments!r}")
    return segments


def schedule(workers: int, elements: int, segments: int | None = None) -> Schedule:
    """Build the pipelined tree all-reduce with ``segments`` segments (default: 1 MiB each).

    >>> schedule(4, 100, segments=2).rounds
    5
    """
    workers, elements = check_size(workers, elements)
    segments = _segments(elements, segments)
    node = np.arange(workers)
    height = np.floor(np.log2(workers / (node + 1))).astype(np.int64)
    depth = np.floor(np.log2(node + 1)).astype(np.int64)
    tree_height = int(height[0])
    bounds = chunk_bounds(elements, segments)
    seg = np.arange(segments)[:, None]
    child, parent = node[1:], (node[1:] - 1) // 2
    offset, count = bounds[seg], bounds[seg + 1] - bounds[seg]
    table = np.concatenate([
        transfers(seg + height[child], child, parent, offset, count, REDUCE),
        transfers(seg + tree_height + depth[parent], parent, child, offset, count, COPY)])
    return Schedule("tree", workers, elements, table, options={"segments": segments})


def cost(workers: int, nbytes: float, net: Net, itemsize: int = 4, segments=None,
         **options) -> float:
    """Lock-step time of the pipeline on a switch: each round costs alpha plus its busiest
    link direction's segments times beta plus its busiest node's reductions times gamma.

    The loads come from the timing rule above, not from ``schedule``: a worker of height h
    sends segment k up in round k + h and one at depth d sends it down in round k + H + d, so
    per round and per kind of worker (height, depth, children's heights) the segments in and
    out are counts of open intervals (steady state: 3 each way, 2 reductions); the first and
    last H rounds carry less.
    Exact (simulator within 1%) for complete trees (N = 2^k - 1) and bandwidth-bound messages;
    otherwise shallower branches run ahead of the lock-step and this is an upper bound (up to
    13% high for messages of 1-4 segments).

    >>> round(cost(4, 160e6, Net(1e-6, 1 / 16e9), segments=100) * 1e3, 2)
    20.5
    """
    if workers == 1:
        return 0.0
    segments = _segments(max(1, int(nbytes // itemsize)), segments)
    seg_bytes = nbytes / segments
    link_load, reduce_load = _loads(workers, segments)
    return float(np.sum(net.alpha + link_load * seg_bytes * net.beta
                        + reduce_load * seg_bytes / itemsize * net.gamma))


def _loads(workers, segments):
    """Per round: most segments on one link direction, and most segments one node reduces.

    >>> [x.tolist() for x in _loads(3, 2)]
    [[2, 2, 2], [2, 2, 0]]
    """
    node = np.arange(workers)
    height = np.floor(np.log2(workers / (node + 1))).astype(np.int64)
    depth = np.floor(np.log2(node + 1)).astype(np.int64)
    kids = 2 * node[:, None] + np.array([1, 2])
    kid_height = np.where(kids < workers, height[np.minimum(kids, workers - 1)], -1)   # -1: no child
    kinds = np.unique(np.column_stack([height, depth, kid_height, node > 0]), axis=0)
    h, d, k1, k2, up = (column[:, None] for column in kinds.T)
    top = height[0]
    r = np.arange(segments + 2 * top - 1)

    def sending(first, present):      # 1 in the S rounds from ``first`` on, where ``present``
        return (present & (first <= r) & (r < first + segments)).astype(np.int64)

    from_kids = sending(k1, k1 >= 0) + sending(k2, k2 >= 0)
    into = from_kids + sending(top + d - 1, up == 1)
    out = sending(h, up == 1) + sending(top + d, k1 >= 0) + sending(top + d, k2 >= 0)
    return np.maximum(into, out).max(axis=0), from_kids.max(axis=0)


SPEC = AlgorithmSpec(
    name="tree", schedule=schedule, cost=cost, explanation=EXPLANATION,
    phases={"reduce": "reduce up the tree", "copy": "broadcast down the tree"}, exact=True,
    summary="pipelined reduce up a binary tree, then broadcast down it",
    options={"segments": Option(None, "an integer >= 1", is_int(1))})
