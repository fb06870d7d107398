"""What a codec costs on a topology: the simulator's time of its collectives on the wire, plus
the codec's own compute at a measured rate; and the error it brings on one step.

The rate is measured by ``codec_rate``: the codec run in this process on ``RATE_ELEMENTS``
Gaussian elements against an exchange that moves nothing (its all-gather repeats the local
payload ``workers`` times, so decoding costs what it costs with that many workers), in
elements of gradient per second, on one thread as the workers run (on 2 loaded cores, torch's
two threads made the same cast 100x slower). The prediction scales it linearly with the size.

The runtime's fixed cost of a collective, which the simulator does not model, is counted when
measured (``overhead``): ``measure_overhead`` times tiny ring all-reduces (2(N - 1) rounds) and
all-gathers (N - 1 rounds) in the workers themselves and fits per collective + per round x
rounds. On this machine's 2 shared cores it is milliseconds per round, because each round
waits for every worker process to be scheduled, and it is what dominates the small wires of
PowerSGD, top-k and sign. A collective takes the longer of its simulated wire time and its
fixed cost, not their sum: while a round's transfer is on a slow wire the workers wait
without competing for the cores, which is when the fixed cost is paid (at 100 Mbit/s the
fp16 all-reduce measured what its wire alone predicts).
"""

from __future__ import annotations

import time
from functools import lru_cache

import numpy as np
import torch

from .. import algorithms, dtypes
from ..model.simulate import simulate
from ..compression import make

RATE_ELEMENTS = 1 << 18
OVERHEAD_ELEMENTS = 64          # small enough that the wire and the codec's compute vanish


class StillExchange:
    """An exchange that moves nothing, for timing a codec's compute alone."""

    def __init__(self, workers: int):
        self.workers, self.rank = workers, 0

    def all_reduce(self, tensor):
        return tensor

    def all_gather(self, tensor):
        return tensor.view(1, -1).expand(self.workers, -1).clone()


def _timed(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after one warm-up, on one thread."""
    threads, times = torch.get_num_threads(), []
    torch.set_num_threads(1)
    try:
        for i in range(repeats + 1):
            start = time.perf_counter()
            fn()
            if i:
                times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return max(float(np.median(times)), 1e-9)


@lru_cache(maxsize=128)
def codec_rate(compression: str, workers: int, elements: int = RATE_ELEMENTS, repeats: int = 5) -> float:
    """Elements of gradient per second the codec processes on this machine (median of
    ``repeats``, after one warm-up), for ``workers`` workers.

    >>> codec_rate("fp16", 4, 1 << 12) > 0
    True
    """
    codec = make(compression)
    grad = torch.randn(elements, generator=torch.Generator().manual_seed(0))
    x, exchange = grad.clone(), StillExchange(workers)
    return elements / _timed(lambda: codec.reduce(x.copy_(grad), exchange, key=0), repeats)


def copy_rate(elements: int = RATE_ELEMENTS, repeats: int = 5) -> float:
    """Elements per second of a float32 memory copy, the yardstick of codec speed."""
    src, dst = torch.randn(elements), torch.empty(elements)
    return elements / _timed(lambda: dst.copy_(src), repeats)


def wire_schedules(compression, algorithm: str, workers: int, elements: int, options: dict | None = None,
                   key=None):
    """(schedule, dtype name) of each collective the codec runs on ``elements`` of gradient:
    its all-reduces with ``algorithm``, its all-gathers on the ring's all-gather half.

    >>> [(s.algorithm, d) for s, d in wire_schedules("fp16", "tree", 4, 100)]
    [('tree', 'float16')]
    """
    from ..runtime.compressed import all_gather_schedule

    out = []
    for wire in make(compression).wire(workers, elements, key):
        if wire.kind == "all_reduce":
            out.append((algorithms.build(algorithm, workers, wire.elements, dtype=wire.dtype, **(options or {})),
                        wire.dtype))
        else:
            out.append((all_gather_schedule(workers, wire.elements), wire.dtype))
    return out


def measure_overhead(repeats: int = 20) -> dict:
    """Called in every rank of a running group (collective: all ranks at once): the runtime's
    fixed cost of a collective, ``{"per_collective_s": a, "per_round_s": b}``, fitted to the
    median seconds of blocks of back-to-back ring all-reduces (2(N - 1) rounds) and ring
    all-gathers (a compressed all-reduce by top-k keeping everything: N - 1 rounds) of
    OVERHEAD_ELEMENTS floats, where the wire and the codec's compute are negligible. Both
    parts are kept >= 0. ``collective_overhead`` runs it in new local workers.

    Example, in each rank: ``overhead = measure_overhead()``, then
    ``predict("topk", "ring", topo, n, overhead=overhead)``.
    """
    import torch.distributed as dist

    from ..runtime.api import all_reduce
    from .bench import time_in_blocks

    workers = dist.get_world_size()
    x = torch.ones(OVERHEAD_ELEMENTS)
    times = time_in_blocks({"all_reduce": lambda: all_reduce(x, "ring"),
                            "all_gather": lambda: all_reduce(x, "ring", compression="topk:ratio=1")},
                           repeats, dist.barrier, before=lambda name: x.fill_(1.0))
    return fit_overhead(workers, *(float(np.median(times[k])) for k in ("all_reduce", "all_gather")))


def fit_overhead(workers: int, reduce_s: float, gather_s: float) -> dict:
    """Per collective a and per round b (both >= 0) from a ring all-reduce taking a + 2(N-1) b
    and a ring all-gather taking a + (N-1) b.

    >>> fit_overhead(4, 7.0, 4.0)
    {'per_collective_s': 1.0, 'per_round_s': 1.0}
    """
    if workers < 2:
        return {"per_collective_s": 0.0, "per_round_s": 0.0}
    per_round = max(0.0, (reduce_s - gather_s) / (workers - 1))
    return {"per_collective_s": max(0.0, gather_s - (workers - 1) * per_round), "per_round_s": per_round}


def _overhead_worker(rank, workers, repeats):
    torch.set_num_threads(1)
    return measure_overhead(repeats)


@lru_cache(maxsize=16)
def collective_overhead(workers: int, repeats: int = 20) -> dict:
    """``measure_overhead`` in ``workers`` new local worker processes (one thread each, as
    training workers run), rank 0's answer; cached per process.

    Example: ``collective_overhead(4)`` gives ``{"per_collective_s": ..., "per_round_s": ...}``.
    """
    from .launch import run

    return run(_overhead_worker, workers, repeats)[0]


def overhead_time(overhead: dict | None, schedule) -> float:
    """Seconds of fixed cost of one collective's ``schedule`` (0 without ``overhead``).

    >>> from gradsync import algorithms
    >>> overhead_time({"per_collective_s": 1.0, "per_round_s": 0.5}, algorithms.build("ring", 4, 8))
    4.0
    """
    if not overhead:
        return 0.0
    return overhead["per_collective_s"] + overhead["per_round_s"] * schedule.rounds


def predict(compression, algorithm: str, topology, elements: int, workers: int | None = None,
            options: dict | None = None, rate: float | None = None, key=None, overhead: dict | None = None) -> dict:
    """Predicted seconds of one compressed all-reduce on ``topology``: ``wire_s`` (simulated,
    collectives one after another), ``codec_s`` (compute at ``rate``, measured when None),
    ``overhead_s`` (the runtime's fixed cost of the collectives, from ``overhead`` as
    ``measure_overhead`` gives it; 0 when None), ``time_s`` (the codec's compute plus, per
    collective, the longer of its wire and its fixed cost), and ``bytes``, the most any
    worker sends. ``key``: the bucket whose layout a ``Codec`` given as ``compression``
    was told (``Codec.layout``).

    >>> from gradsync.model.topology import preset
    >>> p = predict("fp16", "ring", preset("ethernet", workers=4), 1 << 20, rate=1e9)
    >>> p["bytes"] == 2 * 3 / 4 * (1 << 20) * 2
    True
    """
    workers = len(topology.workers) if workers is None else workers
    codec = make(compression)
    wire_s, overhead_s, collectives_s, sent = 0.0, 0.0, 0.0, np.zeros(workers)
    for schedule, dtype in wire_schedules(codec, algorithm, workers, elements, options, key):
        itemsize = dtypes.itemsize(dtype)
        wire, fixed = simulate(schedule, topology, itemsize).time, overhead_time(overhead, schedule)
        wire_s, overhead_s, collectives_s = wire_s + wire, overhead_s + fixed, collectives_s + max(wire, fixed)
        sent += schedule.elements_sent()[:workers] * itemsize
    rate = codec_rate(codec.label, workers) if rate is None else rate
    codec_s = elements / rate
    return {"time_s": collectives_s + codec_s, "wire_s": wire_s, "codec_s": codec_s,
            "overhead_s": overhead_s, "bytes": float(sent.max())}


def one_step_error(compression, workers: int, elements: int = 1 << 14, seed: int = 0) -> float:
    """Relative error ||result - exact|| / ||exact|| of one step on independent Gaussian
    gradients, no error carried over yet (a worst case for the low-rank and sparse codecs:
    such gradients have no structure to keep).

    >>> one_step_error("topk:ratio=1", 3, 100) < 1e-6
    True
    """
    from ..runtime.compressed import emulate

    g = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(elements, generator=g) for _ in range(workers)]
    exact = torch.stack(inputs).double().sum(0)
    result = emulate(compression, inputs).double()
    return float((result - exact).norm() / exact.norm())
