"""Measure the local workers and write a topology the simulator, ``tune`` and "auto" can use.

The model is fitted to the runtime as it behaves, not to raw sockets: ring all-reduce times
T(n) at sizes from 256 KB to 64 MB (measured as ``gradsync bench`` measures: blocks of
back-to-back calls, the sizes taking turns) are fitted to T = A + B n by least squares on relative error
(the error the predictions are judged by), then the ring's closed form gives the per-round
latency alpha = A / 2(N-1) and, less the adds measured locally, the bandwidth. Gloo's
per-message costs are thus in alpha. The multiply-add rate is CERAR's codec, timed as the
runtime runs it.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..errors import ConfigError
from .api import all_reduce
from .bench import time_in_blocks

LARGE_BYTES = 32 << 20
FIT_BYTES = (256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
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
    from .api import compiled

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


def worker(rank: int, workers: int, repeats: int) -> dict | None:
    """One rank's measurements; rank 0 returns them for every rank (times: the slowest
    rank's; rates: the lowest)."""
    torch.set_num_threads(1)
    a, b = torch.randn(LARGE_BYTES // 4), torch.randn(LARGE_BYTES // 4)
    add_rate = a.numel() / _median_time(lambda: a.add_(b), repeats, barrier=False)
    madd_rate = codec_madd_rate(rank, workers, repeats)
    bufs = [torch.randn(nbytes // 4) for nbytes in FIT_BYTES]
    calls = {k: (lambda buf=buf: all_reduce(buf, check=False)) for k, buf in enumerate(bufs)}
    samples = time_in_blocks(calls, repeats, dist.barrier, before=lambda k: bufs[k].div_(workers))  # stays finite
    times = [statistics.median(samples[k]) for k in range(len(bufs))]
    stats = torch.tensor(times + [-add_rate, -madd_rate], dtype=torch.float64)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    if rank:
        return None
    return {"times": stats[:-2].tolist(), "add_rate": -stats[-2].item(), "madd_rate": -stats[-1].item()}


def calibrate(workers: int, repeats: int = 10, launches: int = 3) -> dict:
    """Measure ``workers`` local workers in ``launches`` separate process groups and fit the
    medians: on a shared machine a process group settles into a fast or a slow state for its
    whole life (here 0.5 ms or 2 ms per 1 MB ring all-reduce), so one launch can mislead.

    Example: ``calibrate(4)["round_latency_s"]``.
    """
    from .launch import run

    runs = [run(worker, workers, repeats)[0] for _ in range(launches)]
    times = [statistics.median(r["times"][k] for r in runs) for k in range(len(FIT_BYTES))]
    result = fit(workers, list(FIT_BYTES), times, statistics.median(r["add_rate"] for r in runs),
                 statistics.median(r["madd_rate"] for r in runs))
    result["launches"] = runs
    return result


def fit(workers: int, sizes, times, add_rate: float, madd_rate: float) -> dict:
    """Fit ring all-reduce times to T = A + B n (relative least squares); derive alpha, bandwidth.

    >>> f = fit(2, [1e3, 1e6, 1e7], [2e-4 + 1e3 / 1e9, 2e-4 + 1e6 / 1e9, 2e-4 + 1e7 / 1e9], float("inf"), 1e10)
    >>> round(f["round_latency_s"] * 1e6), round(f["bandwidth_Bps"] / 1e9, 3)
    (100, 1.0)
    """
    import numpy as np

    n = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    (a, b), *_ = np.linalg.lstsq(np.stack([1 / t, n / t], axis=1), np.ones_like(t), rcond=None)
    steps, share = max(2 * (workers - 1), 1), (workers - 1) / workers if workers > 1 else 1.0
    per_byte_wire = b - share / 4 / add_rate          # the adds, measured apart
    bandwidth = 2 * share / per_byte_wire if per_byte_wire > 0 else float("inf")
    residual = (a + b * n) / t - 1
    return {"workers": workers, "round_latency_s": float(max(a, 0.0)) / steps, "bandwidth_Bps": float(bandwidth),
            "add_rate": add_rate, "madd_rate": madd_rate, "fit_sizes": n.tolist(), "fit_times_s": t.tolist(),
            "fit_max_relative_error": float(np.abs(residual).max())}


def topology_dict(fit: dict, name: str = "calibrated") -> dict:
    """A single-switch topology from calibrated parameters (latency split over the 2 hops)."""
    n = fit["workers"]
    bandwidth = fit["bandwidth_Bps"] if fit["bandwidth_Bps"] != float("inf") else 1e12
    rates = {"reduce_rate": fit["add_rate"], "madd_rate": fit["madd_rate"]}
    nodes = [{"name": f"worker{i}", "kind": "host", **rates} for i in range(n)]
    nodes += [{"name": "ps", "kind": "cpu", **rates}, {"name": "switch", "kind": "switch"}]
    links = [{"a": node["name"], "b": "switch", "bandwidth": bandwidth, "latency": fit["round_latency_s"] / 2}
             for node in nodes[:-1]]
    return {"name": name, "description": f"{n} local workers, calibrated by gradsync calibrate: "
            f"{fit['round_latency_s'] * 1e6:.0f} us per round, {bandwidth / 1e9:.2f} GB/s per direction",
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
    a, b = torch.randn(LARGE_BYTES // 4), torch.randn(LARGE_BYTES // 4)
    add_rate = a.numel() / _median_time(lambda: a.add_(b), repeats, barrier=False)
    madd_rate = codec_madd_rate(rank, workers, repeats)
    times = torch.zeros(2, len(FIT_BYTES), dtype=torch.float64)
    for level, group, size, member in ((0, inside[rank // local], local, True),
                                       (1, across, machines, rank % local == 0)):
        dist.barrier()
        if member:
            bufs = [torch.randn(nbytes // 4) for nbytes in FIT_BYTES]
            calls = {k: (lambda buf=buf: all_reduce(buf, group=group, check=False)) for k, buf in enumerate(bufs)}
            samples = time_in_blocks(calls, repeats, lambda: dist.barrier(group=group),
                                     before=lambda k: bufs[k].div_(size))
            times[level] = torch.tensor([statistics.median(samples[k]) for k in range(len(bufs))])
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
    inside and between machines apart when the job spans several machines of several ranks,
    else one level as ``calibrate`` fits it. Rank 0 returns the fit, the others None.

    Example, on each machine: ``torchrun --nnodes 2 --nproc-per-node 4 ... -m gradsync calibrate``.
    """
    from .launch import as_launched, launched, local_size

    world = launched()["world"]
    local = local_size(world)
    if 1 < local < world:
        fits, rank, _ = as_launched(machines_worker, repeats, local, timeout=600.0)
        return fits if rank == 0 else None
    raw, rank, _ = as_launched(worker, repeats, timeout=600.0)
    return fit(world, list(FIT_BYTES), raw["times"], raw["add_rate"], raw["madd_rate"]) if rank == 0 else None


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
