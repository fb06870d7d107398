"""What the browser view shows, computed from real schedules and the simulator.

The page never re-implements an algorithm: it draws the simulator's timeline, the symbolic
executor's count of inputs each packet carries, and the outcome of a device failure worked
out here from the same timeline.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from .. import algorithms
from ..cost import default_options, predict
from ..errors import ConfigError
from ..schedule import carried_inputs, intervals
from ..simulate import SimResult, simulate
from ..topology import Link, Topology, preset
from ..topology.presets import pcie_switch
from ..units import parse_bandwidth, parse_time, parse_size

MAX_TRANSFERS = 60_000        # keeps every request's work and response bounded
MAX_CELLS = 64                # buffer cells drawn per device
TREE_SEGMENTS = 32            # the view's tree pipelines at most this many segments
SEED_FIGURES = {"central": 0.060, "host": 0.080, "sharded": 0.015}   # 4 GPUs, PCIe 16 GB/s, 160 MB


def _layout(topo: Topology) -> list[tuple[float, float]]:
    """Workers on a circle, everything else on an inner circle (or the centre)."""
    workers = [topo.index[w] for w in topo.workers]
    others = [i for i in range(len(topo.nodes)) if i not in set(workers)]
    pos = [(0.5, 0.5)] * len(topo.nodes)
    for k, i in enumerate(workers):
        a = 2 * math.pi * k / len(workers) - math.pi / 2
        pos[i] = (0.5 + 0.42 * math.cos(a), 0.5 + 0.42 * math.sin(a))
    for k, i in enumerate(others):
        a = 2 * math.pi * k / max(len(others), 1) - math.pi / 2
        r = 0.0 if len(others) == 1 else 0.18
        pos[i] = (0.5 + r * math.cos(a), 0.5 + r * math.sin(a))
    return pos


def _with_links(topo: Topology, bandwidth, latency) -> Topology:
    if bandwidth is None and latency is None:
        return topo
    bw = parse_bandwidth(bandwidth) if bandwidth is not None else None
    lat = parse_time(latency) if latency is not None else None
    links = tuple(Link(l.a, l.b, bw or l.bandwidth, l.latency if lat is None else lat, l.duplex) for l in topo.links)
    return Topology(topo.name, topo.nodes, links, topo.workers, topo.host, topo.rings, topo.ring_weights,
                    topo.description)


@lru_cache(maxsize=128)
def topology_for(name: str, workers: int, bandwidth=None, latency=None) -> Topology:
    """The view's topology (cached: its routes are kept across requests)."""
    topo = preset(name, workers) if name in ("ring", "ethernet") else preset(name)
    if name not in ("ring", "ethernet"):
        topo = topo.with_workers(min(workers, len(topo.workers)))
    return _with_links(topo, bandwidth, latency)


def _cells(schedule) -> list[int]:
    """Buffer cells to draw: the schedule's elementary intervals, or MAX_CELLS equal ones."""
    cuts = intervals(schedule)[0]
    if len(cuts) - 1 > MAX_CELLS:
        cuts = np.unique(np.linspace(0, schedule.elements, MAX_CELLS + 1).astype(np.int64))
    return cuts.tolist()


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


def simulation(algorithm: str, topology: str, workers: int, size, bandwidth=None, latency=None,
               components=None, eps=None, fail=None) -> dict:
    """Everything the page draws for one collective."""
    topo = topology_for(topology, workers, bandwidth, latency)
    n = len(topo.workers)
    nbytes = parse_size(size)
    takes = algorithms.get(algorithm).options
    options = default_options(algorithm, topo, n)
    # the page's fields apply to the algorithms that take them, and are ignored by the others
    options.update({k: v for k, v in (("components", components), ("eps", eps)) if v is not None and k in takes})
    if "segments" in takes:
        options["segments"] = max(1, min(TREE_SEGMENTS, -(-(nbytes // 4) // (1 << 18))))
    schedule = algorithms.build(algorithm, n, nbytes // 4, dtype="float32", **options)
    if len(schedule.transfers) > MAX_TRANSFERS:
        raise ConfigError(f"this collective has {len(schedule.transfers)} transfers; the view draws at most "
                          f"{MAX_TRANSFERS}: lower the size, the workers or the segments")
    result = simulate(schedule, topo)
    t = schedule.transfers
    names = [nd.name for nd in topo.nodes]
    placed = [names[i] for i in result.placement]
    paths = [topo.route_nodes(placed[s], placed[d]) for s, d in zip(t["src"].tolist(), t["dst"].tolist())]
    pos = _layout(topo)
    error = None
    if schedule.codec is not None:
        from ..coding import cerar
        error = cerar.Design.from_dict(schedule.codec).predicted_error("float32")
    out = {
        "algorithm": algorithm, "topology": {
            "name": topo.name, "description": topo.description,
            "nodes": [{"name": nd.name, "kind": nd.kind, "x": x, "y": y} for nd, (x, y) in zip(topo.nodes, pos)],
            "links": [{"a": topo.index[l.a], "b": topo.index[l.b], "bandwidth": l.bandwidth, "latency": l.latency,
                       "bytes": float(result.channel_bytes[2 * k] + result.channel_bytes[2 * k + 1])}
                      for k, l in enumerate(topo.links)]},
        "workers": n, "bytes": nbytes, "elements": schedule.elements, "time_s": result.time, "rounds": schedule.rounds,
        "options": {k: v for k, v in schedule.options.items() if k in ("segments", "components", "eps")},
        "busbw_GBps": (nbytes / result.time) * 2 * (n - 1) / n / 1e9 if result.time > 0 else 0.0,
        "error": error, "placement": result.placement.tolist(), "cells": _cells(schedule),
        "transfers": {"src": t["src"].tolist(), "dst": t["dst"].tolist(), "round": t["round"].tolist(),
                      "op": t["op"].tolist(), "offset": t["offset"].tolist(), "count": t["count"].tolist(),
                      "carried": carried_inputs(schedule).tolist(), "start": result.start.tolist(),
                      "done": result.done.tolist(), "path": paths},
        "failure": None,
    }
    if fail is not None:
        device, fraction = fail
        if not 0 <= device < n:
            raise ConfigError(f"fail.device must be a worker in 0..{n - 1}, got {device}")
        out["failure"] = failure(result, device, fraction * result.time)
    return out


def comparison(size: int, algorithms_: tuple | None = None,
               workers: tuple = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)) -> dict:
    """Time against workers on a PCIe switch of N GPUs (the seed's server, grown): simulated and
    closed form, with the seed's 4-GPU figures. ``algorithms_`` defaults to every exact
    algorithm registered now that takes float32.

    >>> sorted(comparison(4000, ("ring", "tree"), (2, 4))["curves"])
    ['ring', 'tree']
    """
    if algorithms_ is None:
        algorithms_ = tuple(a for a in algorithms.names(exact=True) if algorithms.get(a).accepts("float32"))
    return _comparison(size, tuple(algorithms_), tuple(workers))


@lru_cache(maxsize=32)
def _comparison(size: int, algorithms_: tuple, workers: tuple) -> dict:
    curves = {}
    for name in algorithms_:
        sim, closed = [], []
        for n in workers:
            topo = pcie_switch(n)
            options = default_options(name, topo, n)
            schedule = algorithms.build(name, n, size // 4, **options)
            sim.append(simulate(schedule, topo).time if len(schedule.transfers) <= MAX_TRANSFERS else None)
            closed.append(predict(name, topo, n, size, **options))
        curves[name] = {"simulated_s": sim, "closed_form_s": closed}
    marks = [{"algorithm": a, "workers": 4, "time_s": v} for a, v in SEED_FIGURES.items()] if size == 160_000_000 else []
    return {"workers": list(workers), "bytes": size, "curves": curves, "seed_marks": marks,
            "topology": "pcie-switch-N: N GPUs and the CPU on 16 GB/s links to one switch"}


def warm_up() -> None:
    """Simulate the default view at common sizes, so first requests find routes cached."""
    for workers in (8, 16, 32, 64):
        simulation("ring", "ring", workers, 160_000_000)
