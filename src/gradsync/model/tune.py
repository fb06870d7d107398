"""Choosing the fastest algorithm for a topology and a message size.

Predictions come from the simulator (which sees contention on meshes) for up to
``SIMULATE_UP_TO`` workers and from the closed forms beyond, where simulating the quadratic
schedules (sharded) would cost more than it tells.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import algorithms
from .cost import default_options, predict, uniform
from ..errors import ConfigError
from .simulate import simulate
from .topology import Topology

SIMULATE_UP_TO = 64
CERAR_COMPONENTS = (1.0, 1.5, 2.0, 3.0, 4.0)   # multiples of N tried when an error budget is given


@dataclass(frozen=True)
class Candidate:
    """An algorithm with its options, as ``auto`` considers it."""

    algorithm: str
    options: tuple = ()            # sorted (key, value) pairs, hashable for caching

    @property
    def label(self) -> str:
        return self.algorithm + ("(" + ", ".join(f"{k}={v}" for k, v in self.options) + ")" if self.options else "")

    def kwargs(self) -> dict:
        return dict(self.options)


def default_candidates(workers: int, dtype: str = "float32", max_error: float | None = None,
                       exact=None) -> list[Candidate]:
    """The exact algorithms (default: every registered one that takes ``dtype``), plus CERAR
    designs whose error (``checked_error`` of the default design) is within ``max_error``:
    never one that building it would refuse.

    >>> [c.label for c in default_candidates(4, max_error=1e-2)][-1]
    'cerar(components=8)'
    """
    if exact is None:
        exact = [a for a in algorithms.names(exact=True) if algorithms.get(a).accepts(dtype)]
    out = [Candidate(a) for a in exact]
    if max_error is None:
        return out
    if not 0 < max_error < 1:
        raise ConfigError(f"max_error must be in (0, 1), got {max_error!r}")
    from ..coding import cerar
    if workers < 2 or not algorithms.get("cerar").accepts(dtype):
        return out
    for factor in CERAR_COMPONENTS:          # the error grows with c: stop at the first one over
        c = int(np.ceil(factor * workers))
        if cerar.best(workers, c, dtype).checked_error(dtype) > max_error:
            break
        # the budget goes with the candidate where it is looser than the codec's default, which
        # would refuse the design when it is built
        looser = (("max_error", max_error),) if max_error > cerar.DEFAULT_MAX_ERROR else ()
        out.append(Candidate("cerar", (("components", c),) + looser))
    return out


@lru_cache(maxsize=4096)
def _predicted(candidate: Candidate, topology: Topology, workers: int, elements: int, itemsize: int,
               dtype: str) -> float:
    options = {**default_options(candidate.algorithm, topology, workers), **candidate.kwargs()}
    if workers <= SIMULATE_UP_TO:
        schedule = algorithms.build(candidate.algorithm, workers, elements, dtype=dtype, **options)
        return simulate(schedule, topology, itemsize).time
    options.pop("construction", None)
    return predict(candidate.algorithm, topology, workers, elements * itemsize, itemsize, **options)


def _as_candidate(c) -> Candidate:
    return c if isinstance(c, Candidate) else Candidate(c)


def predicted_time(candidate, topology: Topology, nbytes: int, itemsize: int = 4,
                   workers: int | None = None, dtype: str = "float32") -> float:
    """Predicted seconds to all-reduce ``nbytes`` with ``candidate`` (a name or Candidate)."""
    workers = len(topology.workers) if workers is None else workers
    return _predicted(_as_candidate(candidate), topology, workers, max(nbytes // itemsize, 0), itemsize, dtype)


def choose(topology: Topology, nbytes: int, itemsize: int = 4, workers: int | None = None,
           candidates=None, max_error: float | None = None, dtype: str = "float32",
           quick: bool = False) -> Candidate:
    """The candidate with the least predicted time ("auto"). ``quick``: on a topology where
    every pair of workers sees the same route (``cost.uniform``) and no node sets the costs
    only the simulator models (a calibrated topology's copy rate, per-message overhead,
    incast), use the closed forms, which agree with the simulator there, instead of
    simulating (milliseconds instead of seconds at 64 workers).

    >>> from gradsync.model.topology import preset
    >>> choose(preset("pcie-switch-4"), 160_000_000).label in ("sharded", "halving_doubling")
    True
    """
    workers = len(topology.workers) if workers is None else workers
    pool = [_as_candidate(c) for c in (candidates if candidates is not None
                                       else default_candidates(workers, dtype, max_error))]
    if not pool:
        raise ConfigError("no candidate algorithms to choose from")
    if quick and uniform(topology, workers) and not topology.has_node_costs:
        times = [predict(c.algorithm, topology, workers, nbytes, itemsize, **c.kwargs()) for c in pool]
    else:
        times = [predicted_time(c, topology, nbytes, itemsize, workers, dtype) for c in pool]
    return pool[int(np.argmin(times))]


@dataclass(frozen=True)
class Crossover:
    nbytes: int
    below: str
    above: str


def table(topology: Topology, sizes, itemsize: int = 4, candidates=None, workers: int | None = None,
          max_error: float | None = None, dtype: str = "float32") -> tuple[list[dict], list[Crossover]]:
    """Predicted time of every candidate at every size, the best, and the crossover sizes.

    Crossovers between two grid sizes with different bests are located by bisection (in log
    size) to within 2%, every one of them: a -> b -> c between two grid points gives two. A
    change and its reversal inside one bisection interval (a -> b -> a) are not seen.

    >>> from gradsync.model.topology import preset
    >>> _, crossovers = table(preset("ethernet", 8), [1000, 10**9], candidates=["central", "ring", "tree"])
    >>> [(c.below, c.above) for c in crossovers]
    [('central', 'tree'), ('tree', 'ring')]
    """
    workers = len(topology.workers) if workers is None else workers
    pool = [_as_candidate(c) for c in (candidates if candidates is not None
                                       else default_candidates(workers, dtype, max_error))]

    def best(n):
        return choose(topology, int(n), itemsize, workers, pool, dtype=dtype).label

    rows = []
    for n in sizes:
        times = {c.label: predicted_time(c, topology, int(n), itemsize, workers, dtype) for c in pool}
        rows.append({"bytes": int(n), "best": min(times, key=times.get), "times_s": times})

    def changes(lo, lo_best, hi, hi_best):     # every change of the best between log sizes lo and hi
        if hi - lo <= 0.02:
            return [Crossover(int(np.exp(hi)), lo_best, hi_best)]
        mid = (lo + hi) / 2
        mid_best = best(np.exp(mid))
        return ((changes(lo, lo_best, mid, mid_best) if mid_best != lo_best else [])
                + (changes(mid, mid_best, hi, hi_best) if mid_best != hi_best else []))

    crossovers = []
    for lo_row, hi_row in zip(rows, rows[1:]):
        if lo_row["best"] != hi_row["best"]:
            crossovers += changes(np.log(lo_row["bytes"]), lo_row["best"], np.log(hi_row["bytes"]), hi_row["best"])
    return rows, crossovers
