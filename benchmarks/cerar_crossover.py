"""Where CERAR beats exact ring all-reduce: simulated speedup against bandwidth and size.

Usage: python benchmarks/cerar_crossover.py [--workers 8]
On the ethernet preset (hosts on one switch, 10 us per hop, host compute as measured on the
development machine), for NIC speeds 100 Mbit/s .. 100 Gbit/s and c in {N, 1.5N, 2N}: ring
time / CERAR time per message size, and the smallest size from which CERAR is faster. The
traffic-only bound is p = (2(N-1)/N) / (1 + (N-2)/c).
"""

import argparse

import numpy as np

import gradsync
from gradsync.model.simulate import simulate
from gradsync.model.topology import preset
from gradsync.units import format_size

SIZES = [int(s) for s in np.geomspace(4e3, 1e9, 13)]


def time_of(algorithm, topo, workers, nbytes, **options):
    return simulate(gradsync.schedule(algorithm, workers, nbytes // 4, **options), topo).time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    n = args.workers
    print(f"N = {n}; speedup = ring time / CERAR time (>1: CERAR faster); sizes in bytes of float32")
    print("| NIC | c | traffic bound p | " + " | ".join(format_size(s) for s in SIZES[::3]) + " | CERAR faster from |")
    print("|" + "---|" * (4 + len(SIZES[::3])))
    for nic in ("100Mbit/s", "1Gbit/s", "10Gbit/s", "100Gbit/s"):
        topo = preset("ethernet", workers=n, nic=nic)
        ring = {s: time_of("ring", topo, n, s) for s in SIZES}
        for c in (n, int(1.5 * n), 2 * n):
            p = (2 * (n - 1) / n) / (1 + (n - 2) / c)
            speed = {s: ring[s] / time_of("cerar", topo, n, s, components=c, construction="optimized") for s in SIZES}
            faster = [s for s in SIZES if speed[s] > 1]
            first = format_size(faster[0]) if faster and all(speed[s] > 1 for s in SIZES if s >= faster[0]) else "never"
            print(f"| {nic} | {c} | {p:.3f} | " + " | ".join(f"{speed[s]:.3f}" for s in SIZES[::3])
                  + f" | {first} |", flush=True)


if __name__ == "__main__":
    main()
