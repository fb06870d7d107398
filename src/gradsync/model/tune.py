"""Choosing the fastest algorithm (and, on a GPU machine, NCCL protocol) for a topology and a
message size.

Predictions come from the simulator wherever it is affordable: every algorithm with a compact
form at any size (one block of workers), every other one up to ``SIMULATE_UP_TO`` workers.
Beyond, the closed form stands in, and each prediction says which it is (``predicted_by``).
Algorithms the topology cannot run (a host, a switch that reduces: ``cost.runnable``) are left
out, and ``skipped`` names them with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import algorithms
from .cost import default_options, predict, runnable, uniform
from ..errors import ConfigError
from .simulate import simulate
from .topology import Topology

SIMULATE_UP_TO = 64
CERAR_COMPONENTS = (1.0, 1.5, 2.0, 3.0, 4.0)   # multiples of N tried when an error budget is given
SIMPLE_ONLY = ("nvls", "nvls_tree", "pat")      # NCCL runs NVLS, NVLS-tree and PAT with Simple alone


@dataclass(frozen=True)
class Candidate:
    """An algorithm with its options (and on a GPU machine its protocol), as ``auto`` considers it."""

    algorithm: str
    options: tuple = ()            # sorted (key, value) pairs, hashable for caching
    protocol: str | None = None    # NCCL's protocol (ll, ll128, simple) on a GPU topology; None: its default

    @property
    def label(self) -> str:
        options = "(" + ", ".join(f"{k}={v}" for k, v in self.options) + ")" if self.options else ""
        return self.algorithm + options + (f"/{self.protocol}" if self.protocol else "")

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


def gpu_candidates(topology: Topology, pool) -> list[Candidate]:
    """On a GPU topology, every candidate once per protocol the machine offers (NVLS, NVLS-tree
    and PAT with Simple only, as NCCL runs them); elsewhere the candidates as they are.

    >>> from gradsync.model.topology import preset
    >>> [c.label for c in gpu_candidates(preset("hgx-h100"), [Candidate("nvls"), Candidate("ring")])]
    ['nvls/simple', 'ring/ll', 'ring/ll128', 'ring/simple']
    """
    if topology.gpu is None:
        return list(pool)
    return [Candidate(c.algorithm, c.options, p) for c in pool
            for p in (("simple",) if c.algorithm in SIMPLE_ONLY else topology.gpu.protocols)
            if c.protocol is None or c.protocol == p]


def skipped(topology: Topology, workers: int, names) -> dict[str, str]:
    """The algorithms among ``names`` the topology cannot run, each with the reason (``runnable``)."""
    out = {}
    for name in dict.fromkeys(names):
        reason = runnable(name, topology, workers, default_options(name, topology, workers))
        if reason:
            out[name] = reason
    return out


@lru_cache(maxsize=4096)
def _predicted(candidate: Candidate, topology: Topology, workers: int, elements: int, itemsize: int,
               dtype: str) -> tuple[float, str]:
    """The candidate's predicted seconds and what predicted them: "simulator" (its compact form
    at any size, its table up to SIMULATE_UP_TO workers) or "closed form"."""
    from ..algorithms import _compact
    options = {**default_options(candidate.algorithm, topology, workers), **candidate.kwargs()}
    compact = _compact.build(candidate.algorithm, workers, elements, **options) if elements >= workers else None
    if compact is not None or workers <= SIMULATE_UP_TO:
        schedule = compact or algorithms.build(candidate.algorithm, workers, elements, dtype=dtype, **options)
        return simulate(schedule, topology, itemsize, protocol=candidate.protocol).time, "simulator"
    options.pop("construction", None)
    return predict(candidate.algorithm, topology, workers, elements * itemsize, itemsize, candidate.protocol,
                   **options), "closed form"


def _as_candidate(c) -> Candidate:
    return c if isinstance(c, Candidate) else Candidate(c)


def predicted_time(candidate, topology: Topology, nbytes: int, itemsize: int = 4,
                   workers: int | None = None, dtype: str = "float32") -> float:
    """Predicted seconds to all-reduce ``nbytes`` with ``candidate`` (a name or Candidate)."""
    return prediction(candidate, topology, nbytes, itemsize, workers, dtype)[0]


def prediction(candidate, topology: Topology, nbytes: int, itemsize: int = 4, workers: int | None = None,
               dtype: str = "float32") -> tuple[float, str]:
    """``predicted_time`` and what predicted it: "simulator" or "closed form"."""
    workers = len(topology.workers) if workers is None else workers
    return _predicted(_as_candidate(candidate), topology, workers, max(nbytes // itemsize, 0), itemsize, dtype)


def pool_for(topology: Topology, workers: int, candidates=None, dtype: str = "float32",
             max_error: float | None = None) -> list[Candidate]:
    """The candidates tune, explain and auto weigh: those given (names or Candidates) or the
    default ones, less those the topology cannot run (``skipped``), once per protocol on a GPU
    machine."""
    pool = [_as_candidate(c) for c in (candidates if candidates is not None
                                       else default_candidates(workers, dtype, max_error))]
    gone = skipped(topology, workers, [c.algorithm for c in pool])
    return gpu_candidates(topology, [c for c in pool if c.algorithm not in gone])


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
    pool = pool_for(topology, workers, candidates, dtype, max_error)
    if not pool:
        raise ConfigError("no candidate algorithms to choose from")
    if quick and uniform(topology, workers) and not topology.has_node_costs and topology.gpu is None:
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
    pool = pool_for(topology, workers, candidates, dtype, max_error)

    def best(n):
        return choose(topology, int(n), itemsize, workers, pool, dtype=dtype).label

    rows = []
    for n in sizes:
        found = {c.label: prediction(c, topology, int(n), itemsize, workers, dtype) for c in pool}
        times = {label: t for label, (t, _) in found.items()}
        rows.append({"bytes": int(n), "best": min(times, key=times.get), "times_s": times,
                     "predicted_by": {label: how for label, (_, how) in found.items()}})

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
