"""Simulator scaling: a ring all-reduce of 1 GB on the ethernet preset, 8..4096 workers,
including writing its timeline.

Usage: python benchmarks/simulate_scaling.py [--workers 256,1024,4096] [--sizes 1GiB,1GB]
           [--full-up-to 1024] [--json-up-to 256] [--repeats 3] [--out docs/results/simulator_scaling.json]

Each run is a fresh subprocess, so that its peak memory (ru_maxrss) is its own. Per worker
count: the schedule build, the simulation, and writing the timeline as .npz (the CLI's
``simulate --out x.npz``), wall-clock and CPU seconds, the peak RSS, and whether the
symmetric shortcut applied. Up to ``--full-up-to`` workers the full simulation
(``symmetry=False``) runs too, as the baseline, and the two timelines are compared (they
must be identical); up to ``--json-up-to`` the JSON timeline is timed as well. Medians over
``--repeats`` runs; the machine's load average is recorded beside them.
"""

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def one(workers: int, size: str, symmetry: bool, fmt: str) -> dict:
    import numpy as np

    import gradsync
    from gradsync.model.simulate import load_timeline, simulate
    from gradsync.model.topology import preset
    from gradsync.units import parse_size

    topo = preset("ethernet", workers=workers)
    clock = [(time.perf_counter(), time.process_time())]
    schedule = gradsync.schedule("ring", workers, parse_size(size) // 4)
    clock.append((time.perf_counter(), time.process_time()))
    result = simulate(schedule, topo, symmetry=symmetry)
    clock.append((time.perf_counter(), time.process_time()))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "timeline." + fmt)
        result.save(path)
        clock.append((time.perf_counter(), time.process_time()))
        file_mb = os.path.getsize(path) / 1e6
        digest = None
        if workers <= 1024:        # a fingerprint of the times, to compare full and symmetric runs
            done = np.asarray(load_timeline(path)["timeline"]["done"], dtype=float)
            digest = hashlib.sha256(done.tobytes()).hexdigest()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    wall = [b[0] - a[0] for a, b in zip(clock, clock[1:])]
    cpu = [b[1] - a[1] for a, b in zip(clock, clock[1:])]
    return {"workers": workers, "transfers": len(schedule.transfers), "symmetric": result.orbit is not None,
            "format": fmt, "build_s": wall[0], "simulate_s": wall[1], "write_s": wall[2], "total_s": sum(wall),
            "total_cpu_s": sum(cpu), "simulated_time_s": result.time, "file_MB": file_mb,
            "peak_rss_MB": peak / 1024, "done_digest": digest}


def run(workers, size, symmetry, fmt, repeats):
    rows = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, __file__, "--one", str(workers), "--size", size, "--format", fmt]
                             + ([] if symmetry else ["--no-symmetry"]), capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout))
    med = {k: statistics.median(r[k] for r in rows) for k in
           ("build_s", "simulate_s", "write_s", "total_s", "total_cpu_s", "peak_rss_MB")}
    return {**rows[0], **med, "repeats": repeats, "load_average": os.getloadavg()[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="256,1024,4096")
    parser.add_argument("--sizes", default="1GiB,1GB", help="1 GiB splits evenly over 2^k workers (the "
                        "symmetric shortcut applies); 1 GB does not (chunks differ by an element)")
    parser.add_argument("--size", default="1GB", help=argparse.SUPPRESS)
    parser.add_argument("--full-up-to", type=int, default=1024)
    parser.add_argument("--json-up-to", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="Write the rows as JSON here.")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--format", default="npz", help=argparse.SUPPRESS)
    parser.add_argument("--no-symmetry", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.size, not args.no_symmetry, args.format)))
        return
    print(f"{'size':>5} {'workers':>8} {'transfers':>10} {'mode':>9} {'fmt':>4} {'build':>7} {'simulate':>9} {'write':>7} "
          f"{'total':>7} {'cpu':>7} {'peak RSS':>9} {'file':>8} {'load':>5}")
    rows = []
    for size, n in ((z, int(w)) for z in args.sizes.split(",") for w in args.workers.split(",")):
        plans = [(True, "npz")] + ([(False, "npz")] if n <= args.full_up_to else []) \
            + ([(True, "json")] if n <= args.json_up_to else [])
        for symmetry, fmt in plans:
            if not symmetry and not rows[-1]["symmetric"]:
                continue                                   # the default run was already the full one
            r = run(n, size, symmetry, fmt, args.repeats if n <= 1024 else 1)
            r["mode"], r["size"] = "symmetric" if r["symmetric"] else "full", size
            rows.append(r)
            print(f"{size:>5} {n:>8} {r['transfers']:>10} {r['mode']:>9} {fmt:>4} {r['build_s']:>6.2f}s {r['simulate_s']:>8.2f}s "
                  f"{r['write_s']:>6.2f}s {r['total_s']:>6.2f}s {r['total_cpu_s']:>6.2f}s {r['peak_rss_MB']:>7.0f}MB "
                  f"{r['file_MB']:>6.0f}MB {r['load_average']:>5.1f}", flush=True)
            if args.out:                        # after every row: a stopped run keeps what it measured
                with open(args.out, "w") as fh:
                    json.dump({"benchmark": "benchmarks/simulate_scaling.py", "cpus": os.cpu_count(),
                               "rows": rows}, fh, indent=1)
        same = [r for r in rows if r["workers"] == n and r["size"] == size and r["format"] == "npz"]
        if len(same) == 2 and same[0]["symmetric"]:
            print(f"{'':>8} symmetric / full: {same[0]['total_s'] / same[1]['total_s']:.3f} of the time; "
                  f"timelines identical: {same[0]['done_digest'] == same[1]['done_digest']}")


if __name__ == "__main__":
    main()
