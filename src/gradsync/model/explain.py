"""Why ``auto`` picks what it picks: every candidate's predicted time, split into its terms.

For a topology, a message size and a worker count, each candidate (those ``tune.choose``
weighs) gets: the predicted time ``auto`` compares (the simulator's up to ``SIMULATE_UP_TO``
workers, the closed form beyond), the closed form split into latency, bandwidth, reduction and
codec terms (``cost.terms``), the link the simulator found busiest for longest (the
bottleneck), and, when bench rows are given (``bench --format json``), the measured time of
the same algorithm and size. The winner is the least predicted time; the margin is how much
slower the next best is predicted to be.

>>> from gradsync.model.topology import preset
>>> out = explain(preset("ethernet", 4), 4_000_000, candidates=["ring", "central"])
>>> out["winner"], out["runner_up"], out["margin"] > 0
('ring', 'central', True)
"""

from __future__ import annotations

import numpy as np

from .. import algorithms
from .cost import TERMS, default_options, terms
from ..errors import ConfigError
from .simulate import simulate
from .topology import Topology
from .tune import SIMULATE_UP_TO, Candidate, default_candidates, predicted_time


def explain(topology: Topology, nbytes: int, itemsize: int = 4, workers: int | None = None, candidates=None,
            max_error: float | None = None, dtype: str = "float32", measured=None) -> dict:
    """Every candidate's predicted time and its terms, the bottleneck link, the winner and the
    margin; ``measured``: bench rows (dicts with algorithm, bytes, time_s) to set beside them."""
    workers = len(topology.workers) if workers is None else workers
    pool = [c if isinstance(c, Candidate) else Candidate(c)
            for c in (candidates if candidates is not None else default_candidates(workers, dtype, max_error))]
    if not pool:
        raise ConfigError("no candidate algorithms to explain")
    elements = max(nbytes // itemsize, 0)
    rows = []
    for c in pool:
        options = {**default_options(c.algorithm, topology, workers), **c.kwargs()}
        closed_options = {k: v for k, v in options.items() if k != "construction"}
        row = {"candidate": c.label, "algorithm": c.algorithm,
               "predicted_s": predicted_time(c, topology, nbytes, itemsize, workers, dtype),
               "predicted_by": "simulator" if workers <= SIMULATE_UP_TO else "closed form",
               **terms(c.algorithm, topology, workers, elements * itemsize, itemsize, **closed_options)}
        row["bottleneck"], row["bottleneck_busy"] = None, None
        if workers <= SIMULATE_UP_TO:
            result = simulate(algorithms.build(c.algorithm, workers, elements, dtype=dtype, **options), topology,
                              itemsize)
            if result.channel_busy.any():
                k = int(np.argmax(result.channel_busy))
                row["bottleneck"] = result.channel_name(k)
                row["bottleneck_busy"] = float(result.channel_busy[k] / result.time) if result.time else 0.0
        row["measured_s"] = _measured(measured, c.algorithm, elements * itemsize)
        rows.append(row)
    order = sorted(range(len(rows)), key=lambda k: rows[k]["predicted_s"])
    best = rows[order[0]]
    second = rows[order[1]] if len(rows) > 1 else None
    margin = second["predicted_s"] / best["predicted_s"] - 1 if second and best["predicted_s"] > 0 else None
    dominant = max(TERMS, key=lambda name: best[name])
    return {"topology": topology.name, "workers": workers, "bytes": elements * itemsize, "dtype": dtype,
            "candidates": rows, "winner": best["candidate"], "runner_up": second["candidate"] if second else None,
            "margin": margin, "winner_dominant_term": dominant}


def _measured(rows, algorithm, nbytes):
    if not rows:
        return None
    times = [r["time_s"] for r in rows if r.get("algorithm") == algorithm and r.get("bytes") == nbytes]
    return float(np.median(times)) if times else None
