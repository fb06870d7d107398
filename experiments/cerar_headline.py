"""CERAR's headline, repeated: CERAR (c = 2N) against ring on 100 Mbit/s emulated links,
N = 4, 16M float32 elements, plus a few sweep points re-measured with the current executor.

Usage (root): python experiments/cerar_headline.py [--repeats 3] [--out docs/results/cerar_headline.json]
"""

import argparse
import json
import statistics
from pathlib import Path

from cerar_slow_links import speedups

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-points", action="store_true", help="the headline only")
    parser.add_argument("--out", default="docs/results/cerar_headline.json")
    args = parser.parse_args()
    headline = [speedups("100Mbit", [(4, 16 << 20, 8)], 3)[0] for _ in range(args.repeats)]
    points = [] if args.no_points else speedups("100Mbit", [(4, 4 << 20, 8), (4, 64 << 20, 4), (4, 64 << 20, 8),
                                                            (8, 16 << 20, 16)], 2)
    summary = {"headline_speedups": [round(r["speedup"], 3) for r in headline],
               "headline_median": round(statistics.median(r["speedup"] for r in headline), 3),
               "over_native_median": round(statistics.median(r["speedup_over_native"] for r in headline), 3),
               "ring_over_bound_median": round(statistics.median(r["ring_over_bound"] for r in headline), 3),
               "target": headline[0]["target"]}
    print(json.dumps(summary, indent=1))
    Path(args.out).write_text(json.dumps({"summary": summary, "headline": headline, "points": points}, indent=1))
