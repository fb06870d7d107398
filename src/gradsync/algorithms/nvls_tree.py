"""NVLS-tree: in-switch reduction inside each machine, NCCL's double binary tree across machines.

Each machine's NVSwitch reduces (NVLink SHARP). The buffer is cut into pieces, one per local
rank j and tree t (2L pieces; L when there is one machine), each pipelined in S segments. For
segment k of piece p = (j, t) on machine m:

1. every GPU of m sends its copy to the switch, which adds them up as they pass (REDUCE into
   the helper ``switch<m>``): round k;
2. the switch hands the machine's sum to local rank j, the piece's head (NVLS's ld_reduce
   returns the reduced data to the GPU that asked): round k + 1;
3. across machines, heads j reduce up tree t and broadcast down it (``nccl_tree``'s double
   binary tree, every piece of local rank j on rail j): a machine of height h sends up in
   round k + 2 + h; the root's children get the broadcast in round k + 2 + H, a machine at
   depth d forwards it in round k + 2 + H + d;
4. the head writes the result to the switch (multimem.st): round k + 2 + H + d(m);
5. the switch multicasts the segment to every GPU of m once all its pieces are back.

Steps 1 and 5 move whole segments: the switch reduces every piece as it passes and
multicasts the segment once its pieces are all back (in the round after the last one).

Cost, per GPU link: each byte goes up and down once, and a piece of it once more: n (1 + 1/L)
each way, at the switch's share of the link (``switch_beta``); across machines a head's NIC
carries what a tree node does, up to 3 of its pieces each way. ``nvls.py`` is the one-machine
case.

>>> s = schedule(8, 64, local_size=4, segments=1)
>>> s.helpers, s.rounds, len(s.transfers)
(('switch0', 'switch1'), 6, 64)
"""

EXPLANATION = """\
Inside each machine the NVSwitch itself adds up what the GPUs send it (NVLink SHARP): every GPU
sends its data once and gets back the sum of its machine's share, so no GPU spends its links or
its cores on the reduction. One GPU per share (the head) then takes it across machines on a
double binary tree, its NIC and its rail, and writes the result back to the switch, which
multicasts it to every GPU of the machine. Only log2 M steps cross the network, and each GPU's
NVLink carries the data about once each way, where a ring inside the machine takes 2 (L - 1)
steps."""


import numpy as np

from ..core.schedule import COPY, REDUCE, Schedule, chunk_bounds, transfers
from ..errors import ConfigError
from ._common import Net, check_size
from .nccl_tree import dtree, heights_depths
from .spec import AlgorithmSpec, Option, is_int

SEGMENT_ELEMENTS = 1 << 19       # 2 MiB of float32 per segment and piece
MAX_SEGMENTS = 128               # the pipeline is 4 rounds deep in a machine (plus 2 log2 M across): enough
TRANSFER_BUDGET = 1 << 20        # at most about this many transfers: fewer, larger segments beyond


def _shape(workers, local_size):
    local = workers if local_size is None else local_size
    if isinstance(local, bool) or not isinstance(local, (int, np.integer)) or local < 1 or workers % local:
        raise ConfigError(f"local_size must be an integer >= 1 that divides the {workers} workers, got {local_size!r}")
    return workers // int(local), int(local)


def _machine_trees(machines):
    """Per tree (one, or two across machines): the machines' parents, heights and depths."""
    trees = dtree(machines) if machines > 1 else (np.array([-1]),)
    return [(p, *heights_depths(p)) for p in trees]


def _segments(workers, elements, local_size, segments, budget=True):
    """Machines, local ranks, the machine trees, the pieces and the segments per piece (2 MiB
    each, at most MAX_SEGMENTS and, with ``budget``, about TRANSFER_BUDGET transfers in all)."""
    machines, local = _shape(workers, local_size)
    trees = _machine_trees(machines)
    pieces = local * len(trees)
    if segments is not None:
        if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
            raise ConfigError(f"segments must be an integer >= 1, got {segments!r}")
        return machines, local, trees, pieces, segments
    per_segment = 2 * workers + 2 * pieces * machines + 2 * pieces * (machines - 1)
    most = max(1, min(MAX_SEGMENTS, TRANSFER_BUDGET // max(1, per_segment))) if budget else MAX_SEGMENTS
    return machines, local, trees, pieces, int(min(most, max(1, -(-elements // (pieces * SEGMENT_ELEMENTS)))))


def build(name, workers, elements, local_size, segments, helper) -> Schedule:
    """The NVLS(-tree) schedule; ``helper(m)`` names machine m's switch."""
    workers, elements = check_size(workers, elements)
    machines, local, trees, pieces, segments = _segments(workers, elements, local_size, segments)
    options = {"local_size": local_size, "segments": segments}
    if workers == 1 or elements == 0:                     # nothing to move: no switch needed either
        return Schedule(name, workers, elements, transfers(0, 0, 0, 0, 0, REDUCE), options=options)
    seg_bounds = chunk_bounds(elements, segments)
    gpus, m = np.arange(workers), np.arange(workers) // local
    seg = np.arange(segments)[:, None]
    whole = (seg_bounds[seg], np.diff(seg_bounds)[seg])
    ends = np.zeros((segments, machines), np.int64)       # per segment and machine: its pieces' last return
    parts = [transfers(seg, gpus, workers + m, *whole, REDUCE)]
    for t, tree in enumerate(trees):
        table, back = _pieces(t, tree, seg_bounds, pieces, machines, local, workers)
        parts.append(table)
        ends = np.maximum(ends, back)
    parts.append(transfers(ends[:, m] + 1, workers + m, gpus, *whole, COPY))     # multicast the whole segment
    return Schedule(name, workers, elements, np.concatenate(parts), helpers=tuple(helper(k) for k in range(machines)),
                    options=options)


def _pieces(t, tree, seg_bounds, pieces, machines, local, workers):
    """The pieces of tree t (piece p = t L + j, its head local rank j) in every segment: from the
    switch to the head, up and down the machines' tree, back to the switch; and per segment and
    machine, the round the tree's pieces are back."""
    parent, height, depth = tree
    seg = np.arange(len(seg_bounds) - 1)[:, None, None]             # (segment, piece, machine)
    p = (t * local + np.arange(local))[None, :, None]
    size = np.diff(seg_bounds)[:, None, None]
    lo = np.floor(p / pieces * size + 1e-9).astype(np.int64)
    offset, count = seg_bounds[:-1, None, None] + lo, np.floor((p + 1) / pieces * size + 1e-9).astype(np.int64) - lo
    mach = np.arange(machines)[None, None, :]
    switch, head = workers + mach, mach * local + np.arange(local)[None, :, None]
    top = int(height.max(initial=0))
    child = np.flatnonzero(parent >= 0)[None, None, :]
    up_of = parent[child]
    def at(x, where):                                         # x at the machines ``where``
        return np.take_along_axis(np.broadcast_to(x, (x.shape[0], local, machines)),
                                  np.broadcast_to(where, (x.shape[0], local, where.shape[2])), 2)
    back = seg + 2 + top + depth[mach]
    table = np.concatenate([
        transfers(seg + 1, switch, head, offset, count, COPY).reshape(-1),
        transfers(seg + 2 + height[child], at(head, child), at(head, up_of), at(offset, child), at(count, child),
                  REDUCE).reshape(-1),
        transfers(seg + 2 + top + depth[up_of], at(head, up_of), at(head, child), at(offset, child), at(count, child),
                  COPY).reshape(-1),
        transfers(back, head, switch, offset, count, COPY).reshape(-1)])
    return table, back[:, 0, :]


def schedule(workers: int, elements: int, local_size: int | None = None, segments: int | None = None) -> Schedule:
    """Build NVLS-tree for machines of ``local_size`` GPUs (default: one machine: NVLS alone),
    helpers ``switch0``, ``switch1``, ...: each machine's NVSwitch.

    >>> schedule(4, 16, local_size=2, segments=2).rounds
    7
    """
    return build("nvls_tree", workers, elements, local_size, segments, lambda m: f"switch{m}")


def cost(workers: int, nbytes: float, net: Net, itemsize: int = 4, local_size=None, segments=None,
         **options) -> float:
    """Pipeline time: the segments pass the stages one after another (up to the switch, a piece to
    its head, 2 H hops of the machines' trees, back, the multicast), so the first segment takes
    every stage's time and each further one the busiest stage's: a GPU's link to the switch
    carries a segment and a piece of it each way, a head's NIC its pieces of both trees (4 for an
    inner node of one tree and a leaf of the other). The latencies: once along the depth with posted sends (a GPU
    machine), else per round. ``round(cost(8, 1e9, Net(0, 1 / 370e9, switch_beta=1 / 315e9),
    segments=64) * 1e3, 2)`` is 3.62."""
    if workers == 1:
        return 0.0
    machines, local, trees, pieces, segments = _segments(workers, max(1, int(nbytes // itemsize)), local_size,
                                                         segments, budget=False)
    seg = nbytes / segments                                   # one segment of every piece
    beta_s = net.beta if net.switch_beta is None else net.switch_beta
    alpha_s = net.alpha if net.switch_alpha is None else net.switch_alpha
    top = max(int(h.max(initial=0)) for _, h, _ in trees)
    piece = seg / pieces
    children = [np.bincount(p[p >= 0], minlength=machines) for p, _, _ in trees]
    nic = max(sum(c + (p >= 0) for c, (p, _, _) in zip(children, trees)).max(), 0)   # pieces a head's NIC moves
    hop = max(c.max() for c in children) * piece * net.beta   # a tree hop: a parent's children's pieces
    stages = [seg * beta_s, seg / local * beta_s] + [hop] * (2 * top) + [seg / local * beta_s, seg * beta_s]
    busiest = max(seg * (1 + 1 / local) * beta_s, nic * piece * net.beta)
    rounds = segments + 3 + 2 * top
    if net.posted:
        latency = 4 * alpha_s + 2 * top * net.alpha
    else:
        latency = rounds * (max(alpha_s, net.alpha) if machines > 1 else alpha_s)
    return net.switch_base + sum(stages) + (segments - 1) * busiest + latency


SPEC = AlgorithmSpec(
    name="nvls_tree", schedule=schedule, cost=cost, explanation=EXPLANATION,
    phases={"reduce": "reduce in the switch, then up the tree", "copy": "down the tree, multicast"}, exact=True,
    summary="NVLink SHARP inside each machine, NCCL's double binary tree across machines",
    options={"local_size": Option(None, "an integer >= 1 that divides the workers (GPUs per machine)", is_int(1)),
             "segments": Option(None, "an integer >= 1 (segments per piece)", is_int(1))},
    machine_option="local_size",
    needs=("switches",))
