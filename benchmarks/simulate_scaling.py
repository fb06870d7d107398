"""Simulator scaling: a ring all-reduce of 1 GB on the ethernet preset, 8..4096 workers.

Usage: python benchmarks/simulate_scaling.py [--workers 8,64,256,1024,2048,4096] [--size 1GB]
Each worker count runs in a fresh subprocess so that its peak memory (ru_maxrss) is its own.
Prints transfers, schedule build time, simulation time, peak memory and bytes per transfer.
"""

import argparse
import json
import resource
import subprocess
import sys
import time


def one(workers: int, size: str) -> dict:
    import gradsync
    from gradsync.simulate import simulate
    from gradsync.topology import preset
    from gradsync.units import parse_size

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    topo = preset("ethernet", workers=workers)
    start = time.perf_counter()
    schedule = gradsync.schedule("ring", workers, parse_size(size) // 4)
    built = time.perf_counter()
    result = simulate(schedule, topo)
    done = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"workers": workers, "transfers": len(schedule.transfers), "build_s": built - start,
            "simulate_s": done - built, "simulated_time_s": result.time,
            "peak_rss_MB": peak / 1024, "rss_growth_MB": (peak - base) / 1024}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="8,64,256,1024,2048,4096")
    parser.add_argument("--size", default="1GB")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.size)))
        return
    print(f"{'workers':>8} {'transfers':>10} {'build':>8} {'simulate':>9} {'total':>8} {'peak RSS':>9} "
          f"{'growth/transfer':>16}")
    for n in map(int, args.workers.split(",")):
        out = subprocess.run([sys.executable, __file__, "--one", str(n), "--size", args.size],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout)
        total = r["build_s"] + r["simulate_s"]
        print(f"{n:>8} {r['transfers']:>10} {r['build_s']:>7.2f}s {r['simulate_s']:>8.2f}s {total:>7.2f}s "
              f"{r['peak_rss_MB']:>7.0f}MB {r['rss_growth_MB'] * 2**20 / r['transfers']:>13.0f} B")


if __name__ == "__main__":
    main()
