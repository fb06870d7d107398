"""Issue 4's figures on this machine: busbw against Gloo's own all-reduce, prediction error
after calibration, bucketing gain, and per-collective overhead at 4 KB.

Usage: python benchmarks/runtime_figures.py [--workers 2,4] [--out docs/runtime_results.json]
Each worker count: calibrate, then bench (algorithms interleaved per iteration, medians),
then 2,000 gradients of 4 KB synchronized one by one and in buckets.
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
    from gradsync.runtime import all_reduce, all_reduce_coalesced

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


def gradsync_cli(*args):
    out = subprocess.run([sys.executable, "-m", "gradsync", *args, "--format", "json"], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--out", default="docs/runtime_results.json")
    args = parser.parse_args()
    from gradsync.runtime.launch import run

    results = {}
    for n in map(int, args.workers.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            topo = str(Path(tmp) / f"calibrated{n}.json")
            fit = gradsync_cli("calibrate", "--workers", str(n), "--out", topo)
            rows = gradsync_cli("bench", "--workers", str(n), "--algorithms", ALGORITHMS, "--sizes", SIZES,
                                "--topology", topo)
        buckets = run(bucketing, n, 2000, 4096)[0]
        native = {r["bytes"]: r for r in rows if r["algorithm"] == "native"}
        big = [r for r in rows if r["bytes"] >= 10**6]
        results[n] = {"calibration": fit, "rows": rows, "bucketing": buckets,
                      "median_abs_prediction_error_1MB_up": statistics.median(abs(r["prediction_error"]) for r in big),
                      "ring_over_native_busbw": {r["bytes"]: r["busbw_GBps"] / native[r["bytes"]]["busbw_GBps"]
                                                 for r in rows if r["algorithm"] == "ring"},
                      "overhead_4KB_ring_over_native": next(r["time_s"] for r in rows if r["algorithm"] == "ring"
                                                            and r["bytes"] < 10**4) / native[min(native)]["time_s"]}
        r = results[n]
        print(f"N = {n}: ring/native busbw by size: "
              + ", ".join(f"{b / 1e6:g} MB {v:.2f}" for b, v in r["ring_over_native_busbw"].items()))
        print(f"N = {n}: median |prediction error| for >= 1 MB: {r['median_abs_prediction_error_1MB_up']:.0%}; "
              f"4 KB overhead ring/native: {r['overhead_4KB_ring_over_native']:.1f}x; bucketing 2000 x 4 KB: "
              f"{buckets['one_by_one']:.2f} s one by one, {buckets['bucketed']:.3f} s bucketed, "
              f"{buckets['one_by_one'] / buckets['bucketed']:.0f}x", flush=True)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
