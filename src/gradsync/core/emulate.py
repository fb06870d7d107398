"""Execute a schedule in one process on N numpy arrays: the semantic reference.

The runtime and the browser view must produce what this produces. Each round works as the
schedule defines it: every transfer carries a snapshot of its source segment as it was after
the previous round; the receiver adds it in (REDUCE) or overwrites (COPY).
"""

from __future__ import annotations

import numpy as np

from .. import algorithms, coding
from ..errors import ConfigError
from .schedule import COPY, Schedule

OPS = ("sum", "avg")
_HAZARD_CHECK_LIMIT = 1 << 22   # above this many read/write pairs in a round, just copy


def check_inputs(inputs) -> list[np.ndarray]:
    """Return the inputs as N equal-shaped numeric arrays, or raise ConfigError naming the odd one."""
    if isinstance(inputs, np.ndarray):
        arrays = list(inputs) if inputs.ndim >= 1 else []
    else:
        arrays = [np.asarray(a) for a in inputs]
    if not arrays:
        raise ConfigError("inputs must be a non-empty list of arrays, one per worker")
    ref = arrays[0]
    for w, a in enumerate(arrays):
        if a.shape != ref.shape or a.dtype != ref.dtype:
            raise ConfigError(f"worker {w}'s input has shape {a.shape} and dtype {a.dtype}; "
                              f"worker 0's has {ref.shape} and {ref.dtype}: all must match")
    if ref.dtype.kind not in "iuf":
        raise ConfigError(f"dtype {ref.dtype} is not supported: expected an integer or float type")
    return arrays


def _reads_race_writes(t: np.ndarray) -> bool:
    """Does a transfer of this round read elements another transfer of it writes?"""
    if len(t) * len(t) > _HAZARD_CHECK_LIMIT:
        return True
    end = t["offset"] + t["count"]
    return bool(((t["src"][:, None] == t["dst"][None, :])      # read i and write j on one node,
                 & (t["offset"][:, None] < end[None, :])        # overlapping
                 & (t["offset"][None, :] < end[:, None])).any())


def run_schedule(schedule: Schedule, buffers: np.ndarray) -> None:
    """Apply ``schedule`` in place to ``buffers`` (one row per node, helpers included)."""
    tr = schedule.transfers
    for r in range(schedule.rounds):
        lo, hi = schedule.round_starts[r], schedule.round_starts[r + 1]
        rows = list(zip(tr["src"][lo:hi].tolist(), tr["dst"][lo:hi].tolist(), tr["offset"][lo:hi].tolist(),
                        tr["count"][lo:hi].tolist(), tr["op"][lo:hi].tolist()))
        # where a transfer of the round writes what another reads, every payload is taken
        # before any is applied: each carries its source as it was after the previous round
        snapshot = _reads_race_writes(tr[lo:hi])
        payloads = [buffers[src, off:off + cnt].copy() for src, _, off, cnt, _ in rows] if snapshot else None
        for i, (src, dst, off, cnt, op) in enumerate(rows):
            payload = payloads[i] if snapshot else buffers[src, off:off + cnt]
            target = buffers[dst, off:off + cnt]
            if op == COPY:
                target[...] = payload
            else:
                np.add(target, payload, out=target)


def emulate(algorithm: str | Schedule, inputs, op: str = "sum", **options) -> np.ndarray:
    """All-reduce ``inputs`` (one array per worker) with ``algorithm``; return every worker's result.

    >>> import numpy as np
    >>> emulate("ring", [np.arange(5.0), np.ones(5)])[1].tolist()
    [1.0, 2.0, 3.0, 4.0, 5.0]
    """
    if op not in OPS:
        raise ConfigError(f"op must be one of {', '.join(OPS)}, got {op!r}")
    arrays = check_inputs(inputs)
    workers, shape, dtype = len(arrays), arrays[0].shape, arrays[0].dtype
    elements = arrays[0].size
    if op == "avg" and dtype.kind != "f":
        raise ConfigError(f"op 'avg' needs a float dtype, got {dtype}: use 'sum' and divide")
    if isinstance(algorithm, Schedule):
        schedule = algorithm
        if (schedule.workers, schedule.elements) != (workers, elements):
            raise ConfigError(f"schedule is for {schedule.workers} workers x {schedule.elements} "
                              f"elements, inputs are {workers} x {elements}")
    else:
        schedule = algorithms.build(algorithm, workers, elements, dtype=dtype, **options)
    buffers = np.empty((schedule.nodes, elements), dtype)   # one copy of the inputs, no more
    for w, a in enumerate(arrays):
        buffers[w] = a.reshape(-1)
    buffers[workers:] = 0
    if schedule.codec is not None:
        result = coding.emulate(schedule, buffers[:workers])
    else:
        run_schedule(schedule, buffers)
        result = buffers[:workers]
    if op == "avg":
        result /= workers
    return result.reshape(workers, *shape)
