"""Published nccl-tests results for named machines, predicted from gradsync's nominal presets.

Reads docs/results/published_nccl.json (each row: a machine, the preset that describes it from
its datasheet, the NCCL algorithm the run was forced to or none, a size and the published
busbw or time, and its source), predicts every row with the simulator -- the forced algorithm's
gradsync schedule, or the fastest of NCCL's algorithms (nccl_ring, nccl_tree, nvls, nvls_tree)
the machine can run -- at the fastest of the protocols it offers, and writes the table:

    python benchmarks/nccl_validation.py --out docs/results/nccl_validation.json
    python benchmarks/nccl_validation.py --markdown docs/results/nccl_validation.json

Nothing here is fitted: the presets take link counts and rates from datasheets, and the model
NCCL's own constants (docs/validation.md). busbw is nccl-tests' (algbw x 2 (N - 1) / N).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from gradsync.model.topology import resolve
from gradsync.model.tune import Candidate, pool_for, prediction

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "docs" / "results" / "published_nccl.json"
NCCL_NAMES = {"ring": "nccl_ring", "tree": "nccl_tree", "nvls": "nvls", "nvls_tree": "nvls_tree"}
SMALL = 64 * 1024            # rows at most this large are judged by time (within 2x), the others by busbw


def predict(row: dict) -> dict:
    """The row's prediction: the candidate (algorithm/protocol) the simulator finds fastest among
    those the run allows, its time, busbw and what predicted it."""
    topology = resolve(row["topology"])
    n = len(topology.workers)
    names = [NCCL_NAMES[row["algorithm"]]] if row.get("algorithm") else list(NCCL_NAMES.values())
    pool = pool_for(topology, n, [Candidate(a) for a in names])
    found = {c.label: prediction(c, topology, row["bytes"], 4, n) for c in pool}
    best = min(found, key=lambda k: found[k][0])
    seconds, how = found[best]
    busbw = row["bytes"] / seconds * 2 * (n - 1) / n / 1e9
    return {"predicted": best, "predicted_by": how, "time_us": seconds * 1e6, "busbw_GBps": busbw, "workers": n}


def error(row: dict, p: dict) -> float:
    """Predicted / measured - 1, in busbw for large messages and in time for small ones."""
    if "busbw_GBps" in row:
        return p["busbw_GBps"] / row["busbw_GBps"] - 1
    return p["time_us"] / row["time_us"] - 1


def run(out: Path | None) -> dict:
    rows = json.loads(PUBLISHED.read_text())["rows"]
    results = []
    for row in rows:
        start = time.perf_counter()
        p = predict(row)
        p["error"], p["seconds_to_predict"] = error(row, p), time.perf_counter() - start
        results.append({**row, "prediction": p})
        print(f"{row['id']:<24} {p['predicted']:<18} {p['busbw_GBps']:8.1f} GB/s {p['time_us']:12.1f} us "
              f"{p['error']:+.1%}  ({p['seconds_to_predict']:.1f} s)", file=sys.stderr)
    summary = summarize(results)
    data = {"rows": results, "summary": summary}
    if out:
        out.write_text(json.dumps(data, indent=1) + "\n")
    return data


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None, help="print the table of a stored result")
    args = ap.parse_args()
    if args.markdown:
        print(markdown(args.markdown))
        return
    data = run(args.out)
    print(json.dumps(data["summary"], indent=1))


if __name__ == "__main__":
    main()
