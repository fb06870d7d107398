"""Measured rounds against simulated ones: a traced bench beside the simulator's trace of the same
schedule, on loopback (topology from ``calibrate``) and, as root, on emulated 100 Mbit/s links
(the ethernet preset at 100 Mbit/s, 50 us, as ``gradsync bench --link-bandwidth`` predicts).

Usage: python benchmarks/trace_vs_simulation.py [--workers 4] [--links 100Mbit] [--out docs/results/trace_vs_simulation.json]

For each algorithm and size: the per-round median over ranks and calls of the measured round
slices (``gradsync trace compare``), the simulator's round slices, the median over rounds of
|measured / simulated - 1|, and the round where the gap is largest.
"""

import argparse
import json
import tempfile
from pathlib import Path

ALGORITHMS = ("ring", "halving_doubling", "tree")
SIZES = (64 << 10, 1 << 20, 16 << 20)


def measure(workers, topology, network=None, iters=10):
    from gradsync import algorithms
    from gradsync.tools import trace_files as trace
    from gradsync.tools import bench
    from gradsync.tools.launch import run
    from gradsync.model.simulate import simulate

    results = run(bench.worker, workers, list(SIZES), list(ALGORITHMS), iters, "float32", 120.0, {}, False, None,
                  True, timeout=1200, network=network)
    measured = trace.merge([r["trace"] for r in results])
    out = []
    for algorithm in ALGORITHMS:
        for nbytes in SIZES:
            schedule = algorithms.build(algorithm, workers, nbytes // 4)
            simulated = trace.from_simulation(simulate(schedule, topology, 4))
            c = trace.compare(measured, simulated)
            out.append({"algorithm": algorithm, "bytes": nbytes, "rounds": len(c["rounds"]),
                        "median_abs_error": c["median_abs_error"], "largest_gap_round": c["largest_gap_round"],
                        "measured_total_s": c["measured_total_s"], "predicted_total_s": c["predicted_total_s"],
                        "per_round": c["rounds"]})
            print(f"{algorithm:>17} {nbytes:>9} B: rounds measured {c['measured_total_s'] * 1e3:8.2f} ms, "
                  f"simulated {c['predicted_total_s'] * 1e3:8.2f} ms, per-round median error "
                  f"{c['median_abs_error']:.0%}, largest gap in round {c['largest_gap_round']}")
    return out


def main():
    from gradsync.tools import calibrate
    from gradsync.model.topology import preset, resolve

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--links", default=None, help="also on emulated links of this rate (root), e.g. 100Mbit")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = {"workers": args.workers}
    with tempfile.TemporaryDirectory() as tmp:
        fit = calibrate.calibrate(args.workers, 10, 3)
        path = calibrate.write(fit, Path(tmp) / "calibrated.json")
        topology = resolve(str(path), args.workers)
    result["calibrated"] = {k: fit[k] for k in ("round_latency_s", "bandwidth_Bps", "add_rate")}
    print(f"loopback, calibrated: {fit['round_latency_s'] * 1e6:.0f} us per round, "
          f"{fit['bandwidth_Bps'] / 1e9:.2f} GB/s")
    result["loopback"] = measure(args.workers, topology)
    if args.links:
        from gradsync.tools.links import SlowLinks

        topology = preset("ethernet", workers=args.workers, nic=args.links, latency="50us")
        print(f"emulated {args.links} links")
        with SlowLinks(args.workers, args.links) as network:
            result["links"] = {"rate": args.links, "rows": measure(args.workers, topology, network, iters=5)}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
