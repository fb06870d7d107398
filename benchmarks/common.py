"""Helpers shared by the benchmark scripts."""

import statistics
import time


def median_time(fn, repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``fn`` (timings here are noisy: 2 shared cores)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def step_times(step, variants, steps: int, blocks: int, barrier) -> dict:
    """Per variant, the median seconds of one ``step(variant)``: the variants take turns in
    ``blocks`` blocks of ``steps`` steps each, after one untimed block; ``barrier()`` starts
    every block on all ranks together."""
    times = {name: [] for name in variants}
    for block in range(blocks + 1):
        for name in variants:
            barrier()
            start = time.perf_counter()
            for _ in range(steps):
                step(name)
            if block:
                times[name].append((time.perf_counter() - start) / steps)
    return {name: statistics.median(t) for name, t in times.items()}
