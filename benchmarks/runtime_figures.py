"""The runtime's figures on this machine: busbw against Gloo's own all-reduce, prediction error
after calibration, bucketing gain, and per-collective overhead at 4 KB.

Usage: python benchmarks/runtime_figures.py [--workers 2,4] [--out docs/results/runtime_results.json]
Each worker count: calibrate, bench every algorithm with the calibrated predictions, bench
ring against Gloo's all-reduce in --launches separate runs (medians of their ratios), then
2,000 gradients of 4 KB synchronized one by one and in buckets.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

ALGORITHMS = "ring,halving_doubling,tree,sharded,cerar"
SIZES = "4KB,64KB,1MB,4MB,16MB,64MB,256MB"


def bucketing(rank, workers, count, nbytes):
    """Median seconds to synchronize ``count`` tensors one by one and bucketed."""
    from gradsync.runtime import all_reduce
    from gradsync.integrations.bucketing import all_reduce_coalesced

    torch.set_num_threads(1)
    grads = [torch.randn(nbytes // 4) for _ in range(count)]
    out = {}
    for name, fn in (("one_by_one", lambda: [all_reduce(g, algorithm="ring") for g in grads]),
                     ("bucketed", lambda: all_reduce_coalesced(grads, algorithm="ring"))):
        times = []
        for _ in range(3):
            dist.barrier()
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
    return out


def _time(t):
    return f"{t * 1e6:.0f} us" if t < 1e-3 else f"{t * 1e3:.2f} ms"


def tables(results) -> str:
    """The results as the markdown tables of docs/runtime.md."""
    out = []
    for n, r in results.items():
        c = r["calibration"]
        out.append(f"### N = {n} (calibrated: {c['round_latency_s'] * 1e6:.0f} us per round, "
                   f"{c['bandwidth_Bps'] / 1e9:.2f} GB/s per direction, CERAR codec {c['madd_rate']:.2g} "
                   f"multiply-adds/s)\n")
        out.append("| size | algorithm | time | busbw GB/s | alg / native | max error | predicted | prediction error |")
        out.append("|---|---|---|---|---|---|---|---|")
        native = {x["bytes"]: x for x in r["rows"] if x["algorithm"] == "native"}
        for x in r["rows"]:
            out.append(f"| {x['bytes'] / 1e6:g} MB | {x['algorithm']} | {_time(x['time_s'])} | {x['busbw_GBps']:.3f} "
                       f"| {x['busbw_GBps'] / native[x['bytes']]['busbw_GBps']:.2f} | {x['max_error']:.1e} "
                       f"| {_time(x['predicted_s'])} | {x['prediction_error']:+.0%} |")
        per = r["ring_over_native_busbw_per_launch"]
        out.append(f"\nRing over native busbw, {len(next(iter(per.values())))} separate launches (median): "
                   + "; ".join(f"{int(b) / 1e6:g} MB " + ", ".join(f"{v:.2f}" for v in vs)
                               + f" ({statistics.median(vs):.2f})" for b, vs in per.items()) + ".")
        b = r["bucketing"]
        out.append(f"Median |prediction error| for sizes >= 1 MB: {r['median_abs_prediction_error_1MB_up']:.0%} "
                   f"(gradsync's algorithms; {r['median_abs_prediction_error_1MB_up_with_native']:.0%} with the "
                   f"native rows, predicted as a ring). Bucketing 2,000 gradients of 4 KB: "
                   f"{b['one_by_one']:.2f} s one by one, {b['bucketed'] * 1e3:.0f} ms in buckets "
                   f"({b['one_by_one'] / b['bucketed']:.0f}x).\n")
    return "\n".join(out)


def gradsync_cli(*args):
    out = subprocess.run([sys.executable, "-m", "gradsync", *args, "--format", "json"], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--out", default="docs/results/runtime_results.json")
    parser.add_argument("--launches", type=int, default=3, help="separate ring-against-native bench runs")
    parser.add_argument("--tables", metavar="JSON", help="only print the markdown tables of an earlier run")
    args = parser.parse_args()
    if args.tables:
        print(tables(json.loads(Path(args.tables).read_text())))
        return
    from gradsync.tools.launch import run

    results = {}
    for n in map(int, args.workers.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            topo = str(Path(tmp) / f"calibrated{n}.json")
            fit = gradsync_cli("calibrate", "--workers", str(n), "--out", topo)
            rows = gradsync_cli("bench", "--workers", str(n), "--algorithms", ALGORITHMS, "--sizes", SIZES,
                                "--topology", topo)
            # ring against Gloo's own all-reduce, in separate launches: a process group settles
            # into a fast or a slow state for its whole life on this machine
            launches = [gradsync_cli("bench", "--workers", str(n), "--algorithms", "ring", "--sizes", SIZES)
                        for _ in range(args.launches)]
        buckets = run(bucketing, n, 2000, 4096)[0]
        ratios = {}
        for rows_k in launches:
            native_k = {r["bytes"]: r for r in rows_k if r["algorithm"] == "native"}
            for r in rows_k:
                if r["algorithm"] == "ring":
                    ratios.setdefault(r["bytes"], []).append(r["busbw_GBps"] / native_k[r["bytes"]]["busbw_GBps"])
        big = [r for r in rows if r["bytes"] >= 10**6]
        results[n] = {"calibration": fit, "rows": rows, "bucketing": buckets, "ring_vs_native_launches": launches,
                      "median_abs_prediction_error_1MB_up": statistics.median(
                          abs(r["prediction_error"]) for r in big if r["algorithm"] != "native"),
                      "median_abs_prediction_error_1MB_up_with_native": statistics.median(
                          abs(r["prediction_error"]) for r in big),
                      "ring_over_native_busbw": {b: statistics.median(v) for b, v in ratios.items()},
                      "ring_over_native_busbw_per_launch": ratios,
                      "overhead_4KB_ring_over_native": 1 / statistics.median(ratios[min(ratios)])}
        r = results[n]
        print(f"N = {n}: ring/native busbw by size (median of {args.launches} launches): "
              + ", ".join(f"{b / 1e6:g} MB {v:.2f}" for b, v in r["ring_over_native_busbw"].items()))
        print(f"N = {n}: median |prediction error| for >= 1 MB: {r['median_abs_prediction_error_1MB_up']:.0%} "
              f"(with the native rows, predicted as ring: {r['median_abs_prediction_error_1MB_up_with_native']:.0%}); "
              f"4 KB overhead ring/native: {r['overhead_4KB_ring_over_native']:.1f}x; bucketing 2000 x 4 KB: "
              f"{buckets['one_by_one']:.2f} s one by one, {buckets['bucketed']:.3f} s bucketed, "
              f"{buckets['one_by_one'] / buckets['bucketed']:.0f}x", flush=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(tables(results))


if __name__ == "__main__":
    main()
