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

The modules: ``measure`` (what each rank runs and times, in the launched processes) and
``fitting`` (the fits, and the topology files written from them).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ...errors import ConfigError
from .fitting import (HALF_DUPLEX_BELOW, fit, fit_node, machines_topology_dict, ring_check, runtime_node,
                  topology_dict)
from .measure import (AGREEMENT_ELEMENTS, CODEC_ELEMENTS, FIT_BYTES, LARGE_BYTES, LINK_SECONDS, P2P_BYTES,
                      add_seconds_alone, agreement_times, codec_madd_rate, link_max_bytes, machines_worker,
                      p2p_times, sizes_for, worker)

__all__ = ["AGREEMENT_ELEMENTS", "CODEC_ELEMENTS", "FIT_BYTES", "HALF_DUPLEX_BELOW", "LARGE_BYTES", "LINK_SECONDS",
           "P2P_BYTES", "add_seconds_alone", "agreement_times", "calibrate", "calibrate_launched", "codec_madd_rate",
           "fit", "fit_launches", "fit_node", "link_max_bytes", "machines_topology_dict", "machines_worker",
           "p2p_times", "ring_check", "runtime_node", "sizes_for", "topology_dict", "worker", "write"]


def calibrate(workers: int, repeats: int = 10, launches: int = 3, network=None) -> dict:
    """Measure ``workers`` local workers in ``launches`` separate process groups and fit the
    medians: on a shared machine a process group settles into a fast or a slow state for its
    whole life (here 0.5 ms or 2 ms per 1 MB ring all-reduce), so one launch can mislead.
    ``network``: a ``links.SlowLinks`` (entered) the workers run behind; messages are then
    timed up to ``link_max_bytes`` of its rate.

    Example: ``calibrate(4)["round_latency_s"]``.
    """
    from ..launch import run

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


def calibrate_launched(repeats: int = 10) -> dict | None:
    """Calibrate as this process's rank of a job torchrun (mpirun, srun) started: the links
    inside and between machines apart when the job spans several machines of several ranks
    (as the launcher says, or as the ranks learn from each other's hosts), else one level as
    ``calibrate`` fits it. Rank 0 returns the fit, the others None.

    Example, on each machine: ``torchrun --nnodes 2 --nproc-per-node 4 ... -m gradsync calibrate``.
    """
    from ..launch import as_launched

    result, _, _ = as_launched(_calibrate_job, repeats, timeout=600.0)
    return result


def _calibrate_job(rank: int, world: int, repeats: int) -> dict | None:
    from ...runtime.transport.hosts import local_size

    local = local_size(world)
    if 1 < local < world:
        return machines_worker(rank, world, repeats, local)
    raw = worker(rank, world, repeats)
    return None if raw is None else fit_launches(world, [raw])


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
