"""Fitting a calibration's measurements: lines through the times (``_line``), the node costs
they imply (``fit_node``, then ``runtime_node`` as the runtime pays them), the ring fit, and
the topology files written from them (one machine, or several).
"""

from __future__ import annotations

import numpy as np

HALF_DUPLEX_BELOW = 0.75      # exchange rate per direction, as a fraction of one-way, below which sends and receives share


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
    from ... import algorithms
    from ...model.simulate import simulate
    from ...model.topology import from_dict

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
