"""What the browser view shows, computed from real schedules and the simulator.

The page never re-implements an algorithm: it draws the simulator's timeline, the symbolic
executor's count of inputs each packet carries, and the outcome of a device failure worked
out from the same timeline (``failures``).
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from functools import lru_cache

import numpy as np

from .. import algorithms, dtypes
from ..model.cost import predict
from ..errors import ConfigError
from ..core.schedule import CODED, COPY, REDUCE, Schedule, carried_inputs, intervals
from ..model.simulate import SimResult, simulate
from ..model.topology import Link, Topology, preset
from ..model.topology.presets import pcie_switch
from ..tools.report import bus_bandwidth
from ..units import parse_bandwidth, parse_size, parse_time
from .failures import failure
from .layout import fills, layout
from .lesson import channels, closed_form, narration
from .options import MAX_COMPONENTS_PER_WORKER, TREE_SEGMENTS, view_options  # noqa: F401 (the page's limits)

MAX_TRANSFERS = 60_000        # keeps every request's work and response bounded
MAX_CELLS = 64                # buffer chunks drawn per device
BANDWIDTH_RANGE = (1e3, 1e13)  # bytes/s the view accepts: 1 KB/s to 10 TB/s
LATENCY_RANGE = (0.0, 1.0)     # seconds
BOOK_FIGURES = {"central": 0.060, "host": 0.080, "sharded": 0.015}   # D2L: 4 GPUs, PCIe 16 GB/s, 160 MB
TOPOLOGIES = ("ring", "pcie-switch-4", "p3.16xlarge", "dgx-2", "ethernet", "lowbw-cluster")   # what the page offers
FIXED = ("pcie-switch-4", "p3.16xlarge", "dgx-2", "lowbw-cluster")    # presets with their own worker count
COMPRESSIONS = ("fp16", "bf16", "powersgd:rank=1", "powersgd:rank=4", "topk:ratio=0.01", "sign")   # offered
REQUEST_BUDGET_S = 1.0        # the longest a request computes before it is answered "busy"


class Busy(Exception):
    """A request's work did not finish within REQUEST_BUDGET_S; it goes on in the background
    (one job at a time) and its result is cached, so asking again shortly gets it."""


class _Background:
    """One worker thread for the view's costly computations (CERAR designs, charts): a request
    waits for its job up to a budget; the job, once started, finishes and fills the caches.
    The same job asked for twice runs once."""

    def __init__(self):
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gradsync-view")
        self.jobs: dict = {}
        self.lock = threading.Lock()

    def run(self, key, fn, *args):
        with self.lock:
            job = self.jobs.get(key)
            fresh = job is None
            if fresh:
                job = self.jobs[key] = self.pool.submit(fn, *args)
        if fresh:   # outside the lock: a job already done runs its callback here, and that takes the lock
            job.add_done_callback(lambda _: self._forget(key))
        try:
            return job.result(timeout=REQUEST_BUDGET_S)
        except FutureTimeout:
            raise Busy(f"still computing ({key[0]}); it goes on in the background: ask again in a second") from None

    def _forget(self, key):
        with self.lock:
            self.jobs.pop(key, None)


SIMULATIONS, CHARTS = _Background(), _Background()    # separate: a long chart never delays a simulation


def _links(bandwidth, latency) -> tuple[float | None, float | None]:
    bw = parse_bandwidth(bandwidth) if bandwidth is not None else None
    lat = parse_time(latency) if latency is not None else None
    if bw is not None and not BANDWIDTH_RANGE[0] <= bw <= BANDWIDTH_RANGE[1]:
        raise ConfigError(f"bandwidth must be between 1KB/s and 10TB/s, got {bandwidth!r}")
    if lat is not None and not LATENCY_RANGE[0] <= lat <= LATENCY_RANGE[1]:
        raise ConfigError(f"latency must be between 0 and 1s, got {latency!r}")
    return bw, lat


def with_links(topo: Topology, bandwidth, latency) -> Topology:
    """``topo`` with every link at ``bandwidth`` and ``latency`` where given (the page's fields)."""
    if bandwidth is None and latency is None:
        return topo
    bw, lat = _links(bandwidth, latency)
    links = tuple(Link(l.a, l.b, bw or l.bandwidth, l.latency if lat is None else lat, l.duplex) for l in topo.links)
    return Topology(topo.name, topo.nodes, links, topo.workers, topo.host, topo.rings, topo.ring_weights,
                    topo.description)


def fixed_workers(name: str) -> int | None:
    """How many workers preset ``name`` has, if it fixes them: ``fixed_workers("dgx-2")`` is 16."""
    return len(preset(name).workers) if name in FIXED else None


@lru_cache(maxsize=128)
def topology_for(name: str, workers: int, bandwidth=None, latency=None) -> Topology:
    """The view's topology (cached: its routes are kept across requests)."""
    topo = preset(name, workers) if name not in FIXED else preset(name)
    if name in FIXED:
        topo = topo.with_workers(min(workers, len(topo.workers)))
    return with_links(topo, bandwidth, latency)


def chunk_cuts(schedule) -> list[int]:
    """The chunks the view draws in each buffer: the schedule's own pieces (its elementary
    intervals; for a coded schedule its c components), each cut in equal chunks until there
    are at least N, and coarsened to at most MAX_CELLS.

    >>> from gradsync import algorithms
    >>> chunk_cuts(algorithms.build("central", 4, 100))
    [0, 25, 50, 75, 100]
    """
    d, n = schedule.elements, schedule.workers
    if schedule.codec is not None:
        c = int(schedule.options.get("components") or n)
        cuts = np.unique(np.minimum(np.arange(c + 1) * -(-d // c), d))
    else:
        cuts = intervals(schedule)[0]
    if len(cuts) - 1 < n:      # too few to draw: each piece cut in k equal chunks, so a piece stays whole
        k = -(-n // (len(cuts) - 1))                         # chunks (a pipeline's segment: k chunks each)
        a, b = cuts[:-1, None], cuts[1:, None]
        cuts = np.unique(np.append((a + (b - a) * np.arange(k)[None, :] // k).ravel(), d))
    if len(cuts) - 1 > MAX_CELLS:
        cuts = np.unique(np.linspace(0, d, MAX_CELLS + 1).astype(np.int64))
    return cuts.tolist()


def _build(algorithm: str, topo: Topology, n: int, nbytes: int, components=None, eps=None):
    schedule = algorithms.build(algorithm, n, nbytes // 4, dtype="float32",
                                **view_options(algorithm, topo, n, nbytes, components, eps))
    if len(schedule.transfers) > MAX_TRANSFERS:
        raise ConfigError(f"this collective has {len(schedule.transfers)} transfers; the view draws at most "
                          f"{MAX_TRANSFERS}: lower the size, the workers or the segments")
    return schedule


def _compressed(algorithm: str, topo: Topology, n: int, nbytes: int, compression: str, components=None,
                eps=None) -> tuple[Schedule, int, str]:
    """The codec's collectives on a float32 gradient of ``nbytes``, one after another, as one
    schedule over a buffer that lays their payloads end to end (so each keeps its own chunks),
    with the bytes per element they share; and the codec's label."""
    from ..compression import make
    from ..tools.codec_predict import wire_schedules

    codec = make(compression)
    options = view_options(algorithm, topo, n, nbytes, components, eps)
    parts = wire_schedules(codec, algorithm, n, nbytes // 4, options)
    sizes = {dtypes.itemsize(dtype) for _, dtype in parts}
    if len(sizes) != 1:         # every codec so far has one; a mixed one would need per-transfer sizes
        raise ConfigError(f"compression {codec.label!r} mixes element sizes {sorted(sizes)}; the view draws one")
    pieces, rounds, offset = [], 0, 0
    for schedule, _ in parts:
        t = schedule.transfers.copy()
        t["round"] += rounds
        t["offset"] += offset
        pieces.append(t)
        rounds, offset = rounds + schedule.rounds, offset + schedule.elements
    # one collective stays as built (CERAR keeps its design, so the panel shows its error)
    combined = parts[0][0] if len(parts) == 1 else Schedule(f"{algorithm} x {len(parts)}", n, offset,
                                                            np.concatenate(pieces), helpers=parts[0][0].helpers)
    if len(combined.transfers) > MAX_TRANSFERS:
        raise ConfigError(f"this collective has {len(combined.transfers)} transfers; the view draws at most "
                          f"{MAX_TRANSFERS}: lower the size, the workers or the segments")
    return combined, sizes.pop(), codec.label


def design_estimate(schedule, dtype: str = "float32") -> dict | None:
    """A coded schedule's error, and whether gradsync would refuse the design (None for an
    uncoded one): ``design_estimate(algorithms.build("ring", 4, 8))`` is None."""
    if schedule.codec is None:
        return None
    from ..coding import cerar
    design = cerar.Design.from_dict(schedule.codec)
    error = design.checked_error(dtype)
    limit = cerar.DEFAULT_MAX_ERROR
    return {"error": error if math.isfinite(error) else None, "limit": limit, "refused": bool(not error <= limit),
            "rounds": design.rounds, "components": design.components}


def simulation(algorithm: str, topology: str, workers: int, size, bandwidth=None, latency=None,
               components=None, eps=None, fail=None, compression=None) -> dict:
    """Everything the page draws for one collective (see ``simulate_now``), computed within
    REQUEST_BUDGET_S or answered ``Busy`` while it finishes in the background (CERAR designs
    for large N and c take seconds); the last results are cached, so asking again gets it.

    >>> simulation("ring", "ring", 4, 1_000_000)["rounds"]
    6
    """
    args = (algorithm, topology, workers, parse_size(size), bandwidth, latency, components, eps,
            None if fail is None else tuple(fail), compression)
    return SIMULATIONS.run(("simulating",) + args, _cached_simulation, *args)


@lru_cache(maxsize=16)
def _cached_simulation(*args) -> dict:
    return simulate_now(*args)


def simulate_now(algorithm: str, topology: str, workers: int, size, bandwidth=None, latency=None,
                 components=None, eps=None, fail=None, compression=None) -> dict:
    """Everything the page draws for one collective, computed now: the topology and its
    drawing, every transfer's timeline, the chunks, the narration, the algorithm's
    explanation, CERAR's error and a failure's outcome. With ``compression`` (a codec's text,
    ``"powersgd:rank=4"``), the codec's collectives on the wire, one after another, in its
    bytes per element (the codec's own compute is not drawn).

    >>> d = simulate_now("ring", "ring", 4, 1_000_000)
    >>> d["narration"][0]["text"][:40]
    'reduce-scatter, step 1 of 3: every worke'
    """
    topo = topology_for(topology, workers, bandwidth, latency)
    n = len(topo.workers)
    nbytes = parse_size(size)
    spec = algorithms.get(algorithm)
    schedule, itemsize, label = schedule_for(algorithm, topo, n, nbytes, compression, components, eps)
    result = simulate(schedule, topo, itemsize)
    t = schedule.transfers
    names = [nd.name for nd in topo.nodes]
    placed = [names[i] for i in result.placement]
    route, routes = _routes(topo, t, placed)
    drawing = _drawing(topology, topo, result)
    cuts = chunk_cuts(schedule)
    estimate = design_estimate(schedule, "float16" if itemsize == 2 else "float32")     # fp16 packets over CERAR
    options = view_options(algorithm, topo, n, nbytes, components, eps)
    out = {
        "algorithm": algorithm, "summary": spec.summary, "explanation": " ".join(spec.explanation.split()),
        "topology": drawing,
        "workers": n, "bytes": nbytes, "elements": schedule.elements, "time_s": result.time, "rounds": schedule.rounds,
        "options": {k: v for k, v in schedule.options.items()
                    if k in ("segments", "components", "eps", "local_size", "inter")},
        "busbw_GBps": bus_bandwidth(nbytes, result.time, n) / 1e9,
        "error": estimate["error"] if estimate else None, "estimate": estimate,
        "placement": result.placement.tolist(), "cells": cuts,
        # the sentences; each round's list of transfers the page writes from the transfers themselves
        "narration": narration(spec, schedule, cuts, placed, detail=False),
        "transfers": {"src": t["src"].tolist(), "dst": t["dst"].tolist(), "round": t["round"].tolist(),
                      "op": t["op"].tolist(), "offset": t["offset"].tolist(), "count": t["count"].tolist(),
                      "carried": carried_inputs(schedule).tolist(), "start": result.start.tolist(),
                      "done": result.done.tolist(), "route": route.tolist(), "channel": channels(schedule)},
        "routes": routes,
        "closed_form": closed_form(spec, topo, n, nbytes, itemsize, options) if compression in (None, "fp16", "bf16") else None,
        "failure": None,
        "compression": None if label is None else {
            "codec": label, "itemsize": itemsize, "collectives": schedule.algorithm,
            "wire_bytes": float(schedule.elements_sent().max() * itemsize)},
    }
    if fail is not None:
        device, fraction = fail
        if not 0 <= device < n:
            raise ConfigError(f"fail.device must be a worker in 0..{n - 1}, got {device}")
        out["failure"] = failure(result, device, fraction * result.time)
        out["failure"]["recovery"] = _recovery(algorithm, topology, n, nbytes, bandwidth, latency, components, eps,
                                               compression)
    return out


def schedule_for(algorithm: str, topo: Topology, n: int, nbytes: int, compression, components,
                  eps) -> tuple[Schedule, int, str | None]:
    """The schedule the view draws, its bytes per element, and the codec's label (None without
    ``compression``): ``schedule_for("ring", topo, 4, 4000, "fp16", None, None)[1:]`` is (2, 'fp16')."""
    if compression is None:
        return _build(algorithm, topo, n, nbytes, components, eps), 4, None
    return _compressed(algorithm, topo, n, nbytes, compression, components, eps)


def _routes(topo: Topology, t: np.ndarray, placed: list[str]) -> tuple[np.ndarray, list]:
    """Each transfer's index into the routes, and each distinct route's nodes."""
    # each distinct route once: a ring of 64 has 8064 transfers but 64 routes
    pairs, route = np.unique(t["src"].astype(np.int64) * len(placed) + t["dst"], return_inverse=True)
    routes = [topo.route_nodes(placed[p // len(placed)], placed[p % len(placed)]) for p in pairs.tolist()]
    return route, routes


def _drawing(preset_name: str, topo: Topology, result: SimResult) -> dict:
    """The topology as the page draws it: nodes where the layout puts them, and every link with
    the bytes it carried and how long it was busy (its busier direction)."""
    pos, bends = layout(preset_name, topo)
    busy = [float(max(result.channel_bytes[2 * k], result.channel_bytes[2 * k + 1]) / l.bandwidth)
            for k, l in enumerate(topo.links)]
    return {
        "name": topo.name, "preset": preset_name, "description": topo.description,
        "fixed_workers": fixed_workers(preset_name), "fill": fills(preset_name),
        "nodes": [{"name": nd.name, "kind": nd.kind, "x": x, "y": y} for nd, (x, y) in zip(topo.nodes, pos)],
        "links": [{"a": topo.index[l.a], "b": topo.index[l.b], "bandwidth": l.bandwidth, "latency": l.latency,
                   "bytes": float(result.channel_bytes[2 * k] + result.channel_bytes[2 * k + 1]),
                   "busy_s": busy[k], "bend": bends[k]}
                  for k, l in enumerate(topo.links)]}


def _recovery(algorithm, topology, n, nbytes, bandwidth, latency, components, eps, compression=None) -> dict:
    """The elastic restart: the N - 1 survivors form a new group and run the collective again."""
    if n - 1 < 2:
        return {"workers": n - 1, "time_s": None, "note": "one survivor has nothing to synchronize with"}
    topo = topology_for(topology, n - 1, bandwidth, latency)
    try:
        schedule, itemsize, _ = schedule_for(algorithm, topo, n - 1, nbytes, compression, components, eps)
    except ConfigError as e:
        return {"workers": n - 1, "time_s": None, "note": str(e)}
    return {"workers": n - 1, "time_s": simulate(schedule, topo, itemsize).time, "note": ""}


def comparison(size: int, topology: str = "pcie-switch-4", bandwidth=None, latency=None, components=None,
               eps=None, algorithms_: tuple | None = None, compression=None) -> dict:
    """Time against workers per algorithm on the view's topology: simulated and closed form.
    ``pcie-switch-4`` grows to N GPUs on one switch (D2L's server, with its figures marked);
    other fixed presets count 2 up to their own workers; ``ring`` and ``ethernet`` go to 64.
    ``algorithms_`` defaults to every registered algorithm that takes float32 (CERAR with
    the given ``components`` and ``eps``).

    >>> sorted(comparison(4000, algorithms_=("ring", "tree"))["curves"])
    ['ring', 'tree']
    """
    if algorithms_ is None:
        algorithms_ = tuple(a for a in algorithms.names() if algorithms.get(a).accepts("float32"))
    _links(bandwidth, latency)       # bad values are refused before any work
    args = (size, topology, bandwidth, latency, components, eps, tuple(algorithms_), compression)
    return CHARTS.run(("comparing",) + args, compare_now, *args)


def _compare_workers(topology: str) -> tuple[int, ...]:
    most = fixed_workers(topology)
    if most is None or topology == "pcie-switch-4":
        return (2, 3, 4, 8, 16, 32, 64)
    return tuple(n for n in (2, 3, 4, 6, 8, 12) if n < most) + (most,)


@lru_cache(maxsize=32)
def compare_now(size: int, topology: str, bandwidth, latency, components, eps, algorithms_: tuple,
                compression=None) -> dict:
    """``comparison``, computed now (no budget): for the background worker and the export.
    With ``compression``, every curve is the codec's collectives (the closed form only for
    fp16 and bf16: the algorithm's own at 2 bytes per element)."""
    workers = _compare_workers(topology)
    curves = {}
    for name in algorithms_:
        sim, closed = [], []
        for n in workers:
            topo = pcie_switch(n) if topology == "pcie-switch-4" else topology_for(topology, n)
            topo = with_links(topo, bandwidth, latency)
            try:
                schedule, itemsize, _ = schedule_for(name, topo, n, size, compression, components, eps)
                sim.append(simulate(schedule, topo, itemsize).time)
            except ConfigError:
                sim.append(None)
            half = compression in ("fp16", "bf16")
            try:
                options = {k: v for k, v in view_options(name, topo, n, size, components, eps).items() if k != "max_error"}
                closed.append(None if compression and not half else
                              predict(name, topo, n, size // 2 if half else size, itemsize=2 if half else 4, **options))
            except ConfigError:
                closed.append(None)
        curves[name] = {"simulated_s": sim, "closed_form_s": closed, "exact": algorithms.get(name).exact}
    seed = topology == "pcie-switch-4" and size == 160_000_000 and bandwidth is None and latency is None
    marks = [{"algorithm": a, "workers": 4, "time_s": v} for a, v in BOOK_FIGURES.items()] if seed else []
    where = ("pcie-switch-N: N GPUs and the CPU on links to one switch" if topology == "pcie-switch-4"
             else f"{topology}, 2 to {workers[-1]} workers")
    return {"workers": list(workers), "bytes": size, "curves": curves, "book_marks": marks if not compression else [],
            "topology": where, "compression": compression}


def warm_up() -> None:
    """Compute what a first visit asks for, so it finds routes, designs and charts cached: the
    default view, the default chart, and every algorithm at the common worker counts."""
    simulation("ring", "ring", 8, 160_000_000)
    names = [a for a in algorithms.names() if algorithms.get(a).accepts("float32")]
    for name in names:
        compare_now(160_000_000, "pcie-switch-4", None, None, None, None, (name,), None)
    for workers in (16, 32, 64):
        for name in names:
            try:
                simulate_now(name, "ring", workers, 160_000_000)
            except ConfigError:
                pass
