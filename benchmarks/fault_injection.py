"""Long-form fault injection: SIGKILL one worker at a random moment of a stream of
all-reduces, over many trials, algorithms and worker counts (3-6); record hangs, wrong
results, survivors naming the victim, and detection-time percentiles.

Usage: python benchmarks/fault_injection.py [--trials 200] [--timeout 3] [--transport gloo|shm]
                                           [--algorithms one_shot,sharded] [--out docs/results/faults_results.json]

Over shared memory, one_shot and sharded run by reads of the peers' buffers (a barrier between
rounds), every other exact algorithm as messages through the same segment.
"""

import argparse
import json
from pathlib import Path

from gradsync.tools.faults import campaign

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--transport", default="gloo", choices=["gloo", "shm"])
    parser.add_argument("--algorithms", default=None, help="comma-separated (default: every exact algorithm)")
    parser.add_argument("--out", default="docs/results/faults_results.json")
    args = parser.parse_args()
    chosen = args.algorithms.split(",") if args.algorithms else None
    result = campaign(args.trials, args.timeout, args.seed, algorithms=chosen, transport=args.transport)
    print(json.dumps(result["summary"], indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1))
