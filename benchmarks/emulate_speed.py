"""Emulation speed against numpy's own sum, on the same inputs, in the same process.

Usage: python benchmarks/emulate_speed.py [--workers 8] [--elements 16777216] [--repeats 5]
Prints, per algorithm, the median time and the ratio numpy_time / emulation_time (target:
>= 0.25).
"""

import argparse

import numpy as np

import gradsync
from gradsync.algorithms import EXACT

from common import median_time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--elements", type=int, default=16 << 20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    inputs = np.random.default_rng(0).standard_normal((args.workers, args.elements), dtype=np.float32)
    baseline = median_time(lambda: np.sum(inputs, axis=0), args.repeats)
    print(f"{args.workers} workers x {args.elements} float32; np.sum(axis=0): {baseline * 1e3:.1f} ms (median of {args.repeats})")
    print(f"{'algorithm':<18} {'median':>10} {'numpy/emulate':>14}")
    for name in EXACT:
        schedule = gradsync.schedule(name, args.workers, args.elements)
        t = median_time(lambda: gradsync.emulate(schedule, inputs), args.repeats)
        print(f"{name:<18} {t * 1e3:>8.1f} ms {baseline / t:>14.2f}")


if __name__ == "__main__":
    main()
