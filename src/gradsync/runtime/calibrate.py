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


def write(fit: dict, path: str | Path) -> Path:
    path = Path(path)
    data = topology_dict(fit, path.stem)
    if path.suffix == ".json":
        path.write_text(json.dumps(data, indent=2))
    elif path.suffix in (".yaml", ".yml"):
        import yaml
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    else:
        raise ConfigError(f"--out must end in .json, .yaml or .yml, got {path.name!r}")
    return path
