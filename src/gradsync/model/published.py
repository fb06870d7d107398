"""Published nccl-tests results for named machines, and gradsync's predictions of them.

``docs/results/published_nccl.json`` holds the rows (a machine, the preset that describes it from
its datasheet, the NCCL algorithm the run was forced to or none, a size, the published busbw or
time, the source); ``predict`` times one with the simulator: the forced algorithm's gradsync
schedule at its fastest protocol, or the algorithm and protocol NCCL's own cost model picks on
that machine (what NCCL ran). benchmarks/nccl_validation.py runs every row and stores the table
(docs/validation.md). Nothing is fitted to the rows.

>>> row = {"topology": "hgx-h100", "algorithm": "ring", "bytes": 1 << 30, "busbw_GBps": 367.5}
>>> p = predict(row)
>>> p["predicted"], abs(error(row, p)) < 0.02
('nccl_ring/simple', True)
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from . import nccl
from .topology import resolve
from .tune import Candidate, pool_for, prediction

NCCL_NAMES = {"ring": "nccl_ring", "tree": "nccl_tree", "nvls": "nvls", "nvls_tree": "nvls_tree"}
SMALL = 64 * 1024            # rows at most this large are judged by time (within 2x), the others by busbw


def predict(row: dict) -> dict:
    """The row's prediction: the algorithm the run was forced to (at the protocol the simulator
    finds fastest for it), or, where NCCL chose, the algorithm and protocol NCCL's own cost model
    chooses on this machine (``model/nccl.py``): its simulated time, busbw and what predicted it;
    beside it, the fastest of NCCL's algorithms and protocols as gradsync's tuner finds it."""
    topology = resolve(row["topology"])
    n = len(topology.workers)
    names = [NCCL_NAMES[row["algorithm"]]] if row.get("algorithm") else list(NCCL_NAMES.values())
    pool = pool_for(topology, n, [Candidate(a) for a in names])
    found = {c.label: prediction(c, topology, row["bytes"], 4, n) for c in pool}
    if row.get("algorithm"):
        ran = list(found)
    else:
        algorithm, protocol, _ = nccl.choose(row["bytes"], nccl.System.of(topology))
        ran = [f"{NCCL_NAMES[algorithm]}/{protocol}"]
    pick = min(ran, key=lambda k: found[k][0])
    fastest = min(found, key=lambda k: found[k][0])
    seconds, how = found[pick]
    busbw = row["bytes"] / seconds * 2 * (n - 1) / n / 1e9
    return {"predicted": pick, "predicted_by": how, "time_us": seconds * 1e6, "busbw_GBps": busbw, "workers": n,
            "gradsync_fastest": fastest, "gradsync_fastest_us": found[fastest][0] * 1e6}


def error(row: dict, p: dict) -> float:
    """Predicted / measured - 1, in busbw for large messages and in time for small ones."""
    if "busbw_GBps" in row:
        return p["busbw_GBps"] / row["busbw_GBps"] - 1
    return p["time_us"] / row["time_us"] - 1


def summarize(results) -> dict:
    """Median and worst |error| of busbw at the largest size of each machine, and the small messages."""
    large = [r for r in results if "busbw_GBps" in r]
    small = [r for r in results if "time_us" in r and r["bytes"] <= SMALL]
    abs_large = [abs(r["prediction"]["error"]) for r in large]
    held = [abs(r["prediction"]["error"]) for r in large if r["set"] == "held-out"]
    ratio = [max(r["prediction"]["time_us"] / r["time_us"], r["time_us"] / r["prediction"]["time_us"]) for r in small]
    machines = {r["machine"].split(",")[0] for r in large}
    return {"large_rows": len(large), "machines": len(machines), "median_abs_error": statistics.median(abs_large),
            "worst_abs_error": max(abs_large), "held_out_median_abs_error": statistics.median(held) if held else None,
            "held_out_worst_abs_error": max(held) if held else None,
            "small_rows": len(small), "small_worst_ratio": max(ratio) if ratio else None}


def markdown(path: Path) -> str:
    data = json.loads(path.read_text())
    lines = ["| machine | N | algorithm (run) | size | measured | predicted | by | error | set | source |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        p = r["prediction"]
        measured = f"{r['busbw_GBps']:g} GB/s" if "busbw_GBps" in r else f"{r['time_us']:g} us"
        predicted = f"{p['busbw_GBps']:.0f} GB/s" if "busbw_GBps" in r else f"{p['time_us']:.1f} us"
        size = f"{r['bytes'] / 2**30:g} GiB" if r["bytes"] >= 2**30 else f"{r['bytes'] / 2**10:g} KiB" \
            if r["bytes"] < 2**20 else f"{r['bytes'] / 2**20:g} MiB"
        run = r.get("algorithm") or "NCCL's choice"
        lines.append(f"| {r['machine']} | {p['workers']} | {run} -> {p['predicted']} "
                     f"| {size} | {measured} | {predicted} | {p['predicted_by']} | {p['error']:+.0%} | {r['set']} "
                     f"| [{r['source'].split('github.com/')[-1]}]({r['source']}) |")
    s = data["summary"]
    lines.append("")
    lines.append(f"Large messages: {s['large_rows']} rows, {s['machines']} machines: median |error| "
                 f"{s['median_abs_error']:.1%}, worst {s['worst_abs_error']:.1%} (held out: median "
                 f"{s['held_out_median_abs_error']:.1%}, worst {s['held_out_worst_abs_error']:.1%}). "
                 f"Small messages: {s['small_rows']} rows, worst ratio {s['small_worst_ratio']:.2f}x.")
    return "\n".join(lines)
