"""Why ``auto`` picks what it picks: every candidate's predicted time, split into its terms.

For a topology, a message size and a worker count, each candidate (those ``tune.choose``
weighs) gets: the predicted time ``auto`` compares (``tune.prediction``: the simulator's
wherever it is affordable, the closed form beyond, and which it was), the closed form split
into latency, bandwidth, reduction and codec terms (``cost.terms``), the link the simulator
found busiest for longest (the bottleneck), and, when bench rows are given (``bench --format
json``), the measured time of the same algorithm and size. The winner is the least predicted time; the margin is how much
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
from .tune import Candidate, pool_for, prediction, skipped


def explain(topology: Topology, nbytes: int, itemsize: int = 4, workers: int | None = None, candidates=None,
            max_error: float | None = None, dtype: str = "float32", measured=None) -> dict:
    """Every candidate's predicted time and its terms, the bottleneck link, the winner and the
    margin; ``measured``: bench rows (dicts with algorithm, bytes, time_s) to set beside them.
    ``skipped``: the algorithms the topology cannot run, with the reason."""
    from . import tune
    workers = len(topology.workers) if workers is None else workers
    asked = [c if isinstance(c, Candidate) else Candidate(c)
             for c in (candidates if candidates is not None else tune.default_candidates(workers, dtype, max_error))]
    gone = skipped(topology, workers, [c.algorithm for c in asked])
    pool = pool_for(topology, workers, asked, dtype)
    if not pool:
        raise ConfigError("no candidate algorithms to explain" + (f": {'; '.join(gone.values())}" if gone else ""))
    elements = max(nbytes // itemsize, 0)
    rows = [_row(c, topology, workers, elements, itemsize, dtype, measured) for c in pool]
    order = sorted(range(len(rows)), key=lambda k: rows[k]["predicted_s"])
    best = rows[order[0]]
    second = rows[order[1]] if len(rows) > 1 else None
    margin = second["predicted_s"] / best["predicted_s"] - 1 if second and best["predicted_s"] > 0 else None
    dominant = max(TERMS, key=lambda name: best[name])
    return {"topology": topology.name, "workers": workers, "bytes": elements * itemsize, "dtype": dtype,
            "candidates": rows, "winner": best["candidate"], "runner_up": second["candidate"] if second else None,
            "margin": margin, "winner_dominant_term": dominant, "skipped": gone}


def _row(c, topology, workers, elements, itemsize, dtype, measured) -> dict:
    """One candidate's row: its prediction and what made it, the closed form's terms, and the link
    the simulation found busiest for longest (where it simulated)."""
    from ..algorithms import _compact
    options = {**default_options(c.algorithm, topology, workers), **c.kwargs()}
    closed_options = {k: v for k, v in options.items() if k != "construction"}
    seconds, how = prediction(c, topology, elements * itemsize, itemsize, workers, dtype)
    row = {"candidate": c.label, "algorithm": c.algorithm, "protocol": c.protocol, "predicted_s": seconds,
           "predicted_by": how,
           **terms(c.algorithm, topology, workers, elements * itemsize, itemsize, c.protocol, **closed_options)}
    row["bottleneck"], row["bottleneck_busy"] = None, None
    if how == "simulator":
        schedule = (_compact.build(c.algorithm, workers, elements, **options) if elements >= workers else None) \
            or algorithms.build(c.algorithm, workers, elements, dtype=dtype, **options)
        result = simulate(schedule, topology, itemsize, protocol=c.protocol)
        if result.channel_busy.any():
            k = int(np.argmax(result.channel_busy))
            row["bottleneck"] = result.channel_name(k)
            row["bottleneck_busy"] = float(result.channel_busy[k] / result.time) if result.time else 0.0
    row["measured_s"] = _measured(measured, c.algorithm, elements * itemsize)
    return row


def _measured(rows, algorithm, nbytes):
    if not rows:
        return None
    times = [r["time_s"] for r in rows if r.get("algorithm") == algorithm and r.get("bytes") == nbytes]
    return float(np.median(times)) if times else None
