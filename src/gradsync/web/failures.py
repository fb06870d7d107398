"""What a device failure does to a simulated collective, worked out from its timeline.

>>> from gradsync import algorithms
>>> from gradsync.model.simulate import simulate
>>> from gradsync.model.topology import preset
>>> out = failure(simulate(algorithms.build("ring", 4, 1000), preset("ring", 4)), device=2, at=0.0)
>>> out["completed"].count(True), [s["node"] for s in out["stopped"]]
(0, [0, 1, 2, 3])
"""

from __future__ import annotations

import math

import numpy as np

from ..model.simulate import SimResult


def failure(result: SimResult, device: int, at: float) -> dict:
    """Which transfers complete when worker ``device`` dies at time ``at``, and when and how
    each other node stops: a transfer completes only if both ends are alive until it is done;
    a node waiting for one that cannot stops then, reporting the failed rank (as the
    runtime's PeerError does)."""
    t = result.schedule.transfers
    blocked = {device: at}
    changed = True
    while changed:
        changed = False
        for i in np.argsort(result.start, kind="stable"):
            s, d = int(t["src"][i]), int(t["dst"][i])
            stop = min(blocked.get(s, math.inf), blocked.get(d, math.inf))
            if result.done[i] <= stop:
                continue
            when = max(result.start[i], stop)
            for node in (s, d):
                if blocked.get(node, math.inf) > when:
                    blocked[node] = when
                    changed = True
    completed = [bool(result.done[i] <= min(blocked.get(int(t["src"][i]), math.inf),
                                             blocked.get(int(t["dst"][i]), math.inf))) for i in range(len(t))]
    stopped = [{"node": n, "at_s": float(w), "message": "failed" if n == device else
                f"PeerError: rank {device} failed; collective abandoned"} for n, w in sorted(blocked.items())]
    return {"device": device, "at_s": at, "completed": completed, "stopped": stopped}
