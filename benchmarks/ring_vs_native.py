"""gradsync's ring against the engine's own all-reduce, busbw ratio, in separate launches.

Usage: python benchmarks/ring_vs_native.py [--workers 2,4] [--launches 3] [--backend torch|mpi]
                                           [--sizes 4KB,1MB,4MB,16MB,64MB] [--out FILE]

Each launch is one ``gradsync bench --algorithms ring`` run (a fresh process group: on this
machine a group settles into a fast or slow state for its whole life, so launches, not
iterations, are the unit of repetition). Within a launch, bench times ring and native in
alternating blocks of back-to-back calls. Printed: per size, each launch's ratio
ring busbw / native busbw and their median; and native's 4 KB time against ring's.
"""

import argparse
import json
import statistics
import subprocess
import sys


def bench(workers: int, sizes: str, backend: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "gradsync", "bench", "--workers", str(workers), "--algorithms", "ring",
                          "--sizes", sizes, "--backend", backend, "--format", "json"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--backend", default="torch", choices=["torch", "mpi"])
    ap.add_argument("--sizes", default="4KB,1MB,4MB,16MB,64MB")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    results = {}
    for n in map(int, args.workers.split(",")):
        ratios, times = {}, {}
        for _ in range(args.launches):
            rows = bench(n, args.sizes, args.backend)
            native = {r["bytes"]: r for r in rows if r["algorithm"] == "native"}
            for r in rows:
                if r["algorithm"] == "ring":
                    ratios.setdefault(r["bytes"], []).append(r["busbw_GBps"] / native[r["bytes"]]["busbw_GBps"])
                    times.setdefault(r["bytes"], []).append((r["time_s"], native[r["bytes"]]["time_s"]))
        results[n] = {"ratio_per_launch": ratios, "median_ratio": {b: statistics.median(v) for b, v in ratios.items()},
                      "ring_and_native_time_s": times}
        for b, v in ratios.items():
            t = times[b]
            print(f"{args.backend} N = {n}, {b / 1e6:g} MB: ring/native busbw {', '.join(f'{x:.2f}' for x in v)} "
                  f"(median {statistics.median(v):.2f}); ring {statistics.median(x for x, _ in t) * 1e6:.0f} us, "
                  f"native {statistics.median(y for _, y in t) * 1e6:.0f} us", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"backend": args.backend, "launches": args.launches, "workers": results}, f, indent=1)


if __name__ == "__main__":
    main()
