"""Peak extra memory of one all-reduce, per algorithm, as a multiple of the tensor.

Usage: python benchmarks/memory.py [--workers 2,4,8] [--elements 4194304] [--rss]

From the plans: the receive space each rank's plan allocates (its scratch, which the runtime
takes from the pool exactly), plus the helper's buffer on the rank that runs the host; for
CERAR, the codec's own buffers (its window of packets, its scratch, a padded copy of the
input when the length is not a multiple of c, and the decode's two c x m products). The largest rank's,
over the tensor's size. With --rss, also measured: the growth of each worker's peak resident
memory over one all-reduce of 64 MB in fresh processes (N = 2), for comparison.
"""

import argparse
import json
import resource
import sys

import torch


def planned(algorithm: str, workers: int, elements: int) -> float:
    from gradsync.coding import cerar
    from gradsync.runtime.compile import compiled

    worst = 0
    for rank in range(workers):
        c = compiled(algorithm, workers, elements, "float32", "{}", rank)
        extra = c.plan.scratch + (elements * len(c.schedule.helpers) if rank == 0 else 0)
        if c.design is not None:          # the codec's buffers, and the decode's two products
            flat = torch.empty(elements)
            w = cerar.Worker(c.design, rank, flat)
            own = 0 if w.own.data_ptr() == flat.data_ptr() else w.own.numel()
            extra += w.window.numel() + 2 * w.m + own + 2 * w.window.numel()    # window, its 2 x m scratch
        worst = max(worst, extra)
    return worst / elements


def rss_growth(rank, workers, algorithm, elements):
    import gradsync

    t = torch.ones(elements)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    gradsync.all_reduce(t, algorithm=algorithm)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 / (elements * 4)


def main():
    from gradsync import algorithms
    from gradsync.tools.launch import run

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="2,4,8")
    ap.add_argument("--elements", type=int, default=1 << 22)
    ap.add_argument("--rss", action="store_true")
    args = ap.parse_args()
    ns = list(map(int, args.workers.split(",")))
    out = {}
    print("| algorithm | " + " | ".join(f"N = {n}" for n in ns) + (" | RSS growth, N = 2 |" if args.rss else " |"))
    print("|---" * (len(ns) + 1 + args.rss) + "|")
    for name in algorithms.names():
        row = {n: planned(name, n, args.elements) for n in ns}
        if args.rss:
            row["rss_n2"] = max(run(rss_growth, 2, name, 1 << 24))
        out[name] = row
        print(f"| {name} | " + " | ".join(f"{row[n]:.2f}" for n in ns)
              + (f" | {row['rss_n2']:.2f} |" if args.rss else " |"), flush=True)
    json.dump(out, sys.stderr)


if __name__ == "__main__":
    main()
