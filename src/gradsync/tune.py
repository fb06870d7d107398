"""Choosing the fastest algorithm for a topology and a message size.

Predictions come from the simulator (which sees contention on meshes) for up to
``SIMULATE_UP_TO`` workers and from the closed forms beyond, where simulating the quadratic
schedules (sharded) would cost more than it tells.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import algorithms
from .cost import default_options, predict
from .errors import ConfigError
from .simulate import simulate
from .topology import Topology

SIMULATE_UP_TO = 64


@lru_cache(maxsize=4096)
def _predicted(algorithm: str, topology: Topology, workers: int, elements: int, itemsize: int) -> float:
    options = default_options(algorithm, topology, workers)
    if workers <= SIMULATE_UP_TO:
        return simulate(algorithms.build(algorithm, workers, elements, **options), topology, itemsize).time
    return predict(algorithm, topology, workers, elements * itemsize, itemsize, **options)


def predicted_time(algorithm: str, topology: Topology, nbytes: int, itemsize: int = 4,
                   workers: int | None = None) -> float:
    """Predicted seconds to all-reduce ``nbytes`` with ``algorithm`` on ``topology``."""
    workers = len(topology.workers) if workers is None else workers
    return _predicted(algorithm, topology, workers, max(nbytes // itemsize, 0), itemsize)


def choose(topology: Topology, nbytes: int, itemsize: int = 4, workers: int | None = None,
           candidates=algorithms.EXACT) -> str:
    """The candidate with the least predicted time ("auto").

    >>> from gradsync.topology import preset
    >>> choose(preset("pcie-switch-4"), 160_000_000) in ("sharded", "halving_doubling")
    True
    """
    if not candidates:
        raise ConfigError("no candidate algorithms to choose from")
    times = {a: predicted_time(a, topology, nbytes, itemsize, workers) for a in candidates}
    return min(times, key=lambda a: (times[a], candidates.index(a)))


@dataclass(frozen=True)
class Crossover:
    nbytes: int
    below: str
    above: str


def table(topology: Topology, sizes, itemsize: int = 4, candidates=algorithms.EXACT,
          workers: int | None = None) -> tuple[list[dict], list[Crossover]]:
    """Predicted time of every candidate at every size, the best, and the crossover sizes.

    A crossover between two grid sizes is located by bisection (in log size) to within 2%.
    """
    def best(n):
        return choose(topology, int(n), itemsize, workers, candidates)

    rows = []
    for n in sizes:
        times = {a: predicted_time(a, topology, int(n), itemsize, workers) for a in candidates}
        rows.append({"bytes": int(n), "best": min(times, key=times.get), "times_s": times})
    crossovers = []
    for lo_row, hi_row in zip(rows, rows[1:]):
        if lo_row["best"] == hi_row["best"]:
            continue
        lo, hi = np.log(lo_row["bytes"]), np.log(hi_row["bytes"])
        while hi - lo > 0.02:
            mid = (lo + hi) / 2
            if best(np.exp(mid)) == lo_row["best"]:
                lo = mid
            else:
                hi = mid
        crossovers.append(Crossover(int(np.exp(hi)), lo_row["best"], best(np.exp(hi))))
    return rows, crossovers
