"""The memory bound of a one-host all-reduce: the bytes its ranks must move through memory
over the rates this machine's memory reaches with every rank busy at once, as nccl-tests sets
busbw against the line rate. ``gradsync bench`` prints it beside the shared-buffer rows, and
``benchmarks/one_host.py`` beside its medians; the derivation is in docs/one_host.md.

- one-shot: each rank copies S into its slot, then sums N rows of S into its tensor;
- two-shot (``sharded`` by reads): each rank copies S in, sums N rows of S/N, writes its S/N
  back to its slot and copies the other (N - 1) S/N out: 2 S copied, N rows of S/N summed.

>>> rates = {"copy_Bps": 10e9, "sum_read_Bps": 20e9}
>>> round(bound_s("one_shot", 1 << 20, 2, rates) * 1e6), round(bound_s("sharded", 1 << 20, 2, rates) * 1e6)
(419, 524)
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

# The rates are measured on arrays larger than this machine's last-level cache shares (105 MB
# for 2 cores here): 64 MB copied per rank, and N rows of 16 MB summed.
COPY_ELEMENTS, ROW_ELEMENTS = 16 << 20, 4 << 20
ALGORITHMS = ("one_shot", "sharded")        # the shared-buffer all-reduces a bound is known for


def rates_bytes(workers: int) -> int:
    """Each rank's memory while it measures the rates: ``rates_bytes(2) == 192 << 20``."""
    return 4 * (2 * COPY_ELEMENTS + (workers + 1) * ROW_ELEMENTS)


def measure_rates(workers: int, barrier: Callable[[], None], slowest: Callable[[float], float]) -> dict:
    """Bytes per second over all ranks at once, every rank of the host calling it together: a
    copy (``copy_Bps``: bytes copied) and a sum of N rows into one (``sum_read_Bps``: bytes
    read). ``barrier()`` lines the ranks up; ``slowest(seconds)`` is the largest over ranks.

    Example, in each of N ranks after ``init_process_group``:
    ``measure_rates(N, dist.barrier, lambda s: max_over_ranks(s))``.
    """
    src, dst = torch.ones(COPY_ELEMENTS), torch.empty(COPY_ELEMENTS)
    rows, out = torch.ones(workers, ROW_ELEMENTS), torch.empty(ROW_ELEMENTS)

    def timed(fn, iters: int = 3) -> float:
        barrier()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return slowest((time.perf_counter() - start) / iters)

    copy = statistics.median(timed(lambda: dst.copy_(src)) for _ in range(3))
    add = statistics.median(timed(lambda: torch.sum(rows, dim=0, out=out)) for _ in range(3))
    return {"copy_Bps": workers * src.numel() * 4 / copy, "sum_read_Bps": workers * rows.numel() * 4 / add}


def bound_s(algorithm: str, nbytes: int, workers: int, rates: dict) -> float:
    """Seconds all ranks need at least to move what ``algorithm`` ("one_shot" or "sharded")
    moves through memory for an all-reduce of ``nbytes`` on ``workers`` ranks."""
    if algorithm == "one_shot":
        copied, summed = workers * nbytes, workers * workers * nbytes
    elif algorithm == "sharded":
        copied, summed = workers * 2 * nbytes, workers * nbytes
    else:
        raise ValueError(f"a memory bound is known for {', '.join(ALGORITHMS)}, not {algorithm!r}")
    return copied / rates["copy_Bps"] + summed / rates["sum_read_Bps"]


def predicted_s(bound: float, rounds: int, node) -> float:
    """A shared-buffer all-reduce's time from a memory model, not from links the calibration
    measured over Gloo: its memory bound plus the calibrated fixed costs of a call on ``node`` (a
    topology ``Node``), one per collective and one per round (each round ends in a barrier).
    ``gradsync bench --topology`` predicts the shared-buffer rows so. ``predicted_s(1e-3, 2, node)``."""
    return bound + (node.collective_overhead or 0.0) + rounds * (node.round_overhead or 0.0)
