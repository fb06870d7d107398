"""What a device failure does to a simulated collective, worked out from its timeline, with
the runtime's own detection delay.

How the runtime finds a failure (``gradsync.runtime``), and so how the model does:

- **crash** (the process dies): on one host the shared-memory transport's waiters check their
  peers' processes every ``CHECK_EVERY_S`` (``runtime.transport.shm.group``), counted from
  when each began waiting, and the first rank to see the failure records it in the group's
  segment so every survivor names the same rank. A survivor whose wait cannot finish stops at
  its first liveness check at or after the moment the failure reaches it: the death itself
  when it waits for the dead rank (or for a rank that never gets to that round), or the stop
  of the survivor it waits for (that peer's frames flow until it stops). ``check_every_s=0``
  is the Gloo path's crash: a dead process's connections close at once.
- **stall** (the process lives but stops answering): nothing closes and every pid lives, so
  a survivor is only stopped by the collective's deadline, ``timeout_s`` after the call
  began (``runtime.api``: one deadline per collective, ``DEFAULT_TIMEOUT`` unless given).

Ring, 4 workers, worker 2 crashes at the start: with connections that close at once
(``check_every_s=0``) nothing completes; with the runtime's liveness checks its peers keep
moving the data they can until their check finds it, 10 ms later:

>>> from gradsync import algorithms
>>> from gradsync.model.simulate import simulate
>>> from gradsync.model.topology import preset
>>> r = simulate(algorithms.build("ring", 4, 1000), preset("ring", 4))
>>> out = failure(r, device=2, at=0.0, check_every_s=0)
>>> out["completed"].count(True), [s["node"] for s in out["stopped"]]
(0, [0, 1, 2, 3])
>>> [round(s["at_s"] - s["died_s"], 4) for s in failure(r, device=2, at=0.0)["stopped"]]
[0.01, 0.01, 0.0, 0.01]
"""

from __future__ import annotations

import math
from functools import cache

MODES = ("crash", "stall")


@cache
def detection_defaults() -> dict:
    """The runtime's detection parameters, read from the runtime itself (imported here, on
    first use: the runtime brings torch): the shared-memory liveness check's interval and the
    collective's default timeout, both in seconds."""
    from ..runtime.request import DEFAULT_TIMEOUT
    from ..runtime.transport.shm.group import CHECK_EVERY_S
    return {"modes": list(MODES), "check_every_s": float(CHECK_EVERY_S), "timeout_s": float(DEFAULT_TIMEOUT)}


def _columns(result):
    """(src, dst, round, start, done) as Python lists, from a SimResult or from the view's
    ``transfers`` (a dict of columns)."""
    if isinstance(result, dict):
        return [list(map(int, result[k])) for k in ("src", "dst", "round")] + \
               [list(map(float, result[k])) for k in ("start", "done")]
    t = result.schedule.transfers
    return [t["src"].tolist(), t["dst"].tolist(), t["round"].tolist(), result.start.tolist(), result.done.tolist()]


def detected(detection: str, check_every_s: float, timeout_s: float, began: float, seen: float) -> float:
    """When a rank that began waiting at ``began`` raises, the failure reaching it at ``seen``:
    crash, its first liveness check (every ``check_every_s`` from ``began``) at or after
    ``seen`` (at once with 0); stall, the collective's deadline (``timeout_s`` after it began)
    unless it waits only from later.

    >>> detected("crash", 0.01, 60.0, 0.002, 0.0065), detected("stall", 0.01, 60.0, 0.002, 0.0065)
    (0.012, 60.0)
    """
    if detection == "stall":
        return max(began, seen, timeout_s)
    if check_every_s <= 0:
        return max(began, seen)
    return began + check_every_s * max(1, math.ceil((seen - began) / check_every_s))


def failure(result, device: int, at: float, detection: str = "crash", check_every_s: float | None = None,
            timeout_s: float | None = None) -> dict:
    """Which transfers complete when worker ``device`` crashes (or stalls: ``detection``) at
    time ``at``, and when and why each other worker stops.

    ``result``: a ``SimResult`` or the view's ``transfers`` columns (src, dst, round, start,
    done). A worker's rounds are sequential, so one that cannot finish a round never starts a
    later one; a transfer completes if both ends reach its round and neither has stopped by
    the time it is delivered. A worker stuck in a round stops when the runtime would find the
    failure (``detected``), having begun waiting when its first transfer of that round started:
    each entry of ``stopped`` has its ``at_s`` (this rank raises ``PeerError``), ``died_s``,
    ``began_s``, ``seen_s`` (when the failure reached it), ``waited_for`` (the peer of the
    transfer it was blocked on) and the ``message``. ``check_every_s`` and ``timeout_s``
    default to the runtime's (``detection_defaults``)."""
    if detection not in MODES:
        raise ValueError(f"detection must be one of {', '.join(MODES)}, got {detection!r}")
    defaults = detection_defaults()
    every = defaults["check_every_s"] if check_every_s is None else float(check_every_s)
    timeout = defaults["timeout_s"] if timeout_s is None else float(timeout_s)
    columns = _columns(result)
    end, cause, completes = _spread(columns, device, at,
                                    lambda began, seen: detected(detection, every, timeout, began, seen))
    src, dst = columns[0], columns[1]
    stopped = []
    for x in range(len(end)):
        if x == device:
            stopped.append({"node": x, "at_s": at, "died_s": at, "began_s": None, "seen_s": at, "waited_for": None,
                            "message": "died: its process is gone" if detection == "crash" else
                            "stalled: alive, but it no longer sends or receives"})
        elif end[x] < math.inf:
            began, seen, i, y, via = cause[x]
            stopped.append({"node": x, "at_s": end[x], "died_s": at, "began_s": began, "seen_s": seen, "waited_for": y,
                            "message": _message(detection, every, device, y, "receive from" if dst[i] == x else "send to",
                                                via)})
    return {"device": device, "at_s": at, "detection": detection, "check_every_s": every, "timeout_s": timeout,
            "completed": [completes(i) for i in range(len(src))], "stopped": stopped}


def _spread(columns, device: int, at: float, when_detected):
    """How the failure of ``device`` at ``at`` spreads, to a fixed point: per node the time it
    stops (``end``), why (``cause``: began, seen, transfer, peer, whether through a stopped
    survivor) and ``completes(i)``, whether transfer i is delivered."""
    src, dst, rnd, start, done = columns
    nodes = max([device] + src + dst) + 1
    order = sorted(range(len(src)), key=lambda i: start[i])
    end, stuck = [math.inf] * nodes, [math.inf] * nodes      # when each stops; the round it cannot finish
    end[device] = at
    cause: dict[int, tuple] = {}
    rounds: dict[tuple, list] = {}                           # (node, round) -> its transfers, by start
    for i in order:
        for x in (src[i], dst[i]):
            rounds.setdefault((x, rnd[i]), []).append(i)

    def completes(i: int) -> bool:
        s, d, r = src[i], dst[i], rnd[i]
        return r <= stuck[s] and r <= stuck[d] and done[i] <= min(end[s], end[d])

    changed = True
    while changed:
        changed = False
        for i in order:
            if completes(i):
                continue
            for x in (src[i], dst[i]):
                if x != device and stuck[x] > rnd[i]:
                    stuck[x] = rnd[i]
                    changed = True
        for x in range(nodes):
            if x == device or stuck[x] == math.inf:
                continue
            seen, why = math.inf, None
            for i in rounds[(x, stuck[x])]:
                if completes(i):
                    continue
                y = dst[i] if src[i] == x else src[i]
                if y == device or stuck[y] < stuck[x]:   # the death, or a peer that never gets here
                    v, via = at, False
                elif end[y] < math.inf:                  # a survivor that stopped: its frames flow until then
                    v, via = end[y], True
                else:
                    continue
                if v < seen:
                    seen, why = v, (i, y, via)
            if why is None:
                continue
            began = start[rounds[(x, stuck[x])][0]]
            when = when_detected(began, seen)
            if when < end[x]:
                end[x], cause[x] = when, (began, seen) + why
                changed = True
    return end, cause, completes


def _message(detection: str, every: float, device: int, peer: int, direction: str, via: bool) -> str:
    """The PeerError a survivor raises (static/model.js writes the same words)."""
    waited = f"while this rank waited to {direction} rank {peer}"
    if detection == "stall":
        return f"PeerError: rank {device} did not answer before the timeout {waited}"
    if every <= 0:
        return f"PeerError: rank {device} failed (its connection closed) {waited}"
    if via:
        return (f"PeerError: rank {device} died (recorded in the group's segment), seen at this rank's next "
                f"liveness check once rank {peer} had stopped, {waited}")
    return f"PeerError: rank {device} died (its process is gone), seen at this rank's next liveness check {waited}"
