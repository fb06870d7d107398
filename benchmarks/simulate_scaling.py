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

With ``--cluster``: each algorithm of ``--algorithms`` through the CLI on a rail-optimized
cluster of machines of 8 GPUs (``gradsync simulate -a A -t cluster:machines=M,gpus=8 -s SIZE
--out run.npz``), a fresh process per run: wall and CPU seconds of the whole command (its
imports included), its peak RSS, the timeline file's size, the simulated time and, for
unequal chunks, the two size classes' times.

    python benchmarks/simulate_scaling.py --cluster --workers 1024,16384,65536 --sizes 1GB \
        --algorithms ring,hierarchical --out docs/results/simulator_cluster.json

With ``--nccl FILE``: NCCL's own prediction (its tuning model, src/graph/tuning.cc on NCCL's
master of 2026-06: Hopper, Simple protocol, all-reduce) for ring and tree on the same
clusters, beside each row of FILE (a ``--cluster`` result).

With ``--classes``: for unequal chunks, the time of every chunk at its size class's smallest
and largest (what ``simulate`` gives beyond its expansion limit) against the exact full
simulation, on a switch and on clusters with and without oversubscription.

With ``--compare-with DIR`` (a copy of an older ``src``, e.g. ``git archive HEAD src | tar -x
-C /tmp/old``): every algorithm on every preset at a few sizes through both simulators, and
how many times differ (per transfer, bit for bit).
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


def cli_run(algorithm: str, workers: int, size: str, topology: str, timeout: float) -> dict:
    """One ``gradsync simulate`` in a fresh process: its wall, CPU and peak RSS (GNU time's)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.npz")
        command = ["/usr/bin/time", "-f", "TIME %e %U %S %M", sys.executable, "-m", "gradsync", "simulate", "-a",
                   algorithm, "-t", topology, "-s", size, "--out", path, "--format", "json"]
        began = time.perf_counter()
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            return {"algorithm": algorithm, "workers": workers, "size": size, "timed_out_s": timeout}
        wall = time.perf_counter() - began
        if child.returncode:
            raise SystemExit(f"{' '.join(command)} failed: {err.strip()}")
        lines = err.strip().splitlines()
        _, elapsed, user, system, peak_kb = lines[-1].split()
        summary = json.loads(out)
        return {"algorithm": algorithm, "workers": workers, "size": size, "topology": topology, "wall_s": wall,
                "simulated_time_s": summary["time_s"], "classes_s": summary.get("classes_s"),
                "file_MB": os.path.getsize(path) / 1e6, "cpu_s": float(user) + float(system),
                "peak_rss_MB": int(peak_kb) / 1024, "estimate": lines[:-1][:1], "load_average": os.getloadavg()[0]}


def cluster_main(args):
    """The ``--cluster`` runs, one fresh process each."""
    rows = []
    for size, algorithm, n in ((z, a, int(w)) for z in args.sizes.split(",") for a in args.algorithms.split(",")
                               for w in args.workers.split(",")):
        row = cli_run(algorithm, n, size, f"cluster:machines={n // 8},gpus=8{args.cluster_params}", args.timeout)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "w") as fh:
                json.dump({"benchmark": "benchmarks/simulate_scaling.py --cluster", "cpus": os.cpu_count(),
                           "rows": rows}, fh, indent=1)


# NCCL's tuning constants (src/graph/tuning.cc, master 2026-06), microseconds, for Simple:
# base latency per algorithm, hardware latency per step inside a machine (NVLink) and across
# (network), the Hopper cap on a tree channel's bandwidth (more than two nodes), the plateau
# factor of the ring on compute capability >= 80.
NCCL = {"base": {"ring": 8.4, "tree": 8.4}, "nvlink": {"ring": 3.4, "tree": 4.0}, "net": {"ring": 14.0, "tree": 14.0},
        "tree_bw_per_channel": 36.0, "ring_plateau": 1.4, "net_overhead": 3 * 1.0}


def nccl_time(algorithm: str, ranks: int, ppn: int, nbytes: float, channels: int = 16, nic_GBps: float = 50.0):
    """NCCL's predicted all-reduce time (s): lat + nbytes / (1000 bw) in its units, every NIC of
    a machine used (channels x per-channel bandwidth = ppn x NIC)."""
    import math
    nodes = ranks // ppn
    bus = ppn * nic_GBps                                        # channels * bwInter
    if algorithm == "ring":
        steps, inter = 2 * (ranks - 1), 2 * (nodes - 1)
        intra = max(NCCL["nvlink"]["ring"], NCCL["net_overhead"])
        lat = NCCL["base"]["ring"] + (steps - inter) * intra + inter * NCCL["net"]["ring"]
        if nbytes / (channels * ranks) >= 64:
            lat *= NCCL["ring_plateau"]
        bw = bus * ranks / steps
    else:
        bw = min(bus * 0.92, channels * NCCL["tree_bw_per_channel"]) * 0.5
        lat = NCCL["base"]["tree"] + 2 * ((ppn - 1) * NCCL["nvlink"]["tree"]
                                         + int(math.log2(nodes)) * NCCL["net"]["tree"])
    return (lat + nbytes / (1000 * bw)) * 1e-6


def nccl_main(path):
    with open(path) as fh:
        rows = json.load(fh)["rows"]
    print(f"{'workers':>8} {'gradsync ring':>14} {'gradsync hierarchical':>22} {'NCCL ring':>10} {'NCCL tree':>10}")
    for n in sorted({r["workers"] for r in rows}):
        got = {r["algorithm"]: r.get("simulated_time_s") for r in rows if r["workers"] == n}
        nbytes = 1e9
        print(f"{n:>8} {got.get('ring', float('nan')) * 1e3:>11.1f} ms {got.get('hierarchical', float('nan')) * 1e3:>19.1f} ms "
              f"{nccl_time('ring', n, 8, nbytes) * 1e3:>7.1f} ms {nccl_time('tree', n, 8, nbytes) * 1e3:>7.2f} ms")


def classes_main():
    from gradsync.algorithms import hierarchical, ring, sharded
    from gradsync.model.simulate import simulate
    from gradsync.model.topology import preset
    from gradsync.model.topology.cluster import cluster

    shapes = {"ethernet": lambda n: preset("ethernet", n), "rail 1:1": lambda n: cluster(workers=n),
              "rail 2:1": lambda n: cluster(workers=n, oversubscription=2.0),
              "fat-tree 3:1": lambda n: cluster(workers=n, shape="fat-tree", oversubscription=3.0)}
    print(f"{'topology':>13} {'N':>4} {'algorithm':>13} {'elements':>9} {'exact - smallest':>17} {'largest - exact':>16}")
    for name, make in shapes.items():
        for n in (64, 256):
            for algorithm, module, kw in (("ring", ring, {}), ("hierarchical", hierarchical, {"local_size": 8}),
                                          ("sharded", sharded, {})):
                for elements in ((n * 500 + 3 * n // 4 + 1, n * 2000 + 1, n * 37 + n // 3) if n <= 64 or
                                 algorithm != "sharded" else ()):
                    c = module.compact(n, elements, **kw)
                    low, high = simulate(c, make(n), expand_limit=0).classes
                    exact = simulate(c.expand(), make(n), symmetry=False).time
                    print(f"{name:>13} {n:>4} {algorithm:>13} {elements:>9} {(exact - low) / exact:>+16.2e} "
                          f"{(high - exact) / exact:>+16.2e}", flush=True)


def compare_main(old_src):
    code = """
import sys, json
sys.path.insert(0, sys.argv[1])
from gradsync import algorithms
from gradsync.model.cost import default_options
from gradsync.model.simulate import simulate
from gradsync.model.topology import preset
out = {}
for name, sizes in (("ethernet", (2, 3, 8, 16, 64)), ("ring", (3, 8, 16)), ("pcie-switch-4", (None,)),
                    ("p3.16xlarge", (None,)), ("dgx-2", (None,)), ("lowbw-cluster", (None,))):
    for n in sizes:
        topo = preset(name, n)
        w = len(topo.workers)
        for a in sorted(set(algorithms.names()) - {"one_shot", "two_shot"} - ({"cerar"} if w > 16 else set())):
            for e in (w * 1000, w * 1000 + 3):
                r = simulate(algorithms.build(a, w, e, **default_options(a, topo, w)), topo)
                out[f"{name}/{w}/{a}/{e}"] = [r.time, r.done.tolist(), r.node_done.tolist()]
print(json.dumps(out))
"""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    runs = [json.loads(subprocess.run([sys.executable, "-c", code, src], capture_output=True, text=True,
                                      check=True).stdout) for src in (old_src, here)]
    differ = [k for k in runs[0] if runs[0][k] != runs[1].get(k)]
    print(f"{len(runs[0])} cases, {len(differ)} differ: {differ[:10]}")


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
    parser.add_argument("--cluster", action="store_true", help="the CLI on a rail-optimized cluster instead")
    parser.add_argument("--algorithms", default="ring,hierarchical")
    parser.add_argument("--cluster-params", default="", help="more cluster parameters, e.g. ',oversubscription=2'")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--nccl", default=None, help="a --cluster result: NCCL's predictions beside it")
    parser.add_argument("--classes", action="store_true", help="size classes against the exact time")
    parser.add_argument("--compare-with", default=None, help="an older src directory to compare times with")
    args = parser.parse_args()
    if args.nccl:
        nccl_main(args.nccl)
        return
    if args.classes:
        classes_main()
        return
    if args.compare_with:
        compare_main(args.compare_with)
        return
    if args.cluster:
        cluster_main(args)
        return
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
