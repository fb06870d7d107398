"""Measure the local workers and write a topology the simulator, ``tune`` and "auto" can use.

Two models are measured in the same launches:

- **node costs** (written to the topology): point-to-point messages over the transport the
  runtime uses (Gloo), timed as ``gradsync bench`` times (blocks of back-to-back calls, the
  cases taking turns): k = 1..N-1 workers sending n bytes each to worker 0 at once (fan-in),
  two workers exchanging n bytes (both directions at once), and with 4+ workers two
  disjoint pairs sending at once, at sizes 4 KB-32 MB. Each case is fitted to
  T = a + k n / R (``_line``: through the smallest size, with the slope of the two
  largest). Then: the per-message overhead o is the slope of a over k (a receiver pays o per
  message) and the latency the rest of a; the node's copy rate C and its incast factor f
  come from 1 / R(k) = (1 + f (k - 1)) / C, a straight line in k; the exchange says whether
  a node's sending and receiving share its copy rate (half duplex: each direction gets about
  R(1) / 2; the exchange then joins the line as a point at k = 1 with rate 2 x its
  per-direction rate) or not (full duplex); the disjoint pairs are reported (do two
  transfers at once move twice what one does?). The adds are timed apart, every rank at
  once and rank 0 alone (``cores``: how many ranks compute at full speed at once), as is
  CERAR's codec, and so is the runtime's agreement on each call: a 4 KB ring all-reduce
  with and without it (``collective_overhead``).
- **ring fit** (kept for comparison, the earlier calibration): ring all-reduce times T(n) at
  4 KB-64 MB fitted to T = A + B n, giving a per-round latency alpha = A / 2(N-1) and,
  less the adds, a bandwidth.

On emulated slow links (``network``) messages are timed up to half a second of the link's
rate, so that 100 Mbit/s takes minutes, not an hour.

The topology gets the node costs as the runtime pays them (``runtime_node``): the raw
transport sets the latency, the per-message overhead, each process's copy rate, duplex and
incast factor; the ring's per-round and per-byte costs set the runtime's own cost per round
and the copy rate of the machine, which every transfer crosses. The output says what was
measured, each fit's worst relative residual, and how far the written topology's simulated
ring is from the measured ring times (not independent: the ring set two of the terms).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..errors import ConfigError
from ..runtime.api import all_reduce
from .bench import time_in_blocks

LARGE_BYTES = 32 << 20
FIT_BYTES = (4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
CODEC_ELEMENTS = 1 << 22      # 16 MB of float32


def _median_time(fn, repeats, barrier=True):
    times = []
    for _ in range(repeats + 1):
        if barrier:
            dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def codec_madd_rate(rank: int, workers: int, repeats: int, elements: int = CODEC_ELEMENTS) -> float:
    """Multiply-adds per second of CERAR's codec as the runtime runs it: each round's packet
    encoded piece by piece (matrix-vector products over the pieces), then the decode, on every
    rank at once. A bare GEMM ran about 3x faster than this mix, and the simulator's CERAR
    rows came out 45-70% short of the measured times.

    >>> codec_madd_rate(0, 2, 3, elements=1 << 12) > 0
    True
    """
    from ..coding import cerar
    from ..runtime.api import compiled

    c = compiled("cerar", max(workers, 2), elements, "float32", "{}", rank % max(workers, 2))
    schedule, design = c.schedule, c.design
    flat = torch.randn(elements)

    def codec():             # what the collective does between its transfers: the plan's pieces
        w = cerar.Worker(design, rank, flat)
        for send in c.plan.sends:
            w.packet(send.round, send.offset, send.offset + send.count)
        for t in range(1, design.rounds + 1):
            w.received(t)
        w.result()
    madds = schedule.compute["madds"][schedule.compute["node"] == rank].sum()    # the simulator's count
    return float(madds) / _median_time(codec, repeats, barrier=False)


P2P_BYTES = (4 << 10, 256 << 10, 4 << 20, 32 << 20)
HALF_DUPLEX_BELOW = 0.75      # exchange rate per direction, as a fraction of one-way, below which sends and receives share
LINK_SECONDS = 0.5            # on emulated links, time messages up to this long on the wire
AGREEMENT_ELEMENTS = 1024     # a ring all-reduce this small is all fixed costs


def sizes_for(sizes, max_bytes: float | None) -> tuple[int, ...]:
    """The message sizes to measure on links of a limited rate: those of ``sizes`` up to
    ``max_bytes``, and never fewer than the smallest three (a line needs three points).

    >>> sizes_for((1, 10, 100, 1000), 150), sizes_for((1, 10, 100, 1000), 5), sizes_for((1, 10), None)
    ((1, 10, 100), (1, 10, 100), (1, 10))
    """
    if max_bytes is None:
        return tuple(sizes)
    return tuple(n for i, n in enumerate(sizes) if n <= max_bytes or i < 3)


def link_max_bytes(rate_Bps: float) -> float:
    """The largest message worth timing on a link of ``rate_Bps``: half a second's worth, so
    that a calibration on 100 Mbit/s links takes minutes, not an hour (``link_max_bytes(12.5e6)``
    is 6.25 MB)."""
    return rate_Bps * LINK_SECONDS


def p2p_times(rank: int, workers: int, repeats: int, sizes=P2P_BYTES) -> dict:
    """This rank's median seconds per call of: k workers (1..k) sending n bytes each to
    worker 0 at once, for k = 1..N-1 (``("fan", k, n)``), and workers 0 and 1 exchanging n
    bytes (``("swap", n)``), and with 4 or more workers, 0 -> 1 and 2 -> 3 at once (``("pairs",
    n)``: do disjoint transfers share a limit?), n in ``sizes``. Ranks outside a case return
    at once."""
    send = {n: torch.ones(n // 4) for n in sizes}
    recv = {n: [torch.empty(n // 4) for _ in range(workers)] for n in sizes}
    calls = {}
    for n in sizes:
        for k in range(1, workers):
            def fan(n=n, k=k):
                if rank == 0:
                    for req in [dist.irecv(recv[n][src], src) for src in range(1, k + 1)]:
                        req.wait()
                elif rank <= k:
                    dist.send(send[n], 0)
            calls[("fan", k, n)] = fan

        def swap(n=n):
            if rank < 2:
                peer = 1 - rank
                got = dist.irecv(recv[n][peer], peer)
                dist.isend(send[n], peer).wait()
                got.wait()
        calls[("swap", n)] = swap

        def pairs(n=n):
            if rank in (0, 2):
                dist.send(send[n], rank + 1)
            elif rank in (1, 3):
                dist.recv(recv[n][rank - 1], rank - 1)
        if workers >= 4:
            calls[("pairs", n)] = pairs
    samples = time_in_blocks(calls, repeats, dist.barrier)
    return {key: statistics.median(v) for key, v in samples.items()}


def _local_rates(rank: int, workers: int, repeats: int) -> tuple[float, float]:
    """This rank's adds per second and CERAR codec multiply-adds per second, every rank at once."""
    a, b = torch.randn(LARGE_BYTES // 4), torch.randn(LARGE_BYTES // 4)
    add_rate = a.numel() / _median_time(lambda: a.add_(b), repeats, barrier=False)
    return add_rate, codec_madd_rate(rank, workers, repeats)


def add_seconds_alone(rank: int, repeats: int) -> float:
    """Seconds per element of rank 0's adds while the other ranks wait (0.0 on them): with more
    processes than cores, a rank adding alone (central's root) runs several times faster than
    every rank adding at once (a ring round)."""
    a, b = torch.randn(LARGE_BYTES // 4), torch.randn(LARGE_BYTES // 4)
    dist.barrier()
    seconds = _median_time(lambda: a.add_(b), repeats, barrier=False) / a.numel() if rank == 0 else 0.0
    dist.barrier()
    return seconds


def _ring_times(repeats: int, size: int, group=None, sizes=FIT_BYTES) -> list[float]:
    """Median seconds of the ring all-reduce at each of ``sizes`` over ``group`` (``size`` ranks)."""
    bufs = [torch.randn(nbytes // 4) for nbytes in sizes]
    calls = {k: (lambda buf=buf: all_reduce(buf, group=group, check=False)) for k, buf in enumerate(bufs)}
    samples = time_in_blocks(calls, repeats, lambda: dist.barrier(group=group),
                             before=lambda k: bufs[k].div_(size))           # stays finite
    return [statistics.median(samples[k]) for k in range(len(bufs))]


def agreement_times(repeats: int) -> tuple[float, float]:
    """Median seconds of a small ring all-reduce (AGREEMENT_ELEMENTS floats) with the ranks'
    agreement on the call (``check``, the default) and without: their difference is what the
    agreement adds to every collective, which no schedule describes."""
    x = torch.ones(AGREEMENT_ELEMENTS)
    calls = {"checked": lambda: all_reduce(x, check=True), "unchecked": lambda: all_reduce(x, check=False)}
    samples = time_in_blocks(calls, 2 * repeats, dist.barrier, before=lambda name: x.fill_(1.0))
    return statistics.median(samples["checked"]), statistics.median(samples["unchecked"])


def worker(rank: int, workers: int, repeats: int, max_bytes: float | None = None) -> dict | None:
    """One rank's measurements, messages up to ``max_bytes`` (``sizes_for``); rank 0 returns
    them for every rank (times: the slowest rank's; rates: the lowest)."""
    torch.set_num_threads(1)
    ring_sizes, p2p_sizes = sizes_for(FIT_BYTES, max_bytes), sizes_for(P2P_BYTES, max_bytes)
    add_rate, madd_rate = _local_rates(rank, workers, repeats)
    times = _ring_times(repeats, workers, sizes=ring_sizes)
    p2p = p2p_times(rank, workers, repeats, p2p_sizes)
    agreement = agreement_times(repeats)
    alone = add_seconds_alone(rank, repeats)
    keys = sorted(p2p, key=str)
    stats = torch.tensor(times + [p2p[k] for k in keys] + [alone] + list(agreement) + [-add_rate, -madd_rate],
                         dtype=torch.float64)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    if rank:
        return None
    p2p = dict(zip(keys, stats[len(times):-5].tolist()))
    return {"sizes": list(ring_sizes), "times": stats[:len(times)].tolist(), "add_rate": -stats[-2].item(),
            "madd_rate": -stats[-1].item(), "agreement_s": stats[-4:-2].tolist(),
            "add_rate_alone": 1 / stats[-5].item(),
            "fan_in_s": {f"{k}x{n}": p2p[("fan", k, n)] for k in range(1, workers) for n in p2p_sizes},
            "exchange_s": {str(n): p2p[("swap", n)] for n in p2p_sizes},
            "pairs_s": {str(n): p2p[("pairs", n)] for n in p2p_sizes if ("pairs", n) in p2p}}


def calibrate(workers: int, repeats: int = 10, launches: int = 3, network=None) -> dict:
    """Measure ``workers`` local workers in ``launches`` separate process groups and fit the
    medians: on a shared machine a process group settles into a fast or a slow state for its
    whole life (here 0.5 ms or 2 ms per 1 MB ring all-reduce), so one launch can mislead.
    ``network``: a ``links.SlowLinks`` (entered) the workers run behind; messages are then
    timed up to ``link_max_bytes`` of its rate.

    Example: ``calibrate(4)["round_latency_s"]``.
    """
    from .launch import run

    cap = None if network is None else link_max_bytes(network.rate)
    result = fit_launches(workers, [run(worker, workers, repeats, cap, network=network)[0] for _ in range(launches)])
    if network is not None:
        result["link_Bps"] = network.rate
    return result


def fit_launches(workers: int, runs: list[dict]) -> dict:
    """Fit the medians of several launches' ``worker`` measurements (ring, node costs, check)."""
    sizes = runs[0].get("sizes", list(FIT_BYTES))
    times = [statistics.median(r["times"][k] for r in runs) for k in range(len(sizes))]
    result = fit(workers, list(sizes), times, statistics.median(r["add_rate"] for r in runs),
                 statistics.median(r["madd_rate"] for r in runs))
    fan = {key: statistics.median(r["fan_in_s"][key] for r in runs) for key in runs[0]["fan_in_s"]}
    swap = {key: statistics.median(r["exchange_s"][key] for r in runs) for key in runs[0]["exchange_s"]}
    pairs = {key: statistics.median(r["pairs_s"][key] for r in runs) for key in runs[0].get("pairs_s", {})}
    result["node"] = runtime_node(result, fit_node(workers, fan, swap, pairs))
    if all("add_rate_alone" in r for r in runs):      # how many ranks add at full speed at once
        result["add_rate_alone"] = alone = statistics.median(r["add_rate_alone"] for r in runs)
        result["cores"] = min(max(workers * result["add_rate"] / alone, 1.0), float(workers))
    if all("agreement_s" in r for r in runs):          # checked - unchecked, the launches' medians
        checked, unchecked = (statistics.median(r["agreement_s"][i] for r in runs) for i in (0, 1))
        result["node"]["collective_overhead_s"] = max(checked - unchecked, 0.0)
    result["ring_check"] = ring_check(result)
    result["launches"] = runs
    return result


def _line(x, y):
    """The line y = p + q x with the slope between the two largest x's points and through the
    smallest x's: the per-byte cost where bytes dominate, the fixed cost where it does, as
    alpha-beta measurements take them. A least-squares line (tried first, on relative error)
    bends to the small sizes instead, and on emulated links those pass in the token bucket's
    burst at memory speed: a 1 Gbit/s link's one-way rate came out at 0.94 GB/s. Returns
    (p, q, worst relative residual over all points).

    >>> [round(v, 6) for v in _line([1, 10, 100, 1000], [5.0, 2.0, 11.0, 101.0])[:2]]
    [4.9, 0.1]
    """
    import numpy as np

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    order = np.argsort(x)
    x, y = x[order], y[order]
    q = (y[-1] - y[-2]) / (x[-1] - x[-2])
    if q <= 0:                           # the largest two too close to tell: the whole span
        q = (y[-1] - y[0]) / (x[-1] - x[0])
    p = y[0] - q * x[0]
    return float(p), float(q), float(np.abs((p + q * x) / y - 1).max())


def _rate(times: dict) -> float:
    """Bytes per second of the line fitted to ``times`` (``"n"`` -> seconds)."""
    sizes = sorted(int(n) for n in times)
    slope = _line(sizes, [times[str(n)] for n in sizes])[1]
    return 1 / slope if slope > 0 else float("inf")


def fit_node(workers: int, fan: dict, swap: dict, pairs: dict | None = None) -> dict:
    """Node costs from fan-in times (``"kxn"`` -> seconds) and exchange times (``"n"`` -> seconds).

    >>> o, lat, c, f = 20e-6, 50e-6, 1e9, 0.2      # fan-in of k: lat + k o + k n (1 + f (k - 1)) / c
    >>> fan = {f"{k}x{n}": lat + k * o + k * n * (1 + f * (k - 1)) / c for k in (1, 2, 3) for n in (10**3, 10**6, 10**7)}
    >>> out = fit_node(4, fan, {str(n): lat + o + 2 * n / c for n in (10**3, 10**6, 10**7)})
    >>> round(out["message_overhead_s"] * 1e6), round(out["copy_rate_Bps"] / 1e9, 3), round(out["fan_in"], 3), out["duplex"]
    (20, 1.0, 0.2, 'half')
    """
    import numpy as np

    sizes = sorted(int(n) for n in swap)
    a2, b2, worst2 = _line(sizes, [swap[str(n)] for n in sizes])
    exchange_rate = 1 / b2 if b2 > 0 else float("inf")
    ks = range(1, workers)
    per_k = {}
    for k in ks:
        sizes = sorted(int(key.split("x")[1]) for key in fan if int(key.split("x")[0]) == k)
        a, b, worst = _line([k * n for n in sizes], [fan[f"{k}x{n}"] for n in sizes])
        per_k[k] = {"fixed_s": a, "rate_Bps": 1 / b if b > 0 else float("inf"), "worst_residual": worst}
    if workers > 2:            # fixed cost over k: latency + k messages' overhead at the receiver
        slope, intercept = np.polyfit(list(ks), [per_k[k]["fixed_s"] for k in ks], 1)
        overhead, latency = max(float(slope), 0.0), max(float(intercept), 0.0)
        x, y = [k - 1 for k in ks], [1 / per_k[k]["rate_Bps"] for k in ks]
        if exchange_rate < HALF_DUPLEX_BELOW * per_k[1]["rate_Bps"]:
            x, y = x + [0], y + [1 / (2 * exchange_rate)]     # an exchange: one node's C carries 2 flows
        inv = np.polyfit(x, y, 1)
        copy_rate, fan_in = 1 / inv[1], max(float(inv[0] / inv[1]), 0.0)     # 1/R = 1/C + (f/C)(k - 1)
    else:                      # one sender only: overhead and latency not separable, no incast
        overhead, latency = 0.0, max(per_k[1]["fixed_s"], 0.0)
        copy_rate, fan_in = per_k[1]["rate_Bps"], 0.0
    copy_rate = float(copy_rate)
    predicted = {k: copy_rate / (1 + fan_in * (k - 1)) for k in ks}
    one_way = per_k[1]["rate_Bps"]
    duplex = "half" if exchange_rate < HALF_DUPLEX_BELOW * one_way else "full"
    return {"message_overhead_s": overhead, "latency_s": latency, "copy_rate_Bps": copy_rate, "fan_in": fan_in,
            "duplex": duplex, "one_way_Bps": one_way, "exchange_Bps_per_direction": exchange_rate,
            "fan_in_fits": {str(k): v for k, v in per_k.items()},
            "fan_in_rate_worst_error": max(abs(predicted[k] / per_k[k]["rate_Bps"] - 1) for k in ks),
            "exchange_worst_residual": worst2,
            "pairs_Bps_per_pair": _rate(pairs) if pairs else None,
            "measured": {"fan_in_s": fan, "exchange_s": swap, "pairs_s": pairs or {}}}


def runtime_node(ring: dict, raw: dict) -> dict:
    """The node costs as the runtime pays them. Raw point-to-point (``fit_node``) gives the
    latency, the per-message overhead, the duplex, the incast factor and each process's copy
    rate C (a transfer needs a sending and a receiving process). But gradsync's ring costs
    more per round and per byte than bare Gloo (plans, scratch, adds, and on one machine every
    process busy at once), which the ring measures. So: the runtime's own cost per round is
    alpha - latency - 2 o, alpha the ring's per-round cost (a round is one send and one receive
    per node; charging all of alpha - latency per message instead put a 4 KB fan-in of 3 at
    2.3-3.7x its measured time on 100 Mbit/s links); and the machine, which every transfer between
    the processes crosses, moves N x the ring's bandwidth in all (a ring round moves n bytes
    in all), which is where one machine's memory and cores limit the ring. Both limits are
    written: a fan-in into one process runs at the processes' rate, the ring at the
    machine's; a process's rate is at least what it moved in the ring (2 x the ring's
    bandwidth where half duplex: two point-to-point patterns on 2 processes and 2 cores moved
    less than the runtime's ring did). ``pairs_over_one_way`` says what two disjoint pairs at once moved over one
    pair (2: each process its own limit; 1: one shared), for the output. The raw figures are
    kept, prefixed ``transport_``.

    >>> raw = {"latency_s": 100e-6, "message_overhead_s": 5e-6, "copy_rate_Bps": 2e9, "duplex": "half",
    ...        "one_way_Bps": 2e9, "pairs_Bps_per_pair": 1.1e9}       # two pairs at once: 2.2 GB/s in all
    >>> out = runtime_node({"workers": 3, "round_latency_s": 300e-6, "bandwidth_Bps": 0.5e9}, raw)
    >>> round(out["round_overhead_s"] * 1e6), out["copy_rate_Bps"] / 1e9, out["machine_copy_rate_Bps"] / 1e9
    (190, 2.0, 1.5)
    >>> round(out["pairs_over_one_way"], 2)
    1.1
    """
    out = dict(raw)
    out["transport_message_overhead_s"], out["transport_copy_rate_Bps"] = raw["message_overhead_s"], raw["copy_rate_Bps"]
    out["round_overhead_s"] = max(ring["round_latency_s"] - raw["latency_s"] - 2 * raw["message_overhead_s"], 0.0)
    bandwidth = ring["bandwidth_Bps"] if ring["bandwidth_Bps"] != float("inf") else raw["copy_rate_Bps"]
    out["machine_copy_rate_Bps"] = ring["workers"] * bandwidth
    # what a process moved in the ring, it can move: a ring round takes n/N in and n/N out of it
    out["copy_rate_Bps"] = max(raw["copy_rate_Bps"], (2 if raw["duplex"] == "half" else 1) * bandwidth)
    pair = raw.get("pairs_Bps_per_pair")
    out["pairs_over_one_way"] = 2 * pair / raw["one_way_Bps"] if pair else None
    return out


def ring_check(result: dict) -> dict:
    """The written topology's simulated ring against the ring times measured at the fit sizes."""
    from .. import algorithms
    from ..model.simulate import simulate
    from ..model.topology import from_dict

    topo = from_dict(topology_dict(result))
    n = result["workers"]
    errors = [simulate(algorithms.build("ring", n, int(size) // 4), topo).time / t - 1
              for size, t in zip(result["fit_sizes"], result["fit_times_s"])]
    return {"sizes": result["fit_sizes"], "relative_errors": errors,
            "worst_abs_error": max(abs(e) for e in errors)}


def fit(workers: int, sizes, times, add_rate: float, madd_rate: float) -> dict:
    """Fit ring all-reduce times to T = A + B n (``_line``); derive alpha, bandwidth.

    >>> f = fit(2, [1e3, 1e6, 1e7], [2e-4 + 1e3 / 1e9, 2e-4 + 1e6 / 1e9, 2e-4 + 1e7 / 1e9], float("inf"), 1e10)
    >>> round(f["round_latency_s"] * 1e6), round(f["bandwidth_Bps"] / 1e9, 3)
    (100, 1.0)
    """
    import numpy as np

    n = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    a, b, _ = _line(n, t)
    steps, share = max(2 * (workers - 1), 1), (workers - 1) / workers if workers > 1 else 1.0
    per_byte_wire = b - share / 4 / add_rate          # the adds, measured apart
    bandwidth = 2 * share / per_byte_wire if per_byte_wire > 0 else float("inf")
    residual = (a + b * n) / t - 1
    return {"workers": workers, "round_latency_s": float(max(a, 0.0)) / steps, "bandwidth_Bps": float(bandwidth),
            "add_rate": add_rate, "madd_rate": madd_rate, "fit_sizes": n.tolist(), "fit_times_s": t.tolist(),
            "fit_max_relative_error": float(np.abs(residual).max())}


def topology_dict(fit: dict, name: str = "calibrated") -> dict:
    """A single-switch topology from calibrated parameters (latency split over the 2 hops).

    With node costs measured (``fit["node"]``): each node's copy rate, per-message, per-round
    and per-collective overheads and incast factor; its copy channel carries what it sends and
    receives, so where the exchange showed sending and receiving to share (half duplex) the
    links are left wide and the nodes limit; where it showed them independent (full duplex)
    the rate goes on full-duplex links instead and the nodes get no copy channel. The switch,
    which every transfer between the processes crosses, gets the machine's copy rate. The
    host ("ps") hangs off worker 0, whose process runs it. Where
    the ranks added slower all at once than one alone (more processes than cores), the nodes
    get the rates of one alone and the switch the cores they share (N x the rate all at once
    / the rate alone). Without node costs: the ring fit."""
    n = fit["workers"]
    rates = {"reduce_rate": fit["add_rate"], "madd_rate": fit["madd_rate"]}
    node = fit.get("node")
    cores = fit.get("cores") if node is not None and fit.get("cores", n) < n else None
    if cores:                 # rates of one rank computing alone; the machine's cores shared by all
        speedup = fit["add_rate_alone"] / fit["add_rate"]
        rates = {"reduce_rate": fit["add_rate_alone"], "madd_rate": fit["madd_rate"] * speedup}
    if node is None:
        bandwidth = fit["bandwidth_Bps"] if fit["bandwidth_Bps"] != float("inf") else 1e12
        latency, what = fit["round_latency_s"] / 2, (f"{fit['round_latency_s'] * 1e6:.0f} us per round, "
                                                      f"{bandwidth / 1e9:.2f} GB/s per direction")
    else:
        costs = {"message_overhead": node["message_overhead_s"], "round_overhead": node.get("round_overhead_s", 0.0)}
        if node.get("collective_overhead_s"):
            costs["collective_overhead"] = node["collective_overhead_s"]
        if node["duplex"] == "half":
            costs.update(copy_rate=node["copy_rate_Bps"], fan_in=node["fan_in"])
            bandwidth = 1e12
        else:
            bandwidth = node["copy_rate_Bps"]
        rates.update(costs)
        latency = node["latency_s"] / 2
        what = (f"{node['latency_s'] * 1e6:.0f} us latency, {node['message_overhead_s'] * 1e6:.0f} us per message, "
                f"{node.get('round_overhead_s', 0.0) * 1e6:.0f} us per round, "
                f"{node.get('collective_overhead_s', 0.0) * 1e6:.0f} us per collective, "
                f"{node['copy_rate_Bps'] / 1e9:.2f} GB/s per node ({node['duplex']} duplex), incast factor "
                f"{node['fan_in']:.2f}, {node['machine_copy_rate_Bps'] / 1e9:.2f} GB/s for the machine")
    nodes = [{"name": f"worker{i}", "kind": "host", **rates} for i in range(n)]
    switch = {"name": "switch", "kind": "switch", **({"cores": cores} if cores else {})}
    if node is not None:
        switch["copy_rate"] = node["machine_copy_rate_Bps"]   # every transfer between the processes crosses it
    # the runtime runs the host's aggregation in worker 0's process: its transfers cross worker 0's
    # link and copy channel, and worker 0's own to it stay in the process
    nodes += [{"name": "ps", "kind": "cpu", **{k: v for k, v in rates.items() if k not in ("copy_rate", "fan_in")}},
              switch]
    links = [{"a": node_["name"], "b": "switch", "bandwidth": bandwidth, "latency": latency} for node_ in nodes[:n]]
    links.append({"a": "ps", "b": "worker0", "bandwidth": 1e12, "latency": 0.0})
    where = f" on emulated {fit['link_Bps'] * 8 / 1e6:g} Mbit/s links" if fit.get("link_Bps") else ""
    return {"name": name, "description": f"{n} local workers{where}, calibrated by gradsync calibrate: {what}",
            "nodes": nodes, "links": links, "workers": [f"worker{i}" for i in range(n)], "host": "ps"}


# ---------------------------------------------------------------- several machines

def machines_worker(rank: int, workers: int, repeats: int, local: int) -> dict | None:
    """One rank of a calibration across machines of ``local`` consecutive ranks: the ring
    all-reduce timed inside each machine (every machine's ranks at once: they share no link)
    and across machines (local rank 0 of each, the others idle, so one flow per direction has
    each machine's network link), each fitted as ``fit`` does. Rank 0 returns both fits."""
    torch.set_num_threads(1)
    machines = workers // local
    inside = [dist.new_group(list(range(m * local, (m + 1) * local))) for m in range(machines)]
    across = dist.new_group([m * local for m in range(machines)])        # every rank creates every group
    add_rate, madd_rate = _local_rates(rank, workers, repeats)
    times = torch.zeros(2, len(FIT_BYTES), dtype=torch.float64)
    for level, group, size, member in ((0, inside[rank // local], local, True),
                                       (1, across, machines, rank % local == 0)):
        dist.barrier()
        if member:
            times[level] = torch.tensor(_ring_times(repeats, size, group))
    stats = torch.cat([times.flatten(), torch.tensor([-add_rate, -madd_rate], dtype=torch.float64)])
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    if rank:
        return None
    add_rate, madd_rate = -stats[-2].item(), -stats[-1].item()
    level_times = stats[:-2].view(2, -1).tolist()
    return {"machines": machines, "local_size": local,
            "inside": fit(local, list(FIT_BYTES), level_times[0], add_rate, madd_rate),
            "across": fit(machines, list(FIT_BYTES), level_times[1], add_rate, madd_rate)}


def calibrate_launched(repeats: int = 10) -> dict | None:
    """Calibrate as this process's rank of a job torchrun (mpirun, srun) started: the links
    inside and between machines apart when the job spans several machines of several ranks
    (as the launcher says, or as the ranks learn from each other's hosts), else one level as
    ``calibrate`` fits it. Rank 0 returns the fit, the others None.

    Example, on each machine: ``torchrun --nnodes 2 --nproc-per-node 4 ... -m gradsync calibrate``.
    """
    from .launch import as_launched

    result, _, _ = as_launched(_calibrate_job, repeats, timeout=600.0)
    return result


def _calibrate_job(rank: int, world: int, repeats: int) -> dict | None:
    from ..runtime.transport.hosts import local_size

    local = local_size(world)
    if 1 < local < world:
        return machines_worker(rank, world, repeats, local)
    raw = worker(rank, world, repeats)
    return None if raw is None else fit_launches(world, [raw])


def machines_topology_dict(fits: dict, name: str = "calibrated") -> dict:
    """A two-level topology from ``machines_worker``'s fits: each machine's workers on its own
    switch at the inside fit, the machines' switches on one network switch at the across fit
    (latencies split over the hops a message crosses)."""
    machines, local = fits["machines"], fits["local_size"]
    inside, across = fits["inside"], fits["across"]
    finite = lambda bw: bw if bw != float("inf") else 1e12      # noqa: E731
    # a message between machines crosses worker-switch, switch-network twice: split the across
    # latency so that the path sums to it, less the two inside hops it also crosses
    network_latency = max(across["round_latency_s"] - inside["round_latency_s"], 0.0) / 2
    rates = {"reduce_rate": inside["add_rate"], "madd_rate": inside["madd_rate"]}
    nodes, links = [], []
    for m in range(machines):
        nodes.append({"name": f"machine{m}", "kind": "switch"})
        links.append({"a": f"machine{m}", "b": "network", "bandwidth": finite(across["bandwidth_Bps"]),
                      "latency": network_latency})
        for i in range(m * local, (m + 1) * local):
            nodes.append({"name": f"worker{i}", "kind": "host", **rates})
            links.append({"a": f"worker{i}", "b": f"machine{m}", "bandwidth": finite(inside["bandwidth_Bps"]),
                          "latency": inside["round_latency_s"] / 2})
    nodes += [{"name": "ps", "kind": "cpu", **rates}, {"name": "network", "kind": "switch"}]
    links.append({"a": "ps", "b": "machine0", "bandwidth": finite(inside["bandwidth_Bps"]),
                  "latency": inside["round_latency_s"] / 2})
    return {"name": name, "description": f"{machines} machines x {local} workers, calibrated by gradsync "
            f"calibrate: inside {inside['round_latency_s'] * 1e6:.0f} us per round, "
            f"{finite(inside['bandwidth_Bps']) / 1e9:.3g} GB/s; across {across['round_latency_s'] * 1e6:.0f} us, "
            f"{finite(across['bandwidth_Bps']) / 1e9:.3g} GB/s per direction",
            "nodes": nodes, "links": links, "workers": [f"worker{i}" for i in range(machines * local)],
            "host": "ps"}


def write(fit: dict, path: str | Path) -> Path:
    """Write a calibration (one machine's fit, or ``machines_worker``'s two) as a topology file."""
    path = Path(path)
    data = (machines_topology_dict if "across" in fit else topology_dict)(fit, path.stem)
    if path.suffix == ".json":
        path.write_text(json.dumps(data, indent=2))
    elif path.suffix in (".yaml", ".yml"):
        import yaml
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    else:
        raise ConfigError(f"--out must end in .json, .yaml or .yml, got {path.name!r}")
    return path
