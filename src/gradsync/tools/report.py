"""Figures that more than one report states (the CLI's tables, the web view, bench's rows).

>>> round(bus_bandwidth(16e6, 0.01, 4) / 1e9, 2)           # 1.6 GB/s of algbw, x 2(N-1)/N
2.4
"""

from __future__ import annotations


def bus_bandwidth(nbytes: float, seconds: float, workers: int) -> float:
    """An all-reduce's bus bandwidth in bytes/s, as nccl-tests defines it: the algorithm
    bandwidth (bytes / time) times 2(N-1)/N, the share of the data each rank's link must carry
    in any all-reduce; 0 for a zero time."""
    if seconds <= 0:
        return 0.0
    return nbytes / seconds * 2 * (workers - 1) / workers
