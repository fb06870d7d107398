"""What the page says about a schedule, beside drawing it: the narration of its rounds, the
channels (rings) its transfers run on, and its closed form with this configuration's numbers.

>>> from gradsync import algorithms
>>> channels(algorithms.build("ring", 4, 8)) is None
True
"""

from __future__ import annotations

import numpy as np

from ..core.narrate import narrate
from ..core.schedule import CODED, COPY, REDUCE
from ..errors import ConfigError
from ..model.topology import Topology


def narration(spec, schedule, cuts, names=None, detail: bool = True) -> list[dict]:
    """The schedule told round by round (``core.narrate``), its phases named as the algorithm
    names them, and by level (inside or across machines) for an algorithm that groups workers
    into machines (its ``machine_option``), its lanes by the algorithm's word for them.

    >>> from gradsync import algorithms
    >>> narration(algorithms.get("ring"), algorithms.build("ring", 4, 8), [0, 2, 4, 6, 8])[0]["phase"]
    'reduce-scatter'
    """
    ops = {"reduce": REDUCE, "copy": COPY, "coded": CODED}
    phases = {}
    for key, name in spec.phases.items():
        kind, _, level = key.partition(" ")
        phases[(ops[kind], level) if level else ops[kind]] = name
    machine = schedule.options.get(spec.machine_option) if spec.machine_option else None
    return narrate(schedule, cuts, names, phases, machine_size=machine, detail=detail, lane_name=spec.lane_name)


def channels(schedule) -> list[int] | None:
    """Which channel (ring) each transfer runs on, where several run at once on their own parts
    of the buffer: the schedule's own ``channel`` column if it has one, else the part of the
    buffer its rings' ``weights`` split it into; None for one channel.

    >>> from gradsync import algorithms
    >>> channels(algorithms.build("ring", 2, 6, rings=[[0, 1], [1, 0]], weights=[2, 1]))
    [0, 0, 1, 1, 0, 0, 1, 1]
    """
    t = schedule.transfers
    if "channel" in (t.dtype.names or ()):
        return t["channel"].tolist() if len(np.unique(t["channel"])) > 1 else None
    weights = schedule.options.get("weights")
    if not weights or len(weights) < 2:
        return None
    from ..core.schedule import chunk_bounds
    bounds = chunk_bounds(schedule.elements, len(weights), weights)
    return (np.searchsorted(bounds, t["offset"], side="right") - 1).tolist()


def cost_formula(spec) -> str | None:
    """The algorithm's closed form in its author's words: the "Cost:" sentence of its
    explanation, else of its module's docstring.

    >>> from gradsync import algorithms
    >>> cost_formula(algorithms.get("ring"))
    '2 (N - 1) (alpha + n / (N B))'
    """
    import re
    import sys
    for text in (spec.explanation, sys.modules[spec.schedule.__module__].__doc__ or ""):
        found = re.search(r"Cost[^:.]*: (.+?)(?:\. |: |; |, every |\.$|$)", " ".join(text.split()))
        if found:
            return found[1]
    return None


def closed_form(spec, topo: Topology, n: int, nbytes: int, itemsize: int, options: dict) -> dict | None:
    """The closed form for this configuration, split into its latency, bandwidth, reduction and
    codec terms (``model.cost.terms``), with the parameters it reads off the topology (alpha,
    beta, ... of ``net_for``) and the formula in words; None where it has none."""
    from ..model.cost import net_for, terms
    options = {k: v for k, v in options.items() if k != "max_error"}
    try:
        parts = terms(spec.name, topo, n, nbytes * itemsize // 4, itemsize=itemsize, **options)
        net = net_for(topo, n, options)
    except (ConfigError, ValueError, ZeroDivisionError):
        return None
    params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(net).items() if v not in (None, 0.0, ())}
    return {"formula": cost_formula(spec), "terms": parts, "net": params}
