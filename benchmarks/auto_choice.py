"""How long ``algorithm="auto"`` takes to choose: the first choice and a repeated one.

Usage: python benchmarks/auto_choice.py [--workers 8,64,256]
Each worker count in a fresh process (nothing cached): the first ``pick`` for a 64 MB
float32 tensor on the ethernet preset, then the median of 1,000 repeated picks.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch


def measure(workers: int) -> dict:
    from gradsync.runtime.compile import pick

    pick(torch.ones(1 << 10), 2)            # imports and the 2-worker case, not what we time
    x = torch.ones(1 << 24)
    start = time.perf_counter()
    choice = pick(x, workers)
    first = time.perf_counter() - start
    repeats = []
    for _ in range(1000):
        t0 = time.perf_counter()
        pick(x, workers)
        repeats.append(time.perf_counter() - t0)
    return {"workers": workers, "choice": choice[0], "first_ms": first * 1e3,
            "repeat_us": statistics.median(repeats) * 1e6}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="8,64,256")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    for n in map(int, args.workers.split(",")):
        out = subprocess.run([sys.executable, __file__, "--child", str(n)], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout)
        print(f"N = {n}: picks {r['choice']}; first choice {r['first_ms']:.1f} ms, repeated {r['repeat_us']:.1f} us")


if __name__ == "__main__":
    main()
